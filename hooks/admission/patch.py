"""Minimal JSONPatch that injects model volumes into a Pod.

Only `add` operations, each at the deepest existing parent, so the patch is
correct whether the Pod has no volumes, no volumeMounts, no affinity, or some
of its own; existing init and ephemeral containers are never touched. Running
the webhook twice on its own output adds nothing (reinvocation-safe).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from praesto.hooks.common import section

from praesto import names

from .annotations import SCHEDULING_NONE, SCHEDULING_REQUIRED, Mount
from .review import json_pointer

Op = dict[str, Any]
WAIT_CPU = "10m"
WAIT_MEMORY = "64Mi"
WAIT_MEMORY_LIMIT = "128Mi"
WAIT_UID = 65532  # the image's non-root user
PREFERRED_WEIGHT = 50


@dataclass(frozen=True)
class Injection:
    """One cache to mount: the checked annotation entry plus what the lookup said about the cache."""

    mount: Mount
    pvc: str | None  # claim name in shared PVC mode, None for the local CSI mode


def _bounded(base: str, suffix: str = "") -> str:
    """A DNS label `<base><suffix>` within 63 characters."""
    return (base[: 63 - len(suffix)].rstrip("-") or "praesto") + suffix


def _unique(base: str, taken: set[str]) -> str:
    name, n = _bounded(base), 2
    while name in taken:
        name, n = _bounded(base, f"-{n}"), n + 1
    taken.add(name)
    return name


def volume_source(injection: Injection) -> dict[str, Any]:
    if injection.pvc:
        return {"persistentVolumeClaim": {"claimName": injection.pvc, "readOnly": True}}
    return {
        "csi": {
            "driver": names.CSI_DRIVER_NAME,
            "readOnly": True,
            "volumeAttributes": {names.CSI_ATTR_CACHE_NAME: injection.mount.cache},
        }
    }


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in _list(value) if isinstance(v, dict)]


class _Adder:
    """Collects `add` ops for items appended to a list that may not exist yet."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self._pending: dict[str, list[Any]] = {}

    def append(self, exists: bool, pointer: str, item: Any) -> None:
        if exists:
            self.ops.append({"op": "add", "path": pointer + "/-", "value": item})
        elif pointer in self._pending:
            self._pending[pointer].append(item)
        else:
            self._pending[pointer] = [item]
            self.ops.append({"op": "add", "path": pointer, "value": self._pending[pointer]})


def wait_container(name: str, image: str, volume: str, path: str) -> dict[str, Any]:
    """PVC mode: our own image waits for the complete marker before the app starts."""
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["praesto-agent", "wait", "--path", path],
        "volumeMounts": [{"name": volume, "mountPath": path, "readOnly": True}],
        "resources": {
            "requests": {"cpu": WAIT_CPU, "memory": WAIT_MEMORY},
            "limits": {"memory": WAIT_MEMORY_LIMIT},
        },
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": WAIT_UID,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }


def _labels_ops(meta: dict[str, Any], injections: list[Injection]) -> list[Op]:
    wanted = {names.LABEL_USES_MODEL_CACHE: "true"}
    wanted.update({names.consumer_label_key(i.mount.cache): "true" for i in injections})
    labels = meta.get("labels")
    if not isinstance(labels, dict):
        return [{"op": "add", "path": "/metadata/labels", "value": wanted}]
    return [
        {"op": "add", "path": json_pointer("metadata", "labels", key), "value": value}
        for key, value in wanted.items()
        if labels.get(key) != value
    ]


def _affinity_ops(spec: dict[str, Any], keys: list[str], scheduling: str) -> list[Op]:
    """Merge node affinity for the ready labels of local caches into whatever the Pod has."""
    if not keys or scheduling == SCHEDULING_NONE:
        return []
    exprs = [{"key": key, "operator": "In", "values": ["true"]} for key in keys]
    if scheduling == SCHEDULING_REQUIRED:
        field = "requiredDuringSchedulingIgnoredDuringExecution"
        new: Any = {"nodeSelectorTerms": [{"matchExpressions": exprs}]}
    else:
        field = "preferredDuringSchedulingIgnoredDuringExecution"
        new = [{"weight": PREFERRED_WEIGHT, "preference": {"matchExpressions": [e]}} for e in exprs]
    affinity = spec.get("affinity")
    if not isinstance(affinity, dict):
        return [{"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {field: new}}}]
    node = affinity.get("nodeAffinity")
    if not isinstance(node, dict):
        return [{"op": "add", "path": "/spec/affinity/nodeAffinity", "value": {field: new}}]
    base = json_pointer("spec", "affinity", "nodeAffinity", field)
    current = node.get(field)
    if scheduling != SCHEDULING_REQUIRED:
        if not isinstance(current, list):
            return [{"op": "add", "path": base, "value": new}]
        return [{"op": "add", "path": base + "/-", "value": term} for term in new]
    terms = current.get("nodeSelectorTerms") if isinstance(current, dict) else None
    if not isinstance(terms, list) or not terms or not all(isinstance(t, dict) for t in terms):
        return [{"op": "add", "path": base, "value": new}]
    # Terms are ORed, expressions within a term ANDed: every term must also require our labels.
    ops: list[Op] = []
    for index, term in enumerate(terms):
        pointer = f"{base}/nodeSelectorTerms/{index}/matchExpressions"
        if isinstance(term.get("matchExpressions"), list):
            ops.extend({"op": "add", "path": pointer + "/-", "value": e} for e in exprs)
        else:
            ops.append({"op": "add", "path": pointer, "value": list(exprs)})
    return ops


def _already_scheduled(spec: dict[str, Any], key: str, scheduling: str) -> bool:
    """True when a previous run already added this ready-label expression (reinvocation)."""
    expr = {"key": key, "operator": "In", "values": ["true"]}
    affinity = section(spec, "affinity")
    node = section(affinity, "nodeAffinity")
    if scheduling == SCHEDULING_REQUIRED:
        required = node.get("requiredDuringSchedulingIgnoredDuringExecution")
        terms = _dicts(required.get("nodeSelectorTerms")) if isinstance(required, dict) else []
        return bool(terms) and all(expr in _list(t.get("matchExpressions")) for t in terms)
    preferred = _dicts(node.get("preferredDuringSchedulingIgnoredDuringExecution"))
    return any(
        expr in _list(p.get("preference", {}).get("matchExpressions"))
        for p in preferred
        if isinstance(p.get("preference"), dict)
    )


def build_patch(
    pod: dict[str, Any], namespace: str, target: int, injections: list[Injection], scheduling: str, image: str
) -> list[Op]:
    """Ops adding volumes, read-only mounts, wait init containers, labels and node affinity."""
    meta = section(pod, "metadata")
    spec: dict[str, Any] = pod["spec"]
    volumes = _dicts(spec.get("volumes"))
    container = spec["containers"][target]
    mounts = _dicts(container.get("volumeMounts"))
    init = _dicts(spec.get("initContainers"))
    taken_volumes = {str(v.get("name")) for v in volumes}
    taken_containers = {
        str(c.get("name"))
        for key in ("containers", "initContainers", "ephemeralContainers")
        for c in _dicts(spec.get(key))
    }
    adder = _Adder()
    volumes_exist = isinstance(spec.get("volumes"), list)
    mounts_exist = isinstance(container.get("volumeMounts"), list)
    init_exist = isinstance(spec.get("initContainers"), list)
    for injection in injections:
        source = volume_source(injection)
        volume = next(
            (str(v.get("name")) for v in volumes if {k: v[k] for k in v if k != "name"} == source), None
        )
        if volume is None:
            volume = _unique(f"praesto-{injection.mount.cache}", taken_volumes)
            adder.append(volumes_exist, "/spec/volumes", {"name": volume, **source})
        path = injection.mount.path
        if not any(m.get("name") == volume and m.get("mountPath") == path for m in mounts):
            mount = {"name": volume, "mountPath": path, "readOnly": True}
            adder.append(mounts_exist, json_pointer("spec", "containers", target, "volumeMounts"), mount)
        if injection.pvc:
            command = ["praesto-agent", "wait", "--path", path]
            if not any(c.get("command") == command and c.get("image") == image for c in init):
                name = _unique(f"praesto-wait-{injection.mount.cache}", taken_containers)
                adder.append(init_exist, "/spec/initContainers", wait_container(name, image, volume, path))
    ready_keys = [
        key
        for key in (names.ready_label_key(namespace, i.mount.cache) for i in injections if not i.pvc)
        if not _already_scheduled(spec, key, scheduling)
    ]
    return _labels_ops(meta, injections) + adder.ops + _affinity_ops(spec, ready_keys, scheduling)
