"""Metacontroller hook version v2: request shapes we read and response keys we may send.

Semantics of Metacontroller v4.17.2 (metacontroller/README.md cites each):

* v2 responses are decoded strictly (`pkg/hooks/webhook.go`, `UnmarshalStrict`
  unless `responseUnmarshallMode` says otherwise): an unknown key anywhere in
  the typed part of a response fails the sync. `check_response` is the one
  place that says what is allowed; the tests run every response through it.
* The sync and finalize responses share one type (`CompositeHookResponse`,
  `pkg/controller/composite/api/v2/hooks.go`): `finalized` decodes in both.
* A related rule is one of four selections (`determineSelectionType`,
  `pkg/controller/common/customize/manager.go`): namespaceSelector (+
  labelSelector), namespace + labelSelector, namespace and/or names, or
  labelSelector alone, which lists every namespace. `names` with a selector,
  or `namespace` with `namespaceSelector`, is refused.

Request maps (`children`, `related`) are keyed by `<Kind>.<apiVersion>` (core
group: `<Kind>.<version>`), then by `<namespace>/<name>` or `<name>`
(`pkg/controller/common/api/v2/common.go`). Every hook reads a request only
through its typed view (hooks/views.py), built once at the hook's entry; this
module keeps the group keys those views look up and the `BadRequest` they raise.
"""

from __future__ import annotations

from typing import Any

from praesto import names


class BadRequest(ValueError):
    """The body is not a Metacontroller request at all: answered with 400."""


def group_key(kind: str, api_version: str) -> str:
    return f"{kind}.{api_version}"


MODELCACHENODE = group_key(names.MODELCACHENODE_KIND, names.API_VERSION)
MODELCACHE = group_key(names.MODELCACHE_KIND, names.API_VERSION)
PVC = group_key("PersistentVolumeClaim", "v1")
JOB = group_key("Job", "batch/v1")
ROLE = group_key("Role", "rbac.authorization.k8s.io/v1")
ROLEBINDING = group_key("RoleBinding", "rbac.authorization.k8s.io/v1")
NODE = group_key("Node", "v1")
NODESUMMARY = group_key(names.NODESUMMARY_KIND, names.API_VERSION)
POD = group_key("Pod", "v1")
SERVICE_ACCOUNT = group_key("ServiceAccount", "v1")

CUSTOMIZE_RESPONSE_KEYS = frozenset({"relatedResources"})
SYNC_RESPONSE_KEYS = frozenset({"status", "children", "resyncAfterSeconds", "finalized"})
FINALIZE_RESPONSE_KEYS = SYNC_RESPONSE_KEYS
RESPONSE_KEYS = {
    "customize": CUSTOMIZE_RESPONSE_KEYS,
    "sync": SYNC_RESPONSE_KEYS,
    "finalize": FINALIZE_RESPONSE_KEYS,
}
RELATED_RULE_KEYS = frozenset(
    {"apiVersion", "resource", "labelSelector", "namespaceSelector", "namespace", "names"}
)
LABEL_SELECTOR_KEYS = frozenset({"matchLabels", "matchExpressions"})


def check_response(hook: str, response: Any) -> list[str]:
    """Every way `response` would fail Metacontroller's strict v2 decoding (empty: fine)."""
    if not isinstance(response, dict):
        return ["response must be a JSON object"]
    problems = [f"unknown key {k!r}" for k in response if k not in RESPONSE_KEYS[hook]]
    if hook == "customize":
        rules = response.get("relatedResources", [])
        if not isinstance(rules, list):
            return [*problems, "relatedResources must be a list"]
        for i, rule in enumerate(rules):
            problems.extend(_check_rule(i, rule))
        return problems
    if "status" in response and not isinstance(response["status"], dict | None):
        problems.append("status must be an object")
    children = response.get("children", [])
    if not isinstance(children, list):
        problems.append("children must be a list")
        children = []
    seen: set[tuple[str, str, str]] = set()
    for i, child in enumerate(children):
        meta = child.get("metadata") if isinstance(child, dict) else None
        if not isinstance(child, dict) or not isinstance(meta, dict):
            problems.append(f"children[{i}] must be an object with metadata")
            continue
        if not child.get("apiVersion") or not child.get("kind") or not meta.get("name"):
            problems.append(f"children[{i}] needs apiVersion, kind and metadata.name")
        ident = (str(child.get("apiVersion")), str(child.get("kind")), str(meta.get("name")))
        if ident in seen:
            problems.append(f"children[{i}] duplicates {ident}")
        seen.add(ident)
    resync = response.get("resyncAfterSeconds", 0)
    if isinstance(resync, bool) or not isinstance(resync, int | float) or resync < 0:
        problems.append("resyncAfterSeconds must be a number >= 0")
    if "finalized" in response and not isinstance(response["finalized"], bool):
        problems.append("finalized must be a boolean")
    return problems


def _check_rule(i: int, rule: Any) -> list[str]:
    if not isinstance(rule, dict):
        return [f"relatedResources[{i}] must be an object"]
    problems = [f"relatedResources[{i}]: unknown key {k!r}" for k in rule if k not in RELATED_RULE_KEYS]
    if not rule.get("apiVersion") or not rule.get("resource"):
        problems.append(f"relatedResources[{i}] needs apiVersion and resource")
    has_selector = rule.get("labelSelector") is not None
    has_namespace_selector = rule.get("namespaceSelector") is not None
    if rule.get("names") and (has_selector or has_namespace_selector):
        problems.append(
            f"relatedResources[{i}]: names cannot be combined with labelSelector/namespaceSelector"
        )
    if rule.get("namespace") and has_namespace_selector:
        problems.append(f"relatedResources[{i}]: namespace cannot be combined with namespaceSelector")
    for key in ("labelSelector", "namespaceSelector"):
        selector = rule.get(key)
        if selector is not None and (
            not isinstance(selector, dict) or not set(selector) <= LABEL_SELECTOR_KEYS
        ):
            problems.append(f"relatedResources[{i}].{key} must be a v1.LabelSelector")
    for key in ("namespace",):
        if key in rule and not isinstance(rule[key], str):
            problems.append(f"relatedResources[{i}].{key} must be a string")
    if "names" in rule and not (
        isinstance(rule["names"], list) and all(isinstance(n, str) for n in rule["names"])
    ):
        problems.append(f"relatedResources[{i}].names must be a list of strings")
    return problems
