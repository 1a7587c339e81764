"""The per-namespace quota on cached bytes, enforced when a ModelCache is created.

The platform admin sets it in the chart (`namespaceQuota`, parsed by
`praesto.quota`); a tenant can neither see nor edit it from its namespace. What
counts is `spec.storage.size`, which the node agent enforces as a hard limit on
each node copy (and the PVC size in shared mode), so the sum over a namespace's
ModelCaches bounds what it can hold on any one node and in PVCs. Used bytes
come from the webhook's watch-fed ModelCache cache; two creates in the same
instant may both pass (the watch has not shown either yet), so the sync hook
enforces the quota too, in creation order (hooks/modelcache.py): the later one
gets no children.
"""

from __future__ import annotations

from typing import Any

from praesto.quota import CHART_KEY, Excess, Quotas, declared
from praesto.spec import ModelCacheSpec

from .lookup import Lookups, LookupUnavailable
from .review import FORBIDDEN, UNAVAILABLE, Refusal

FIELD = "spec.storage.size"


def declared_bytes(caches: list[dict[str, Any]], excluding: str) -> tuple[int, int]:
    """(bytes, count) the namespace's other ModelCaches declare in spec.storage.size."""
    sizes = [declared(obj) for obj in caches if (obj.get("metadata") or {}).get("name") != excluding]
    counted = [size for size in sizes if size is not None]
    return sum(counted), len(counted)


def check(namespace: str, name: str, parsed: ModelCacheSpec, lookups: Lookups, quotas: Quotas) -> None:
    """Refuse a ModelCache that takes `namespace` over its quota; the refusal states used, requested, limit.

    `quotas`: the chart's (HooksConfig.quotas). A malformed setting stops the hooks process at
    start (HooksConfig.from_env names the variable), so no create passes unchecked.
    """
    limit = quotas.limit(namespace)
    if limit is None:
        return
    try:
        caches = lookups.modelcaches_in(namespace)
    except LookupUnavailable as error:
        raise Refusal(
            FIELD,
            f"namespace {namespace} has a quota on cached bytes and Praesto could not count its ModelCaches: {error}",
            "retry, or check the praesto-hooks logs",
            UNAVAILABLE,
        ) from None
    used, count = declared_bytes(caches, excluding=name)
    requested = parsed.size_bytes
    if used + requested <= limit:
        return
    raise Refusal(
        FIELD,
        Excess(used, count, requested, limit).describe(namespace),
        "delete ModelCaches this namespace no longer needs, request a smaller storage.size, or ask the "
        f"platform admin to raise the chart's {CHART_KEY} for {namespace}",
        FORBIDDEN,
    )
