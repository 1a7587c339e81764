"""The credentials broker's edge (hooks/broker.py is the decision): one route in praesto-hooks, its
three Kubernetes calls as praesto-hooks' ServiceAccount, and a bound on concurrent asks.

At most `MAX_CONCURRENT` asks run per worker (each may wait on the API server for up to
`API_TIMEOUT` seconds per call), so agents never take the threads Metacontroller's syncs and the
API server's admission reviews need; more get 503 Busy and the agent retries with its backoff.
Logs carry the reason, namespace, cache, object name and node, never the token or the data.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from typing import Any

from flask import Blueprint, Response, current_app, request
from praesto.hooks import broker
from praesto.hooks.config import HooksConfig
from praesto.hooks.kube import ApiClient, APIError, Door, Forbidden, NotFound, unanswered

from praesto import names

log = logging.getLogger(__name__)
blueprint = Blueprint("praesto_broker", __name__)
API_TIMEOUT = 5.0
MAX_CONCURRENT = 2  # asks in flight per worker; the worker keeps its other threads for hooks
WAIT_FOR_TURN = 1.0  # seconds an ask waits for one of them before 503 Busy
MAX_BODY_BYTES = 4096  # four names
CONFIG_BROKER_API = "PRAESTO_BROKER_API"  # Flask config key: tests may inject a BrokerApi
_turns = threading.BoundedSemaphore(MAX_CONCURRENT)
_api: list[broker.BrokerApi] = []
_api_lock = threading.Lock()


class KubeBrokerApi:
    """`broker.BrokerApi` with the real client, as praesto-hooks' ServiceAccount."""

    def __init__(self, api: ApiClient | None = None) -> None:
        self.door = Door(api)
        self.custom = self.door.custom
        self.core = self.door.core

    def review(self, token: str) -> Mapping[str, Any]:
        try:
            status: Any = self.door.review_token(token, [names.BROKER_TOKEN_AUDIENCE], API_TIMEOUT)
        except Exception as err:
            raise broker.Unavailable(f"cannot check the token now ({type(err).__name__})") from None
        return dict(status)

    def copy(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            got: Any = self.custom.get_namespaced_custom_object(
                names.GROUP, names.VERSION, namespace, names.MODELCACHENODE_PLURAL, name,
                _request_timeout=API_TIMEOUT,
            )  # fmt: skip
        except NotFound:
            return None
        except APIError as err:
            if unanswered(err):
                raise broker.Unavailable(
                    f"cannot read the asking node's copy now ({type(err).__name__})"
                ) from None
            raise broker.Unavailable(f"cannot read the asking node's copy now (HTTP {err.status})") from None
        except Exception as err:
            raise broker.Unavailable(
                f"cannot read the asking node's copy now ({type(err).__name__})"
            ) from None
        return dict(got)

    def read(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        reader = (
            self.core.read_namespaced_secret if kind == "Secret" else self.core.read_namespaced_config_map
        )
        try:
            obj = reader(name, namespace, _request_timeout=API_TIMEOUT)
        except NotFound:
            return None
        except Forbidden:  # the grant follows the copy's status by one sync
            raise broker.Unavailable(
                f"praesto-hooks may not read {kind} {namespace}/{name} yet (the per-cache grant, Role "
                "praesto-secret-reader-<cache>, comes with the cache's next sync)"
            ) from None
        except APIError as err:
            if unanswered(err):
                raise broker.Unavailable(
                    f"reading {kind} {namespace}/{name} failed ({type(err).__name__})"
                ) from None
            raise broker.Unavailable(
                f"reading {kind} {namespace}/{name} failed with HTTP {err.status}"
            ) from None
        except Exception as err:
            raise broker.Unavailable(
                f"reading {kind} {namespace}/{name} failed ({type(err).__name__})"
            ) from None
        out: Any = self.door.sanitize(obj)
        return dict(out)


def _broker_api() -> broker.BrokerApi:
    injected = current_app.config.get(CONFIG_BROKER_API)
    if injected is not None:
        return injected  # type: ignore[no-any-return]
    with _api_lock:
        if not _api:  # once per worker, on first use
            _api.append(KubeBrokerApi())
        return _api[0]


def _settings() -> HooksConfig:
    settings = current_app.config.get("PRAESTO_HOOKS_CONFIG")
    return settings if isinstance(settings, HooksConfig) else HooksConfig()


def _json(body: Mapping[str, Any], status: int) -> Response:
    return Response(json.dumps(body, separators=(",", ":")), status=status, mimetype="application/json")


def _bearer(header: str | None) -> str | None:
    scheme, _, token = (header or "").partition(" ")
    return token if scheme == "Bearer" and token and " " not in token and len(token) <= 16384 else None


@blueprint.post(names.BROKER_PATH)
def objects() -> Response:
    if (request.content_length or 0) > MAX_BODY_BYTES:
        return _json({"reason": "BadRequest", "error": f"request body over {MAX_BODY_BYTES} bytes"}, 413)
    try:
        body = json.loads(request.get_data(cache=False) or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = None
    if not _turns.acquire(timeout=WAIT_FOR_TURN):
        return _json({"reason": "Busy", "error": "the credentials broker is busy; retry"}, 503)
    try:
        config = _settings()
        agent = f"system:serviceaccount:{config.namespace}:{config.agent_service_account}"
        decision, ask, node = broker.answer(
            _broker_api(), _bearer(request.headers.get("Authorization")), body, agent
        )
    finally:
        _turns.release()
    fields = {"reason": decision.reason, "node": node, "status": decision.status}
    if ask is not None:
        fields.update(namespace=ask.namespace, cache=ask.cache, kind=ask.kind, object=ask.name)
    if decision.allowed:
        log.info("broker: granted %s", json.dumps(fields, sort_keys=True))
        return _json(decision.body, 200)
    log.warning("broker: refused %s: %s", json.dumps(fields, sort_keys=True), decision.message)
    return _json({"reason": decision.reason, "error": decision.message}, decision.status)
