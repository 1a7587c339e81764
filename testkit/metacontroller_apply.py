"""Metacontroller 4.17.2's child update: the 3-way merge of `pkg/dynamic/apply/apply.go` and `ApplyUpdate`.

`pkg/controller/common/manage_children.go` `ApplyUpdate` merges the live child,
the last configuration Metacontroller applied (kept in an annotation) and what
the hook wants now, in the style of `kubectl apply`: a field the hook stopped
returning is removed, fields others set are kept, list-maps merge by the first
known key, system metadata and status stay as they are.
"""

from __future__ import annotations

import copy
import json
from typing import Any

Obj = dict[str, Any]
LAST_APPLIED = "metacontroller.k8s.io/last-applied-configuration"
KNOWN_MERGE_KEYS = ("containerPort", "port", "mountPath", "name", "uid", "ip", "path")
SYSTEM_FIELDS = (
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
)


def merge(destination: Any, last_applied: Any, desired: Any) -> Any:
    if isinstance(destination, dict):
        return _merge_object(destination, last_applied or {}, desired or {})
    if isinstance(destination, list):
        key = _list_map_key(destination, last_applied or [], desired or [])
        if key:
            return _merge_list_map(key, destination, last_applied or [], desired or [])
        return desired
    return desired


def _merge_object(destination: Obj, last_applied: Obj, desired: Obj) -> Obj:
    for key in last_applied:
        if key not in desired:
            destination.pop(key, None)
    for key, value in desired.items():
        destination[key] = merge(destination.get(key), last_applied.get(key), value)
    return destination


def _string_key(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _list_map_key(*lists: list[Any]) -> str:
    common: set[str] | None = None
    for items in lists:
        for item in items:
            if not isinstance(item, dict):
                return ""
            common = set(item) if common is None else common & set(item)
    return next((k for k in KNOWN_MERGE_KEYS if common and k in common), "")


def _merge_list_map(
    key: str, destination: list[Any], last_applied: list[Any], desired: list[Any]
) -> list[Any]:
    dest = {_string_key(i[key]): i for i in destination}
    last = {_string_key(i[key]): i for i in last_applied}
    want = {_string_key(i[key]): i for i in desired}
    _merge_object(dest, last, want)
    out, added = [], set()
    for item in [*destination, *desired]:
        k = _string_key(item[key])
        if k in dest and k not in added:
            out.append(dest[k])
            added.add(k)
    return out


def encode(obj: Obj) -> str:
    """The last-applied annotation's text: Go's json.Marshal sorts keys and adds no spaces."""
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)


def apply_update(observed: Obj, desired: Obj) -> Obj:
    """`ApplyUpdate`: the 3-way merge of observed, last applied and desired; system fields and status kept."""
    annotations = (observed.get("metadata") or {}).get("annotations") or {}
    last = json.loads(annotations[LAST_APPLIED]) if annotations.get(LAST_APPLIED) else {}
    update = copy.deepcopy(desired)
    (update.get("metadata", {}).get("annotations") or {}).pop(LAST_APPLIED, None)
    merged = merge(copy.deepcopy(observed), last, update)
    for name in SYSTEM_FIELDS:
        if name in observed["metadata"]:
            merged["metadata"][name] = observed["metadata"][name]
        else:
            merged["metadata"].pop(name, None)
    if "status" in observed:
        merged["status"] = observed["status"]
    else:
        merged.pop("status", None)
    merged["metadata"].setdefault("annotations", {})[LAST_APPLIED] = encode(update)
    return dict(merged)
