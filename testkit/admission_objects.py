"""Builders and checks shared by the admission tests: reviews, Pods, patch application."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import jsonpatch
import kubernetes_validate
from praesto.hooks.admission import review
from praesto.hooks.admission.lookup import StaticLookups

from praesto import names

NS = "team-a"
IMAGE = "registry.example/praesto:test"
K8S_VERSION = "1.33.0"

Obj = dict[str, Any]


def pod(annotations: dict[str, str] | None = None, **spec: Any) -> Obj:
    body: Obj = {"containers": [{"name": "app", "image": "busybox"}]}
    body.update(spec)
    meta: Obj = {"generateName": "web-", "namespace": NS}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body}


def mounts(*pairs: tuple[str, str]) -> dict[str, str]:
    return {names.ANNOTATION_MODEL_MOUNTS: json.dumps([{"modelCache": c, "mountPath": p} for c, p in pairs])}


def review_body(
    obj: Obj | None, operation: str = "CREATE", old: Obj | None = None, uid: str = "uid-1"
) -> Obj:
    request: Obj = {
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "operation": operation,
        "namespace": NS,
        "object": obj,
    }
    if old is not None:
        request["oldObject"] = old
    return {"apiVersion": review.API_VERSION, "kind": review.KIND, "request": request}


def request_of(obj: Obj | None, operation: str = "CREATE", old: Obj | None = None) -> review.Request:
    return review.parse_review(review_body(obj, operation, old))


def modelcache(name: str, phase: str | None, pvc: bool = False, namespace: str = NS, **status: Any) -> Obj:
    storage: Obj = {"size": "1Gi"}
    if pvc:
        storage["storageClassName"] = "nfs-rwx"
    obj: Obj = {
        "apiVersion": names.API_VERSION,
        "kind": names.MODELCACHE_KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"source": {"huggingface": {"repo": "org/model"}}, "storage": storage},
    }
    if phase is not None:
        obj["status"] = {"phase": phase, **status}
    return obj


FAILED_CONDITIONS = [
    {
        "type": "Ready",
        "status": "False",
        "reason": "RepoNotFound",
        "message": "org/model does not exist on the Hub",
    }
]


def _all_caches() -> list[Obj]:
    """One cache per (mode, phase), named `<mode>-<phase>`; `new` has no status yet."""
    out = []
    for pvc in (False, True):
        for phase in (None, *names.PHASES):
            name = f"{'pvc' if pvc else 'local'}-{(phase or 'new').lower()}"
            cache = modelcache(name, phase, pvc)
            if phase == names.PHASE_FAILED:
                cache["status"]["conditions"] = FAILED_CONDITIONS
            out.append(cache)
    return out


CACHES = _all_caches()


def static_lookups(caches: list[Obj] = CACHES) -> StaticLookups:
    return StaticLookups(
        modelcaches={(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in caches},
        storageclasses={"nfs-rwx"},
        node_labels=[{"kubernetes.io/hostname": "n1", names.LABEL_CACHE_NODE: "true"}],
    )


def patch_of(response: Obj) -> list[Obj]:
    body = response["response"]
    if "patch" not in body:
        return []
    assert body["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(body["patch"]))
    assert isinstance(ops, list)
    return ops


def apply_and_validate(obj: Obj, response: Obj) -> Obj:
    """Apply the response's JSONPatch and check the result is a valid Pod for the Kubernetes schema."""
    patched = jsonpatch.apply_patch(copy.deepcopy(obj), patch_of(response))
    assert isinstance(patched, dict)
    kubernetes_validate.validate(patched, K8S_VERSION, strict=True)
    return patched


def denial(response: Obj) -> tuple[int, str]:
    body = response["response"]
    assert body["allowed"] is False, body
    return body["status"]["code"], body["status"]["message"]
