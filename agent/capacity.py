"""Disk capacity: the reserve kept free and which caches to evict to make room.

Pure decisions (given sizes and times) plus one `statvfs` edge.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from praesto.quantity import QuantityError, format_bytes, parse_quantity

MIN_RESERVE = 30 * 2**30
RESERVE_FRACTION = 0.15


@dataclass(frozen=True)
class Disk:
    total: int
    free: int  # available to unprivileged writers (f_bavail)


def disk_usage(path: Path) -> Disk:
    st = os.statvfs(path)
    return Disk(total=st.f_blocks * st.f_frsize, free=st.f_bavail * st.f_frsize)


def reserve_bytes(spec: str | None, total: int) -> int:
    """`None` → the larger of 30 GiB and 15% of the disk; else a quantity (`50Gi`) or a percent (`10%`)."""
    if spec is None or spec == "":
        return max(MIN_RESERVE, int(total * RESERVE_FRACTION))
    text = spec.strip()
    if text.endswith("%"):
        try:
            pct = float(text[:-1])
        except ValueError:
            raise QuantityError(f"--reserve {spec!r} is not a percent; write e.g. 15%") from None
        if not 0 <= pct < 100:
            raise QuantityError(f"--reserve {spec!r} must be between 0% and 100%")
        return int(total * pct / 100)
    return parse_quantity(text)


def check_reserve(spec: str | None) -> None:
    """Fail fast on a bad --reserve before the agent starts."""
    reserve_bytes(spec, 0)


@dataclass(frozen=True)
class Candidate:
    """A Ready, unmounted cache that could be evicted."""

    namespace: str
    name: str
    size: int
    last_used: float  # max(last unmount, readiness)
    over_quota: bool = False  # its namespace holds more on this node than the platform admin's quota


def choose_evictions(
    needed: int, disk: Disk, reserve: int, candidates: list[Candidate]
) -> list[Candidate] | None:
    """Caches whose removal makes `needed` bytes fit above the reserve.

    Namespaces over their quota give first, least recently used first within each
    group, so one tenant's empty nodeSelector cannot push every other tenant's
    unused caches off the node. [] when it already fits; None when even evicting
    every candidate is not enough.
    """
    shortfall = needed + reserve - disk.free
    chosen: list[Candidate] = []
    order = sorted(candidates, key=lambda c: (not c.over_quota, c.last_used, c.namespace, c.name))
    for cand in order:
        if shortfall <= 0:
            break
        chosen.append(cand)
        shortfall -= cand.size
    return chosen if shortfall <= 0 else None


def over_quota(usage: dict[str, int], limit: Callable[[str], int | None]) -> set[str]:
    """Namespaces whose caches on this node hold more bytes than their quota."""
    out = set()
    for namespace, used in usage.items():
        cap = limit(namespace)
        if cap is not None and used > cap:
            out.add(namespace)
    return out


def shortage_message(needed: int, disk: Disk, reserve: int, evictable: int, in_flight: int = 0) -> str:
    promised = f" ({format_bytes(in_flight)} of it promised to downloads in flight)" if in_flight > 0 else ""
    return (
        f"the model needs {format_bytes(needed)} but the node has {format_bytes(disk.free)} free{promised} "
        f"with a reserve of {format_bytes(reserve)} (disk {format_bytes(disk.total)}), and evicting every "
        f"unused cache would free only {format_bytes(evictable)}; free space on the node, lower the chart's "
        "nodeAgent.reserve (default: the larger of 30Gi and 15% of the disk), or pin this cache to nodes "
        "with a larger disk (spec.nodeSelector)"
    )
