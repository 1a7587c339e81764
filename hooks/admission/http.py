"""Flask blueprint for the two AdmissionReview endpoints.

Thin: parse JSON, call the pure webhook, return JSON. A body we cannot read at
all gets HTTP 400; a body whose uid we can read always gets a valid
AdmissionReview (HTTP 200), even when our own code fails, so the API server
shows the user a message instead of a webhook call error.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from flask import Blueprint, Response, current_app, request
from praesto.hooks.config import HooksConfig

from . import review
from .lookup import Lookups, shared_lookups
from .mutate import mutate
from .review import MalformedReview, Refusal
from .validate import validate

log = logging.getLogger(__name__)

blueprint = Blueprint("praesto_admission", __name__)

# Flask config keys: tests and embedders may inject lookups or the image.
CONFIG_LOOKUPS = "PRAESTO_LOOKUPS"
CONFIG_IMAGE = "PRAESTO_IMAGE"
CONFIG_SETTINGS = "PRAESTO_HOOKS_CONFIG"  # the process's HooksConfig (hooks/serving/app.py create_app)
# Set by `praesto-hooks --client-ca-file`: only the API server (its webhook client
# certificate, verified by gunicorn's TLS layer) may ask the admission endpoints anything.
CONFIG_REQUIRE_CLIENT_CERT = "PRAESTO_REQUIRE_CLIENT_CERT"


def _peer_certificate() -> Any:
    """The verified client certificate of this connection, or None (plain HTTP, or none sent)."""
    sock = request.environ.get("gunicorn.socket")
    getpeercert = getattr(sock, "getpeercert", None)
    return getpeercert() if getpeercert is not None else None


@blueprint.before_request
def _require_api_server() -> tuple[Response, int] | None:
    """A forged AdmissionReview would otherwise read any namespace's caches through our answers
    (existence, source, failure text): without the API server's certificate, nothing is said."""
    if current_app.config.get(CONFIG_REQUIRE_CLIENT_CERT) and not _peer_certificate():
        return _json(
            {
                "error": "a client certificate is required: the admission endpoints answer only the "
                "Kubernetes API server (webhooks.clientAuth in the chart)"
            },
            403,
        )
    return None


def _settings() -> HooksConfig:
    """The process's settings (create_app stores them); the defaults for a bare blueprint."""
    settings = current_app.config.get(CONFIG_SETTINGS)
    return settings if isinstance(settings, HooksConfig) else HooksConfig()


def _lookups() -> Lookups:
    injected = current_app.config.get(CONFIG_LOOKUPS)
    # started lazily, once per worker
    return injected if injected is not None else shared_lookups(_settings())


def _json(body: Any, status: int = 200) -> tuple[Response, int]:
    """Compact, unsorted JSON: the API server does not care about key order, latency does."""
    return Response(json.dumps(body, separators=(",", ":")), mimetype="application/json"), status


# An AdmissionReview holds at most two objects of etcd's 1.5 MiB limit: anything larger is not
# from the API server, and reading it would only cost memory (the port is reachable in-cluster).
MAX_REVIEW_BYTES = 8 << 20


def _answer(handler: Callable[[review.Request], dict[str, Any]]) -> tuple[Response, int]:
    request.max_content_length = MAX_REVIEW_BYTES  # larger bodies get 413 before they are read
    body = request.get_json(silent=True)
    try:
        parsed = review.parse_review(body)
    except MalformedReview as error:
        if error.uid is None:
            return _json({"error": f"malformed AdmissionReview: {error}"}, 400)
        refusal = Refusal("request", str(error), "send an admission.k8s.io/v1 AdmissionReview")
        return _json(review.deny(error.uid, refusal))
    try:
        return _json(handler(parsed))
    except Exception:  # a bug must still answer the API server with a readable refusal
        log.exception("admission handler failed for request %s", parsed.uid)
        refusal = Refusal(
            "request", "the Praesto webhook failed internally", "retry, or check the praesto-hooks logs", 500
        )
        return _json(review.deny(parsed.uid, refusal))


def _from_api_server() -> bool:
    """Whether this caller is verified as the API server (webhooks.clientAuth): only then may an
    answer describe the namespace's caches. Otherwise any Pod that can connect could have forged
    the review, naming any namespace (#21 item 15): answers carry nothing it could not read itself."""
    return bool(current_app.config.get(CONFIG_REQUIRE_CLIENT_CERT)) and bool(_peer_certificate())


@blueprint.post("/admission/mutate-pod")
def mutate_pod() -> tuple[Response, int]:
    image = current_app.config.get(CONFIG_IMAGE) or _settings().image
    disclose = _from_api_server()
    return _answer(lambda r: mutate(r, _lookups(), image, disclose))


@blueprint.post("/admission/validate-modelcache")
def validate_modelcache() -> tuple[Response, int]:
    config = current_app.config.get(CONFIG_SETTINGS)
    disclose = _from_api_server()
    return _answer(lambda r: validate(r, _lookups(), config, disclose=disclose))
