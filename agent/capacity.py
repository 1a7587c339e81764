"""Disk capacity: the reserve kept free and which caches to evict to make room.

Pure decisions (given sizes and times) plus one `statvfs` edge.
"""

from __future__ import annotations

import os
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


def choose_evictions(
    needed: int, disk: Disk, reserve: int, candidates: list[Candidate]
) -> list[Candidate] | None:
    """Least recently used caches whose removal makes `needed` bytes fit above the reserve.

    [] when it already fits; None when even evicting every candidate is not enough.
    """
    shortfall = needed + reserve - disk.free
    chosen: list[Candidate] = []
    for cand in sorted(candidates, key=lambda c: (c.last_used, c.namespace, c.name)):
        if shortfall <= 0:
            break
        chosen.append(cand)
        shortfall -= cand.size
    return chosen if shortfall <= 0 else None


def shortage_message(needed: int, disk: Disk, reserve: int, evictable: int) -> str:
    return (
        f"the model needs {format_bytes(needed)} but the node has {format_bytes(disk.free)} free "
        f"with a reserve of {format_bytes(reserve)} (disk {format_bytes(disk.total)}), and evicting every "
        f"unused cache would free only {format_bytes(evictable)}; free space on the node, lower the chart's "
        "nodeAgent.reserve (default: the larger of 30Gi and 15% of the disk), or pin this cache to nodes "
        "with a larger disk (spec.nodeSelector)"
    )
