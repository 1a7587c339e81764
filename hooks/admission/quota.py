"""The per-namespace quota on cached bytes, enforced when a ModelCache is created.

The platform admin sets it in the chart (`namespaceQuota`, parsed by
`praesto.quota`); a tenant can neither see nor edit it from its namespace. What
counts is `spec.storage.size`, which the node agent enforces as a hard limit on
each node copy (and the PVC size in shared mode), so the sum over a namespace's
ModelCaches bounds what it can hold on any one node and in PVCs. Used bytes
come from the webhook's watch-fed ModelCache cache; two creates in the same
instant may both pass (the watch has not shown either yet), and the node
agent's eviction still takes from namespaces over their quota first.
"""

from __future__ import annotations

import functools
from typing import Any

from praesto.quantity import QuantityError, format_bytes, parse_quantity
from praesto.quota import CHART_KEY, QuotaError, Quotas, from_env
from praesto.spec import ModelCacheSpec

from .lookup import Lookups, LookupUnavailable
from .review import FORBIDDEN, UNAVAILABLE, Refusal

FIELD = "spec.storage.size"


@functools.cache
def configured() -> Quotas:
    """The chart's quotas for this process (PRAESTO_NAMESPACE_QUOTAS), read once."""
    return from_env()


def declared_bytes(caches: list[dict[str, Any]], excluding: str) -> tuple[int, int]:
    """(bytes, count) the namespace's other ModelCaches declare in spec.storage.size."""
    total = count = 0
    for obj in caches:
        if (obj.get("metadata") or {}).get("name") == excluding:
            continue
        size = ((obj.get("spec") or {}).get("storage") or {}).get("size")
        if not isinstance(size, (str, int)):
            continue
        try:
            total += parse_quantity(size)
        except QuantityError:
            continue  # the webhook refused it at create; nothing the namespace can hold
        count += 1
    return total, count


def check(
    namespace: str, name: str, parsed: ModelCacheSpec, lookups: Lookups, quotas: Quotas | None = None
) -> None:
    """Refuse a ModelCache that takes `namespace` over its quota; the refusal states used, requested, limit.

    `quotas` None: the chart's. A malformed setting refuses every create (fail closed), saying so.
    """
    if quotas is None:
        try:
            quotas = configured()
        except QuotaError as error:
            raise Refusal(
                FIELD,
                f"the platform's quota setting is malformed: {error}",
                "ask the platform admin to fix the chart value",
                UNAVAILABLE,
            ) from None
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
        f"namespace {namespace} has a quota of {format_bytes(limit)} ({limit} bytes) on cached bytes; "
        f"{format_bytes(used)} ({used} bytes) is used by its {count} other ModelCache(s) and this one "
        f"requests {format_bytes(requested)} ({requested} bytes)",
        "delete ModelCaches this namespace no longer needs, request a smaller storage.size, or ask the "
        f"platform admin to raise the chart's {CHART_KEY} for {namespace}",
        FORBIDDEN,
    )
