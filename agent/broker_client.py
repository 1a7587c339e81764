"""A cache's credentials Secret, as the agent gets it: from the credentials broker.

The agent's ServiceAccount may read no tenant Secret (praesto/rbac.py AGENT). It asks the broker in
praesto-hooks (hooks/broker.py) with a token of its own Pod for the broker's audience, minted by the
same `TokenMinter` as peer tokens; the broker gives the object only while this node holds a copy of
the cache that names it and needs it. `CacheObjects` has the reading methods of `KubeApi` that
agent/credentials.py uses, so the credential policy is the same whichever answers; every refusal
becomes `SecretUnavailable` with the broker's one line (the copy reports WaitingForSecret and retries).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import http.client
import json
import ssl
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from praesto.agent.kube import SecretUnavailable
from praesto.agent.peers.auth import Pod, TokenError, TokenMinter

from praesto import names

TIMEOUT = 20.0  # seconds: the broker makes up to three API calls of 5 s each
MAX_ANSWER_BYTES = 4 * names.BROKER_MAX_OBJECT_BYTES  # base64 and JSON around the bounded data


ENV_URL = "PRAESTO_CREDENTIALS_BROKER"  # https://<hooks Service>.<namespace>.svc (the chart sets it)
ENV_CA = "PRAESTO_CREDENTIALS_BROKER_CA"  # file: the PEM CA the broker's certificate is signed by


@dataclass(frozen=True)
class BrokerEndpoint:
    """Where the broker listens, the CA it is signed by, and this agent's Pod (tokens are bound to it)."""

    url: str
    ca_file: str  # read at each call: a rotated CA (the chart's ConfigMap) applies without a restart
    pod: Pod


def add_broker_arguments(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """--credentials-broker and --credentials-broker-ca, defaulting to their variables in `environ`."""
    parser.add_argument(
        "--credentials-broker",
        default=environ.get(ENV_URL, ""),
        help=f"https URL of the credentials broker (praesto-hooks) a cache's own Secret is read from, for "
        f"this node's copies only (env {ENV_URL}; the chart sets it); empty: read it with the agent's own "
        "identity (development)",
    )
    parser.add_argument(
        "--credentials-broker-ca",
        default=environ.get(ENV_CA, ""),
        help=f"file holding the PEM CA the broker's certificate is signed by (env {ENV_CA}; the chart mounts it)",
    )


def check_broker_arguments(args: argparse.Namespace) -> str | None:
    """The first problem with the broker flags, with its fix, or None."""
    if not args.credentials_broker:
        return None
    parsed = urllib.parse.urlsplit(str(args.credentials_broker))
    if parsed.scheme != "https" or not parsed.hostname or parsed.path not in ("", "/"):
        return (
            f"--credentials-broker: {args.credentials_broker!r} is not https://host[:port]; the chart sets it"
        )
    if not args.credentials_broker_ca:
        # the file itself is read at each call (the chart's ConfigMap may rotate it); a bad one is named
        # on the copy that needed it (WaitingForSecret)
        return "--credentials-broker-ca: Required value with --credentials-broker; give the CA file it is signed by"
    namespace, _, name = str(args.peer_service_account).partition("/")
    missing = [
        flag for flag, value in (("--pod-name", args.pod_name), ("--pod-uid", args.pod_uid)) if not value
    ]
    if missing or not (names.is_dns_label(namespace) and name):
        return (
            "--credentials-broker needs --pod-name, --pod-uid (downward API) and --peer-service-account "
            "<namespace>/<name>: the broker's tokens are bound to this Pod"
        )
    return None


def broker_endpoint(args: argparse.Namespace) -> BrokerEndpoint | None:
    """The checked flags (`check_broker_arguments`) as a `BrokerEndpoint`; None without a broker."""
    if not args.credentials_broker:
        return None
    namespace, _, name = str(args.peer_service_account).partition("/")
    pod = Pod(namespace, str(args.pod_name), str(args.pod_uid), name)
    return BrokerEndpoint(str(args.credentials_broker), str(args.credentials_broker_ca), pod)


class Broker:
    """The broker as this agent reaches it: its address, the CA it is signed by, this Pod's minter."""

    def __init__(self, endpoint: BrokerEndpoint, minter: TokenMinter) -> None:
        parsed = urllib.parse.urlsplit(endpoint.url)
        if parsed.scheme != "https" or not parsed.hostname:
            raise ValueError(f"credentials broker URL {endpoint.url!r} is not https://host[:port]")
        self.host, self.port = parsed.hostname, parsed.port or 443
        self.ca_file = endpoint.ca_file
        self.minter = minter

    def __repr__(self) -> str:
        return f"Broker({self.host}:{self.port})"

    def objects(self, cache: str) -> CacheObjects:
        """What this node's copy of `cache` may read, through the broker."""
        return CacheObjects(self, cache)

    def ask(self, kind: str, namespace: str, cache: str, name: str) -> dict[str, Any]:
        """The broker's answer for one object; raises `SecretUnavailable` with its refusal."""
        where = f"{kind} {namespace}/{name}"
        try:
            token = self.minter.token_for_audience(names.BROKER_TOKEN_AUDIENCE)
        except TokenError as err:
            raise SecretUnavailable(f"{where}: {err}; retrying") from None
        body = json.dumps({"namespace": namespace, "cache": cache, "kind": kind, "name": name})
        try:
            context = ssl.create_default_context(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as err:
            raise SecretUnavailable(
                f"{where}: the broker's CA {self.ca_file} cannot be read ({err}); retrying"
            ) from None
        conn = http.client.HTTPSConnection(self.host, self.port, timeout=TIMEOUT, context=context)
        try:
            conn.request(
                "POST",
                names.BROKER_PATH,
                body=body,
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            )
            response = conn.getresponse()
            raw = response.read(MAX_ANSWER_BYTES + 1)
            status = response.status
        except (OSError, http.client.HTTPException) as err:
            raise SecretUnavailable(
                f"{where}: the credentials broker at {self.host}:{self.port} is unreachable "
                f"({type(err).__name__}); retrying"
            ) from None
        finally:
            conn.close()
        try:
            answer = json.loads(raw) if len(raw) <= MAX_ANSWER_BYTES else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            answer = None
        if not isinstance(answer, dict):
            raise SecretUnavailable(
                f"{where}: the credentials broker answered HTTP {status} without JSON; retrying"
            )
        if status != 200:
            reason, error = str(answer.get("reason", "")), str(answer.get("error", ""))[:500]
            raise SecretUnavailable(f"{where}: the credentials broker refused ({status} {reason}): {error}")
        return answer


@dataclass(frozen=True)
class CacheObjects:
    """`KubeApi`'s read_secret / read_token / read_secret_value for one cache's credentials Secret,
    answered by the broker (agent/credentials.py reads through whichever it is given)."""

    broker: Broker
    cache: str

    def _ask(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        return self.broker.ask(kind, namespace, self.cache, name)

    def _secret_data(self, namespace: str, secret: str) -> tuple[dict[str, bytes], dict[str, str]]:
        answer = self._ask("Secret", namespace, secret)
        try:
            data = {
                str(k): base64.b64decode(str(v), validate=True) for k, v in (answer.get("data") or {}).items()
            }
        except (binascii.Error, ValueError, AttributeError):
            raise SecretUnavailable(
                f"Secret {namespace}/{secret}: the broker's answer is not base64 data"
            ) from None
        annotations = answer.get("annotations") or {}
        return data, {str(k): str(v) for k, v in annotations.items()} if isinstance(annotations, dict) else {}

    def read_secret(self, namespace: str, secret: str) -> tuple[dict[str, str], dict[str, str]]:
        data, annotations = self._secret_data(namespace, secret)
        return {k: v.decode(errors="replace") for k, v in data.items()}, annotations

    def read_token(self, namespace: str, secret: str, key: str | None) -> str:
        data, _ = self._secret_data(namespace, secret)
        for candidate in [key] if key else ["HF_TOKEN", "token"]:
            if candidate and candidate in data:
                return data[candidate].decode().strip()
        raise SecretUnavailable(
            f"Secret {namespace}/{secret} has no key {key or 'HF_TOKEN'}; add the token under that key"
        )

    def read_secret_value(self, namespace: str, secret: str, key: str, what: str) -> bytes:
        data, _ = self._secret_data(namespace, secret)
        if key not in data:
            raise SecretUnavailable(
                f"Secret {namespace}/{secret} has no key {key}; add {what} under that key"
            )
        return data[key]
