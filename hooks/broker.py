"""The credentials broker: a cache's Secret reaches only the agent of a node whose copy needs it.

RBAC cannot say "the agent on node X": a Role binds a whole ServiceAccount, and every agent runs
as the same one. So the per-cache grant (hooks/local.py `secret_grant`) binds praesto-hooks'
ServiceAccount instead, and an agent asks this broker for one named object of one cache
(`names.BROKER_PATH`, served by praesto-hooks: hooks/broker_http.py):

    POST {"namespace": NS, "cache": NAME, "kind": "Secret" | "ConfigMap", "name": OBJECT}
    Authorization: Bearer <token of the asking agent's Pod, for audience names.BROKER_TOKEN_AUDIENCE>

The token is minted exactly as peer tokens are (agent/peers/auth.py TokenMinter: TokenRequest,
bound to the agent's own Pod; the chart's ValidatingAdmissionPolicy lets an agent bind tokens only
to its own Pod, node-peers.yaml), so the API server's TokenReview names the asking Pod's node
(`names.TOKEN_EXTRA_NODE_NAME`). The broker answers only when

1. the review accepts the token for the broker's audience, it is the chart's agent
   ServiceAccount, and it is bound to a Pod on a node;
2. the ModelCacheNode of that cache on that node exists in that namespace, and its spec names the
   object (spec.source.secretRef, spec.verification.secretRef or .configMapRef);
3. the copy needs it now (hooks/local.py `copy_needs_secret`: not Ready for its current source);
4. the object exists, and its data is at most `names.BROKER_MAX_OBJECT_BYTES`.

Every refusal is one line naming the cause and the fix, with its own `reason` and status; no
object's data is ever logged. This module is the pure core (`decide`, dicts in, a `Decision` out)
and the flow (`answer`) over the small `BrokerApi` interface; the Kubernetes calls are the edge's.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from praesto.hooks.local import copy_needs_secret

from praesto import names

KINDS = ("Secret", "ConfigMap")
MAX_ASK_CHARS = 253  # a namespace, cache or object name is a DNS name at most this long


class Unavailable(Exception):
    """The API server could not say (unreachable, timing out): the agent retries later."""


class BrokerApi(Protocol):
    """The broker's only Kubernetes calls (hooks/broker_http.py KubeBrokerApi)."""

    def review(self, token: str) -> Mapping[str, Any]:
        """The TokenReview status for the broker's audience (authenticated, user, audiences)."""

    def copy(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """One ModelCacheNode, None when it does not exist."""

    def read(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        """One Secret or ConfigMap as the API returns it (data, metadata), None when missing."""


@dataclass(frozen=True)
class Ask:
    namespace: str
    cache: str
    kind: str
    name: str


@dataclass(frozen=True)
class Decision:
    status: int
    reason: str
    message: str = ""
    body: dict[str, Any] = field(default_factory=dict)  # the object's data, on 200 only

    @property
    def allowed(self) -> bool:
        return self.status == 200


def refuse(status: int, reason: str, message: str) -> Decision:
    return Decision(status, reason, message)


def parse_ask(body: Any) -> Ask | Decision:
    """The request's four names, or a 400 naming the bad field."""
    if not isinstance(body, dict):
        return refuse(400, "BadRequest", 'send a JSON object {"namespace", "cache", "kind", "name"}')
    values = {key: body.get(key) for key in ("namespace", "cache", "kind", "name")}
    for key, value in values.items():
        if not isinstance(value, str) or not value or len(value) > MAX_ASK_CHARS:
            return refuse(
                400, "BadRequest", f"{key}: Required value: a name of at most {MAX_ASK_CHARS} characters"
            )
    if values["kind"] not in KINDS:
        return refuse(400, "BadRequest", f"kind: {values['kind']!r} is not one of {', '.join(KINDS)}")
    if not (names.is_dns_label(str(values["namespace"])) and names.is_dns_label(str(values["cache"]))):
        return refuse(
            400, "BadRequest", "namespace and cache must be DNS labels (a ModelCache's namespace and name)"
        )
    return Ask(str(values["namespace"]), str(values["cache"]), str(values["kind"]), str(values["name"]))


def node_of(review: Mapping[str, Any], agent_user: str) -> str | Decision:
    """The node the asking agent's token is bound to, or a 401 saying why the token is not one."""
    user = review.get("user") or {}
    if not review.get("authenticated") or not isinstance(user, Mapping):
        return refuse(
            401,
            "Unauthenticated",
            f"the token is not accepted by the API server for audience {names.BROKER_TOKEN_AUDIENCE} "
            "(expired, revoked, or minted for another audience); mint one with the TokenRequest API",
        )
    if names.BROKER_TOKEN_AUDIENCE not in (review.get("audiences") or []):
        return refuse(
            401, "Unauthenticated", f"the token lacks the broker's audience {names.BROKER_TOKEN_AUDIENCE}"
        )
    if user.get("username") != agent_user:
        return refuse(
            403,
            "NotTheNodeAgent",
            f"the token belongs to {user.get('username')}, not the node agent ({agent_user})",
        )
    nodes = list((user.get("extra") or {}).get(names.TOKEN_EXTRA_NODE_NAME) or [])
    if len(nodes) != 1 or not nodes[0]:
        return refuse(
            401,
            "NotBoundToANode",
            "the token is not bound to a Pod on a node; mint it bound to the agent's own Pod (boundObjectRef)",
        )
    return str(nodes[0])


def named_objects(spec: Mapping[str, Any]) -> set[tuple[str, str]]:
    """(kind, name) of every object a ModelCacheNode's spec names: what its copy may read."""
    source = spec.get("source") or {}
    verification = spec.get("verification") or {}
    refs = [("Secret", source.get("secretRef")), ("Secret", verification.get("secretRef"))]
    refs.append(("ConfigMap", verification.get("configMapRef")))
    return {(kind, str(ref["name"])) for kind, ref in refs if isinstance(ref, Mapping) and ref.get("name")}


def decide(ask: Ask, node: str, copy: Mapping[str, Any] | None) -> Decision:
    """May the agent on `node` read `ask` now, given the ModelCacheNode of that cache on that node?"""
    where = f"{ask.namespace}/{ask.cache}"
    spec = (copy or {}).get("spec") or {}
    if copy is None or spec.get("nodeName") != node or spec.get("modelCacheName") != ask.cache:
        return refuse(
            403,
            "NoCopyOnThisNode",
            f"node {node} holds no copy of {where} (no ModelCacheNode for it): not served",
        )
    if (ask.kind, ask.name) not in named_objects(spec):
        return refuse(
            403,
            "NotNamedByTheCopy",
            f"the copy of {where} on node {node} does not name {ask.kind} {ask.name} "
            "(spec.source.secretRef, spec.verification): not served",
        )
    if not copy_needs_secret(copy.get("status") or {}):
        return refuse(
            409,
            "CopySettled",
            f"the copy of {where} on node {node} is on disk for its current source (or evicted): it needs "
            f"no {ask.kind} now; a new download asks again once the copy reports Pending",
        )
    return Decision(200, "Granted")


def payload(ask: Ask, obj: Mapping[str, Any] | None) -> Decision:
    """The object's data as the agent gets it (Secret: base64 values as the API has them, and its
    annotations, which may carry object-store settings), bounded by `names.BROKER_MAX_OBJECT_BYTES`."""
    where = f"{ask.kind} {ask.namespace}/{ask.name}"
    if obj is None:
        return refuse(404, "NotFound", f"{where} not found; create it (the copy continues once it exists)")
    data = obj.get("data") or {}
    if not isinstance(data, Mapping):
        return refuse(502, "Malformed", f"{where} has no data map")
    size = 0
    for key, value in data.items():
        value = str(value)
        try:
            size += len(key) + (
                len(base64.b64decode(value, validate=True)) if ask.kind == "Secret" else len(value.encode())
            )
        except (binascii.Error, ValueError):
            return refuse(502, "Malformed", f"{where} key {key} is not base64 as the API returns it")
    if size > names.BROKER_MAX_OBJECT_BYTES:
        return refuse(
            413,
            "TooLarge",
            f"{where} holds {size} bytes, more than the broker hands out ({names.BROKER_MAX_OBJECT_BYTES}); "
            "keep only the keys the cache needs in it",
        )
    body: dict[str, Any] = {"kind": ask.kind, "data": {str(k): str(v) for k, v in data.items()}}
    if ask.kind == "Secret":
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        body["annotations"] = {str(k): str(v) for k, v in annotations.items()}
    return Decision(200, "Granted", body=body)


def answer(api: BrokerApi, token: str | None, body: Any, agent_user: str) -> tuple[Decision, Ask | None, str]:
    """The whole exchange: (decision, what was asked, the asking node) for the edge to log and send.
    The token is checked before anything else is read; the object is read only once granted."""
    if not token:
        return refuse(401, "Unauthenticated", "Authorization: missing or not 'Bearer <token>'"), None, ""
    ask = parse_ask(body)
    if isinstance(ask, Decision):
        return ask, None, ""
    try:
        node = node_of(api.review(token), agent_user)
        if isinstance(node, Decision):
            return node, ask, ""
        decision = decide(ask, node, api.copy(ask.namespace, names.modelcachenode_name(ask.cache, node)))
        if not decision.allowed:
            return decision, ask, node
        return payload(ask, api.read(ask.kind, ask.namespace, ask.name)), ask, node
    except Unavailable as err:
        return refuse(503, "Unavailable", f"{err}; retry"), ask, ""
