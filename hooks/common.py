"""Small pieces both sync modes share: times, conditions, child metadata.

Status must be a pure function of what Metacontroller sends: anything derived
from `now` that changed on every call would rewrite status on every sync and
make Metacontroller resync forever. So condition transition times are carried
over from the previous status while the condition's status is unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from praesto import names

Obj = dict[str, Any]

READY = "Ready"
LAST_APPLIED_ANNOTATION = "metacontroller.k8s.io/last-applied-configuration"
TERMINAL_POD_PHASES = ("Succeeded", "Failed")
RBAC_GROUP = "rbac.authorization.k8s.io"


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC with second precision, as Kubernetes writes metav1.Time."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    value = obj.get("metadata")
    return value if isinstance(value, dict) else {}


def section(obj: Any, key: str) -> dict[str, Any]:
    """`obj[key]` when both are objects, else {}: untrusted input never crashes a hook or a webhook."""
    value = obj.get(key) if isinstance(obj, Mapping) else None
    return value if isinstance(value, dict) else {}


def previous_status(parent: Mapping[str, Any]) -> Mapping[str, Any]:
    return section(parent, "status")


def generation(parent: Mapping[str, Any]) -> int:
    value = meta(parent).get("generation")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def condition(
    previous: Mapping[str, Any],
    type_: str,
    status: bool,
    reason: str,
    message: str,
    now: datetime,
    observed_generation: int,
) -> Obj:
    """A Kubernetes condition; lastTransitionTime kept while `status` does not flip."""
    value = "True" if status else "False"
    before = next(
        (
            c
            for c in previous.get("conditions") or ()
            if isinstance(c, dict) and c.get("type") == type_ and c.get("status") == value
        ),
        None,
    )
    since = before.get("lastTransitionTime") if before else None
    return {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since if parse_time(since) else format_time(now),
        "observedGeneration": observed_generation,
    }


def child_labels(cache_name: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    labels = {names.LABEL_MODEL_CACHE: cache_name, names.LABEL_MANAGED_BY: names.MANAGED_BY}
    if extra:
        labels.update(extra)
    return labels


def child_metadata(parent: Mapping[str, Any], name: str, extra: Mapping[str, str] | None = None) -> Obj:
    parent_meta = meta(parent)
    out: Obj = {"name": name, "labels": child_labels(str(parent_meta.get("name")), extra)}
    if parent_meta.get("namespace"):
        out["namespace"] = parent_meta["namespace"]
    return out


def keep_observed(obj: Mapping[str, Any]) -> Obj:
    """An observed child restated as desired, so Metacontroller leaves it as it is.

    Used when the hook cannot justify any change (invalid spec): server-owned
    metadata and status are dropped, everything the child declares is kept.
    """
    out: Obj = {k: v for k, v in obj.items() if k not in ("status", "metadata")}
    observed = meta(obj)
    kept: Obj = {k: observed[k] for k in ("name", "namespace", "labels") if k in observed}
    raw = observed.get("annotations")
    annotations = (
        {k: v for k, v in raw.items() if k != LAST_APPLIED_ANNOTATION} if isinstance(raw, dict) else {}
    )
    if annotations:
        kept["annotations"] = annotations
    out["metadata"] = kept
    return out


def consumer_pods(pods: Iterable[Mapping[str, Any]], parent: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Related consumer Pods (`pods`: the request's related Pods) of the parent's own namespace that
    still hold (or will hold) the model.

    The customize rule already names the namespace; filtering here too means a
    Metacontroller that ignored it could still not let another tenant's Pod
    create demand or count as a consumer.
    """
    namespace = meta(parent).get("namespace")
    label = names.consumer_label_key(str(meta(parent).get("name")))
    return [
        pod
        for pod in pods
        if meta(pod).get("namespace") == namespace
        and (meta(pod).get("labels") or {}).get(label) == "true"  # not the download Job's own Pods
        and section(pod, "status").get("phase") not in TERMINAL_POD_PHASES
    ]


def role_and_binding(
    parent: Mapping[str, Any], role_name: str, rules: list[Obj], account: str, account_namespace: str
) -> list[Obj]:
    """A Role named `role_name` holding `rules`, and the RoleBinding granting it to one ServiceAccount:
    the shape of every least-privilege grant a cache's sync returns (hooks/local.py, hooks/pvc_progress.py)."""
    return [
        {
            "apiVersion": f"{RBAC_GROUP}/v1",
            "kind": "Role",
            "metadata": child_metadata(parent, role_name),
            "rules": rules,
        },
        {
            "apiVersion": f"{RBAC_GROUP}/v1",
            "kind": "RoleBinding",
            "metadata": child_metadata(parent, role_name),
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "Role", "name": role_name},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": account_namespace}],
        },
    ]


def selector_text(selector: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
