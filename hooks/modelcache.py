"""The ModelCache CompositeController hooks: customize, sync, finalize.

Pure functions `(request, config, now) -> response`: all cluster state comes in
the request, time is injected, nothing here calls the Kubernetes API. A spec
the hook cannot use never raises: the response keeps every observed child as
it is and says why in a `Ready=False` condition with reason `InvalidSpec`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from praesto.hooks import node_summary
from praesto.hooks.common import (
    READY,
    Obj,
    condition,
    keep_observed,
    meta,
)
from praesto.hooks.config import HooksConfig
from praesto.hooks.local import sync_local
from praesto.hooks.pvc import pvc_pass
from praesto.hooks.pvc_pod import JOB_NAME_LABEL
from praesto.hooks.views import Parent, SyncRequest

from praesto import names, quota
from praesto.spec import InvalidSpec, ModelCacheSpec, SpecError, parse_spec

Hook = Callable[[Any, HooksConfig, datetime], Obj]
MAX_MESSAGE = 2000
FINALIZE_RESYNC_SECONDS = 30


def customize(request: Any, config: HooksConfig, now: datetime) -> Obj:
    """Related objects: consuming Pods of this namespace always, selected Nodes in local mode.

    Metacontroller 4.17.2 (`pkg/controller/common/customize/manager.go`) lists a
    rule with only a `labelSelector` in every namespace, so the Pods rule also
    names the parent's namespace: another tenant's Pod carrying our consumer
    label must not create demand here. Nodes are selected by `spec.nodeSelector`
    as a label selector (empty selects every Node), through their NodeSummaries
    and, until a Node has one, whole (`node_summary.related_rules`), so only a
    change of a selecting label wakes this parent. An unparsable selector
    selects nothing; sync then reports the spec error.
    """
    view = Parent.parse(request)
    parent, cache, namespace = view.obj, view.name, view.namespace
    rules: list[Obj] = [
        {
            "apiVersion": "v1",
            "resource": "pods",
            "namespace": namespace,
            "labelSelector": {"matchLabels": {names.consumer_label_key(cache): "true"}},
        }
    ]
    if config.quotas.limit(namespace) is not None:
        # The namespace's ModelCaches, so sync can enforce its quota in creation order.
        rules.append(
            {"apiVersion": names.API_VERSION, "resource": names.MODELCACHE_PLURAL, "namespace": namespace}
        )
    spec = parent.get("spec")
    storage = spec.get("storage") if isinstance(spec, dict) else None
    if isinstance(storage, dict) and storage.get("storageClassName"):
        # PVC mode: the download Job's Pods (why it cannot start, what it downloaded) and,
        # with workload identity, the ServiceAccount it runs as (hooks/pvc_pod.py).
        job = names.download_job_name(cache)
        rules.append(
            {"apiVersion": "v1", "resource": "pods", "namespace": namespace,
             "labelSelector": {"matchLabels": {JOB_NAME_LABEL: job}}}
        )  # fmt: skip
        if config.downloader_service_account:
            rules.append(
                {"apiVersion": "v1", "resource": "serviceaccounts", "namespace": namespace,
                 "names": [config.downloader_service_account]}
            )  # fmt: skip
    else:
        selector = spec.get("nodeSelector") if isinstance(spec, dict) else None
        if selector is None:
            selector = {}
        if isinstance(selector, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in selector.items()
        ):
            rules.extend(node_summary.related_rules(selector))
    return {"relatedResources": rules}


def parse_parent(parent: Mapping[str, Any]) -> ModelCacheSpec:
    """The typed spec of a ModelCache object, its name checked too (InvalidSpec otherwise)."""
    errors: list[SpecError] = []
    name = meta(parent).get("name")
    if not isinstance(name, str) or not names.is_dns_label(name):
        errors.append(
            SpecError(
                "metadata.name",
                "must be a DNS label (lowercase letters, digits and '-', at most 63 characters)",
                "recreate the ModelCache under a shorter name",
                name,
            )
        )
    try:
        spec = parse_spec(parent.get("spec"))
    except InvalidSpec as err:
        raise InvalidSpec(errors + err.errors) from None
    errors.extend(downloader_errors(spec.downloader))
    if errors:
        raise InvalidSpec(errors)
    return spec


SECURITY_CONTEXT_FIELDS = frozenset(
    {
        "allowPrivilegeEscalation",
        "appArmorProfile",
        "capabilities",
        "privileged",
        "procMount",
        "readOnlyRootFilesystem",
        "runAsGroup",
        "runAsNonRoot",
        "runAsUser",
        "seLinuxOptions",
        "seccompProfile",
        "windowsOptions",
    }
)


def downloader_errors(downloader: Mapping[str, Any]) -> list[SpecError]:
    """What would make the downloader Job fail its own schema, caught before it is returned."""
    errors = []
    resources = downloader.get("resources")
    if resources is not None and not (
        set(resources) <= {"limits", "requests"}
        and all(
            isinstance(v, dict)
            and all(
                isinstance(k, str) and k and isinstance(q, str | int) and not isinstance(q, bool)
                for k, q in v.items()
            )
            for v in resources.values()
        )
    ):
        errors.append(
            SpecError(
                "spec.downloader.resources",
                "must hold only limits and requests, each a map of resource name to quantity",
                'e.g. {"requests": {"cpu": "500m"}, "limits": {"memory": "2Gi"}}',
            )
        )
    context = downloader.get("containerSecurityContext")
    if context is not None and not set(context) <= SECURITY_CONTEXT_FIELDS:
        unknown = sorted(str(k) for k in set(context) - SECURITY_CONTEXT_FIELDS)
        errors.append(
            SpecError(
                "spec.downloader.containerSecurityContext",
                f"unknown fields {unknown}",
                "use fields of the Kubernetes SecurityContext such as runAsUser",
            )
        )
    return errors


def quota_excess(request: SyncRequest, config: HooksConfig) -> str | None:
    """Why the parent does not fit its namespace's quota, taken in creation order; None when it fits.

    The validating webhook checks at create, but two caches created in the same instant both pass
    it (its watch has shown neither), so the sync hook checks again, over the namespace's caches
    (related by customize): the earlier one keeps its place, the later one gets no children.
    """
    namespace, name = request.parent.namespace, request.parent.name
    limit = config.quotas.limit(namespace)
    if limit is None:
        return None
    siblings = [c for c in request.related.modelcaches if meta(c).get("name") != name]
    excess = quota.excess_in_creation_order([*siblings, request.parent.obj], name, limit)
    if excess is None:
        return None
    return (
        f"{excess.describe(namespace, 'earlier')}; it gets no node copies or volume until it fits: delete "
        f"ModelCaches this namespace no longer needs, or ask the platform admin to raise the chart's "
        f"{quota.CHART_KEY} for {namespace}"
    )


def sync(request: Any, config: HooksConfig, now: datetime) -> Obj:
    view = SyncRequest.parse(request)  # the one read of the request: every pass below reads the view
    parent = view.parent.obj
    try:
        spec = parse_parent(parent)
        # The platform's signing policy, again here: the webhook may be bypassed (failurePolicy Ignore)
        policy = config.trust_policy.errors(view.parent.namespace, spec.verification)
        if policy:
            raise InvalidSpec(policy)
    except InvalidSpec as err:
        return invalid_spec(view, err, now)
    over = quota_excess(view, config)
    if over is not None:
        return refused(view.parent, spec, "QuotaExceeded", over, now)
    if spec.mode == names.MODE_PVC:
        return pvc_pass(view, spec, config, now)
    return sync_local(view, spec, config, now)


def invalid_spec(request: SyncRequest, err: InvalidSpec, now: datetime) -> Obj:
    """No child change the hook could justify: observed children stay as they are."""
    children = [keep_observed(obj) for obj in request.children.every]
    before, gen = request.parent.before, request.parent.generation
    message = "; ".join(str(e) for e in err.errors)
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 1] + "…"
    status: Obj = {**before, "observedGeneration": gen, "phase": names.PHASE_FAILED}
    status["conditions"] = [condition(before, READY, False, "InvalidSpec", message, now, gen)]
    return {"status": status, "children": children}


def refused(parent: Parent, spec: ModelCacheSpec, reason: str, message: str, now: datetime) -> Obj:
    """A cache that fails a security check gets no children (any it had are deleted) and says why."""
    status: Obj = {"observedGeneration": parent.generation, "phase": names.PHASE_PENDING, "mode": spec.mode}
    status["conditions"] = [condition(parent.before, READY, False, reason, message, now, parent.generation)]
    return {"status": status, "children": []}


# What finalize carries over from the last sync's status: facts about the model that no later
# pass revises. Everything else is computed from this request, never echoed (see finalize).
FINALIZE_KEPT_STATUS = ("mode", "resolvedRevision", "sizeBytes", "lastUsedTime", "pvcName")


def finalize(request: Any, config: HooksConfig, now: datetime) -> Obj:
    """Done only once every ModelCacheNode is gone (the agents remove the node copies first).

    The status is a function of the copies in the request plus the model's settled facts, not
    a copy of the previous status: every write to a deleting parent is an event (the
    `ignoreStatusChanges` filter lets deleting parents through), and a pass reading a cache one
    write behind would put the older status back, then the newer, for ever (issue 22).
    """
    view = SyncRequest.parse(request)
    before, gen = view.parent.before, view.parent.generation
    copies = view.children.copies
    remaining = len(copies)
    ready = sum(1 for c in copies if c.status.get("phase") == names.PHASE_READY)
    if remaining:
        message = (
            f"waiting for the node agents to remove {remaining} node {'copy' if remaining == 1 else 'copies'}"
        )
    else:
        message = "every node copy is removed"
    status: Obj = {k: before[k] for k in FINALIZE_KEPT_STATUS if k in before}
    status.update(
        {
            "observedGeneration": gen,
            "phase": names.PHASE_READY if remaining and ready == remaining else names.PHASE_PENDING,
            "readyNodes": ready,
            "totalNodes": remaining,
        }
    )
    status["conditions"] = [condition(before, READY, False, "Deleting", message, now, gen)]
    response: Obj = {"status": status, "children": [], "finalized": remaining == 0}
    if remaining:
        # Nothing re-runs finalize on its own in Metacontroller 4.17.2 (controller.go): child
        # events usually do, this is the safety net if one is missed.
        response["resyncAfterSeconds"] = FINALIZE_RESYNC_SECONDS
    return response


HOOKS: dict[str, Hook] = {"customize": customize, "sync": sync, "finalize": finalize}
