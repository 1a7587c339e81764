"""Mutating Pod webhook: AdmissionReview in, allow / patch / refuse out.

Pure apart from the `Lookups` it is given. Pods without our annotations (and
anything that is not a Pod CREATE) are allowed untouched before any lookup.

Which cache phases admit a Pod:
* local mode: every phase but Failed. The CSI driver holds a Pod whose copy is
  not complete in ContainerCreating, with progress in its events.
* shared PVC mode: every phase but Failed, Ready and Evicted included. The
  sync hook creates the claim and the download Job together (and re-creates
  them for an Evicted cache once it sees a consumer), and our wait init
  container keeps the application from starting before the complete marker.
Not-yet-Ready phases admit with an AdmissionReview warning saying so.

`disclose=False` (the caller is not verified as the API server: chart default,
no webhooks.clientAuth): anyone able to connect can forge a review naming any
namespace, so the answer says nothing about the cache beyond what the patch
needs (#21 item 15): no phase, progress or failure text, no warnings, and one
refusal for a cache that does not exist or has failed. The cache's status, read
by the namespace's own users, says the rest.
"""

from __future__ import annotations

from typing import Any

from praesto.hooks.common import section

from praesto import names
from praesto.quantity import format_bytes

from . import review
from .annotations import Mount, Wanted, overlaps, parse_annotations, wants_injection
from .lookup import Lookups, LookupUnavailable
from .patch import Injection, build_patch, volume_source
from .review import FORBIDDEN, UNAVAILABLE, Refusal


def failure_message(cache: dict[str, Any]) -> str:
    """The cache's own words for why it failed: its Ready=False condition, else status.message."""
    status = section(cache, "status")
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
    conditions.sort(key=lambda c: c.get("type") != "Ready")
    for condition in conditions:
        if condition.get("status") == "False" and condition.get("message"):
            reason = f"{condition['reason']}: " if condition.get("reason") else ""
            return f"{reason}{condition['message']}"
    return str(status.get("message") or "no reason was recorded")


def _progress(status: dict[str, Any]) -> str:
    progress = section(status, "progress")
    done, total = progress.get("bytesDone"), progress.get("bytesTotal")
    if isinstance(done, int) and isinstance(total, int) and total > 0:
        return f" ({100 * done // total}% of {format_bytes(total)})"
    return ""


def _unusable(mount: Mount, namespace: str) -> Refusal:
    """The refusal an unverified caller gets: the same whether the cache is missing or failed."""
    return Refusal(
        mount.field,
        f"ModelCache {mount.cache!r} does not exist in namespace {namespace} or cannot be used",
        f"check its name and status: kubectl describe modelcache {mount.cache} -n {namespace}",
        FORBIDDEN,
    )


def _injection(
    mount: Mount, namespace: str, lookups: Lookups, disclose: bool = True
) -> tuple[Injection, str | None]:
    """Decide from the cache's mode and phase: inject (maybe with a warning) or refuse."""
    ref = f"{namespace}/{mount.cache}"
    try:
        cache = lookups.get_modelcache(namespace, mount.cache)
    except LookupUnavailable as error:
        raise Refusal(
            mount.field,
            f"Praesto could not read ModelCache {ref} from the Kubernetes API: {error}",
            "retry, or check the praesto-hooks logs",
            UNAVAILABLE,
        ) from None
    if not disclose and (cache is None or section(cache, "status").get("phase") == names.PHASE_FAILED):
        raise _unusable(mount, namespace)
    if cache is None:
        raise Refusal(
            mount.field,
            f"ModelCache {mount.cache!r} does not exist in namespace {namespace}",
            f"create it first (kubectl get modelcaches -n {namespace}) or correct the name",
            FORBIDDEN,
        )
    spec = section(cache, "spec")
    storage = section(spec, "storage")
    status = section(cache, "status")
    phase = status.get("phase") or names.PHASE_PENDING
    if phase == names.PHASE_FAILED:
        raise Refusal(
            mount.field,
            f"ModelCache {ref} has failed: {failure_message(cache)}",
            f"fix the cause (kubectl describe modelcache {mount.cache} -n {namespace}), then create the Pod again",
            FORBIDDEN,
        )
    storage_class = storage.get("storageClassName")
    if isinstance(storage_class, str) and storage_class:
        pvc = status.get("pvcName") or names.pvc_name(mount.cache)
        warning = None
        if phase == names.PHASE_EVICTED:
            warning = f"ModelCache {ref} was evicted; it is downloaded again and the Pod's init container waits for it"
        elif phase != names.PHASE_READY:
            warning = f"ModelCache {ref} is {phase}{_progress(status)}; the Pod's init container waits until it is complete"
        return Injection(mount, str(pvc)), warning if disclose else None
    warning = None
    if phase != names.PHASE_READY:
        warning = (
            f"ModelCache {ref} is {phase}{_progress(status)}; the Pod waits in ContainerCreating "
            "until the copy on its node is complete"
        )
    return Injection(mount, None), warning if disclose else None


def _target_index(spec: dict[str, Any], wanted: Wanted) -> int:
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers or not all(isinstance(c, dict) for c in containers):
        raise Refusal(
            "spec.containers", "must be a non-empty list of containers", "add the application container"
        )
    if wanted.target is None:
        return 0
    for index, container in enumerate(containers):
        if container.get("name") == wanted.target:
            return index
    known = ", ".join(str(c.get("name")) for c in containers)[:200]
    raise Refusal(
        f"metadata.annotations[{names.ANNOTATION_TARGET_CONTAINER}]",
        f"container {wanted.target[:63]!r} is not in spec.containers",
        f"use one of: {known}",
    )


def _check_collisions(container: dict[str, Any], injections: list[Injection], spec: dict[str, Any]) -> None:
    """Our read-only volume cannot share, hide or host another volumeMount of the target container."""
    volumes = {str(v.get("name")): v for v in spec.get("volumes") or [] if isinstance(v, dict)}
    for existing in container.get("volumeMounts") or []:
        if not isinstance(existing, dict) or not isinstance(existing.get("mountPath"), str):
            continue
        raw = existing["mountPath"]
        path = "/" + "/".join(p for p in raw.split("/") if p not in ("", "."))
        volume = volumes.get(str(existing.get("name")), {})
        for injection in injections:
            source = {k: v for k, v in volume.items() if k != "name"}
            if path == injection.mount.path and source == volume_source(injection):
                continue  # injected by an earlier run of this webhook
            if overlaps(path, injection.mount.path):
                raise Refusal(
                    injection.mount.path_field,
                    f"{injection.mount.path} collides with the container's volumeMount "
                    f"{str(existing.get('name'))[:63]!r} at {raw[:200]}",
                    "choose a mountPath outside the container's other volume mounts",
                )


def plan(
    request: review.Request, lookups: Lookups, image: str, disclose: bool = True
) -> tuple[list[dict[str, Any]], list[str]]:
    """JSONPatch and warnings for an annotated Pod; raises `Refusal`."""
    pod = request.obj
    meta = section(pod, "metadata")
    wanted = parse_annotations(meta.get("annotations") or {})
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        raise Refusal("spec", "Required value", "send a Pod with a spec")
    if not names.is_dns_label(request.namespace):
        raise Refusal("metadata.namespace", "Required value", "create the Pod in a namespace")
    target = _target_index(spec, wanted)
    injections: list[Injection] = []
    warnings: list[str] = []
    for mount in wanted.mounts:
        injection, warning = _injection(mount, request.namespace, lookups, disclose)
        injections.append(injection)
        if warning:
            warnings.append(warning)
    _check_collisions(spec["containers"][target], injections, spec)
    return build_patch(pod, request.namespace, target, injections, wanted.scheduling, image), warnings


def mutate(request: review.Request, lookups: Lookups, image: str, disclose: bool = True) -> dict[str, Any]:
    """AdmissionReview response for one parsed request; `disclose`: see the module docstring."""
    pod = request.obj
    meta = pod.get("metadata")
    if (
        request.operation != "CREATE"
        or pod.get("kind", "Pod") != "Pod"
        or not isinstance(meta, dict)
        or not wants_injection(meta.get("annotations"))
    ):
        return review.allow(request.uid)
    try:
        patch, warnings = plan(request, lookups, image, disclose)
    except Refusal as refusal:
        return review.deny(request.uid, refusal)
    return review.allow_patch(request.uid, patch, warnings)
