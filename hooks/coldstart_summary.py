"""The ModelCache's `status.podStarts`: the node agents' per-copy cold-start reports, summed up.

Each ModelCacheNode's `status.podStarts` (written by its node agent, see
agent/coldstart_reporter.py) counts the Pods that found the copy Ready at their first
mount attempt (hits) or had to wait (misses), and keeps its last waits. Counts
add up across nodes; percentiles do not, so p50/p95 are taken over the union of
the nodes' recent waits: a rolling window of the latest Pod starts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile (a value that occurred; no interpolation between Pods)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)]


def summarize(statuses: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """`{hits, misses, waitSeconds: {p50, p95, samples}}` over the copies' statuses; None before any Pod."""
    hits = misses = 0
    waits: list[float] = []
    for status in statuses:
        starts = status.get("podStarts")
        if not isinstance(starts, Mapping):
            continue
        hits += _count(starts.get("hits"))
        misses += _count(starts.get("misses"))
        for wait in starts.get("recentWaitSeconds") or ():
            if isinstance(wait, int | float) and not isinstance(wait, bool) and 0 <= wait < math.inf:
                waits.append(float(wait))
    if not hits and not misses:
        return None
    out: dict[str, Any] = {"hits": hits, "misses": misses}
    if waits:
        out["waitSeconds"] = {
            "p50": round(percentile(waits, 50), 3),
            "p95": round(percentile(waits, 95), 3),
            "samples": len(waits),
        }
    return out
