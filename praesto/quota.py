"""Per-namespace quotas on cached bytes, set by the platform admin (chart value `namespaceQuota`).

One parser for both readers: the validating webhook refuses a ModelCache that
would take its namespace over the limit, and the node agent, under disk
pressure, evicts first from namespaces holding more than theirs. The chart
passes the value as JSON in one environment variable to both; a tenant edits
neither (it lives in the release, not in any object a namespace can write).

    {"default": "200Gi", "namespaces": {"team-a": "1Ti", "sandbox": "0"}}

`default` applies to every namespace not listed; empty or absent means no
limit. What counts against a quota is the sum of `spec.storage.size` over the
namespace's ModelCaches: the node agent refuses a node copy larger than its
`storage.size`, so this sum also bounds what the namespace holds on any node.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from praesto import names
from praesto.quantity import QuantityError, format_bytes, parse_quantity

ENV = "PRAESTO_NAMESPACE_QUOTAS"
CHART_KEY = "namespaceQuota"


class QuotaError(ValueError):
    """The admin's quota setting is malformed; the message names the key and the fix."""


@dataclass(frozen=True)
class Quotas:
    default: int | None = None
    namespaces: Mapping[str, int] = field(default_factory=dict)

    def limit(self, namespace: str) -> int | None:
        """Bytes `namespace` may declare in total; None: no limit."""
        return self.namespaces.get(namespace, self.default)

    @property
    def enabled(self) -> bool:
        return self.default is not None or bool(self.namespaces)


def _bytes(value: Any, key: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        amount = parse_quantity(value)
    except QuantityError as err:
        raise QuotaError(
            f"{CHART_KEY}.{key}: {err}; use a quantity such as 500Gi, or empty for no limit"
        ) from None
    if amount < 0:
        raise QuotaError(
            f"{CHART_KEY}.{key}: {value!r} is negative; use 0 or more (0: nothing may be cached)"
        )
    return amount


def parse_quotas(text: str | None) -> Quotas:
    """Quotas from the chart's JSON; empty text means none."""
    if not text or not text.strip():
        return Quotas()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise QuotaError(f"{ENV}: not JSON ({err.msg}); the chart writes it from {CHART_KEY}") from None
    if not isinstance(data, dict):
        raise QuotaError(f"{ENV}: must be an object with default and namespaces")
    unknown = sorted(set(data) - {"default", "namespaces"})
    if unknown:
        raise QuotaError(f"{CHART_KEY}.{unknown[0]}: unknown key; only default and namespaces exist")
    listed = data.get("namespaces") or {}
    if not isinstance(listed, dict):
        raise QuotaError(
            f"{CHART_KEY}.namespaces: must map namespace names to quantities, e.g. team-a: 500Gi"
        )
    namespaces: dict[str, int] = {}
    for namespace, value in listed.items():
        if not names.is_dns_label(str(namespace)):
            raise QuotaError(f"{CHART_KEY}.namespaces: {str(namespace)[:80]!r} is not a namespace name")
        amount = _bytes(value, f"namespaces.{namespace}")
        if amount is not None:
            namespaces[str(namespace)] = amount
    return Quotas(_bytes(data.get("default"), "default"), namespaces)


def from_env(environ: Mapping[str, str]) -> Quotas:
    """The chart's quotas from a process environment the caller read (each process's settings)."""
    return parse_quotas(environ.get(ENV))


def declared(cache: Mapping[str, Any]) -> int | None:
    """The bytes a ModelCache object declares (spec.storage.size); None when it declares none."""
    spec = cache.get("spec")
    storage = spec.get("storage") if isinstance(spec, Mapping) else None
    size = storage.get("size") if isinstance(storage, Mapping) else None
    if not isinstance(size, str | int) or isinstance(size, bool):
        return None
    try:
        return parse_quantity(size)
    except QuantityError:
        return None  # refused at create; nothing the namespace can hold


@dataclass(frozen=True)
class Excess:
    """Why a cache does not fit: what the others hold, what it asks, the limit."""

    used: int
    others: int  # how many ModelCaches hold `used`
    requested: int
    limit: int

    def describe(self, namespace: str, others: str = "other") -> str:
        return (
            f"namespace {namespace} has a quota of {format_bytes(self.limit)} ({self.limit} bytes) on cached "
            f"bytes; {format_bytes(self.used)} ({self.used} bytes) is used by its {self.others} {others} "
            f"ModelCache(s) and this one requests {format_bytes(self.requested)} ({self.requested} bytes)"
        )


def _creation_order(cache: Mapping[str, Any]) -> tuple[str, str]:
    meta = cache.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    return str(meta.get("creationTimestamp") or ""), str(meta.get("name") or "")


def excess_in_creation_order(caches: Iterable[Mapping[str, Any]], name: str, limit: int) -> Excess | None:
    """Whether cache `name` of one namespace fits its quota, the namespace's caches taken in creation
    order (ties by name): each earlier cache that fitted counts, one that did not holds nothing.

    The sync hook's rule: two caches created in the same instant can both pass the webhook (its
    watch has shown neither), and the later one then gets no children (issue 21 item 17).
    """
    used = count = 0
    for cache in sorted(caches, key=_creation_order):
        size = declared(cache) or 0
        if _creation_order(cache)[1] == name:
            return None if used + size <= limit else Excess(used, count, size, limit)
        if used + size <= limit:
            used, count = used + size, count + 1
    return None
