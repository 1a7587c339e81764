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
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from praesto import names
from praesto.quantity import QuantityError, parse_quantity

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


def from_env(environ: Mapping[str, str] = os.environ) -> Quotas:
    return parse_quotas(environ.get(ENV))
