"""Which caches the cluster-wide credentials may serve: one rule for the node agent and the hooks.

The platform admin opts namespaces in (chart credentials.namespaces) and may narrow the
sources to URI prefixes (credentials.sources), so an opted-in namespace still cannot read
everything the organisation's credential can. A cache that names its own Secret never
gets the cluster's credentials at all (README "Security model").
"""

from __future__ import annotations

from collections.abc import Iterable

ENV_NAMESPACES = "PRAESTO_CREDENTIALS_NAMESPACES"  # comma-separated
ENV_SOURCES = "PRAESTO_CREDENTIALS_SOURCES"  # comma-separated URI prefixes


def split_list(value: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in value.split(",") if item.strip())


def source_within(uri: str, prefixes: Iterable[str]) -> bool:
    """True when no prefixes are set, or `uri` starts with one of them."""
    listed = tuple(prefixes)
    return not listed or any(uri.startswith(prefix) for prefix in listed)
