"""The pure part of the origin budget: which Lease slot to take, when one is free, Retry-After, pacing.

A slot is a `coordination.k8s.io/v1` Lease (as the API serves it, a dict). It is
free when it has no holder or its holder stopped renewing it for longer than
`leaseDurationSeconds` (a crashed agent's slot expires); a node already holding
one keeps it. Taking and releasing are writes guarded by resourceVersion (leases.py),
so two nodes choosing the same free slot cannot both get it: the second write
conflicts and that node tries again. Nothing here talks to the API server.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from praesto import names

Lease = dict[str, Any]
GLOBAL = ""  # the slot group of the cluster-wide budget; per-host groups are keyed by host


def host_hash(host: str) -> str:
    """Lease names cannot hold every host name (ports, length): a stable short hash of it."""
    return hashlib.sha256(host.lower().encode()).hexdigest()[:10]


def slot_names(group: str, count: int) -> list[str]:
    """`praesto-origin-<i>` for the cluster-wide budget, `praesto-origin-host-<hash>-<i>` per host."""
    prefix = names.ORIGIN_LEASE_PREFIX if group == GLOBAL else f"{host_lease_name(group)}-"
    return [f"{prefix}{i}" for i in range(count)]


def host_lease_name(host: str) -> str:
    """The per-host Lease that carries the shared Retry-After (its holder is never set)."""
    return f"{names.ORIGIN_LEASE_PREFIX}host-{host_hash(host)}"


def rfc3339(when: float) -> str:
    """MicroTime, as Lease renewTime/acquireTime are written."""
    return datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def holder(lease: Lease | None) -> str:
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


def expires_at(lease: Lease) -> float:
    """When the holder's claim lapses unless renewed; 0 for a lease that never held."""
    spec = lease.get("spec") or {}
    renewed = parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime"))
    if renewed is None:
        return 0.0
    return renewed + float(spec.get("leaseDurationSeconds") or 0)


def is_free(lease: Lease | None, now: float) -> bool:
    """Nobody holds it, or its holder has not renewed it in time (crashed, partitioned)."""
    return lease is None or not holder(lease) or expires_at(lease) <= now


def holders(leases: Mapping[str, Lease | None], now: float) -> list[str]:
    """The nodes holding these slots now, sorted (messages must not churn)."""
    return sorted({holder(lease) for lease in leases.values() if not is_free(lease, now)})


def choose(leases: Mapping[str, Lease | None], me: str, now: float) -> str | None:
    """The slot `me` should take: the one it holds already, else a free one, else None (wait).

    `leases` maps every slot name of one group to its Lease, None when it does not
    exist yet. Free slots are tried in an order that depends on the node's name, so
    nodes waiting together spread over the free slots instead of all conflicting on
    the first.
    """
    mine = [name for name, lease in leases.items() if holder(lease) == me and not is_free(lease, now)]
    if mine:
        return sorted(mine)[0]
    free = [name for name, lease in leases.items() if is_free(lease, now)]
    if not free:
        return None
    return min(free, key=lambda name: hashlib.sha256(f"{me}/{name}".encode()).digest())


def taken(lease: Lease | None, name: str, me: str, now: float, duration: int, kind: str = "slot") -> Lease:
    """The body that claims (or renews) slot `name` for `me`: create it when `lease` is None.

    The resourceVersion read stays in the body, so the write fails with 409 when
    another node changed the slot since.
    """
    body: Lease = (
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "labels": {names.LABEL_ORIGIN_BUDGET: kind}},
            "spec": {},
        }
        if lease is None
        else {**lease, "metadata": dict(lease.get("metadata") or {}), "spec": dict(lease.get("spec") or {})}
    )
    spec = body["spec"]
    if holder(lease) != me or is_free(lease, now):
        spec["acquireTime"] = rfc3339(now)
        spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (lease is not None)
    spec.update(holderIdentity=me, renewTime=rfc3339(now), leaseDurationSeconds=duration)
    return body


def released(lease: Lease) -> Lease:
    """The body that gives slot `lease` back: no holder (resourceVersion kept, as for taking)."""
    spec = {k: v for k, v in (lease.get("spec") or {}).items() if k not in ("holderIdentity", "renewTime")}
    return {**lease, "spec": spec}


# ---- Retry-After shared through the per-host Lease -------------------------------------------


@dataclass(frozen=True)
class Cooldown:
    """The origin asked to wait (429/503 Retry-After) until `until`, as node `by` was told."""

    until: float
    by: str


def cooldown_of(lease: Lease | None) -> Cooldown | None:
    annotations = ((lease or {}).get("metadata") or {}).get("annotations") or {}
    until = parse_time(annotations.get(names.ANNOTATION_RETRY_AFTER_UNTIL))
    if until is None:
        return None
    return Cooldown(until, str(annotations.get(names.ANNOTATION_RETRY_AFTER_BY) or ""))


def with_cooldown(lease: Lease | None, name: str, host: str, cooldown: Cooldown) -> Lease | None:
    """The host Lease body recording `cooldown`, or None when it already asks to wait as long."""
    current = cooldown_of(lease)
    if current is not None and current.until >= cooldown.until:
        return None
    body: Lease = (
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "labels": {names.LABEL_ORIGIN_BUDGET: "host"}},
            "spec": {},
        }
        if lease is None
        else {**lease, "metadata": dict(lease.get("metadata") or {})}
    )
    body["metadata"]["annotations"] = {
        **(body["metadata"].get("annotations") or {}),
        names.ANNOTATION_ORIGIN_HOST: host,
        names.ANNOTATION_RETRY_AFTER_UNTIL: rfc3339(cooldown.until),
        names.ANNOTATION_RETRY_AFTER_BY: cooldown.by,
    }
    return body


# ---- bytes per second --------------------------------------------------------------------------


class Pace:
    """A node's share of the cluster's origin bytes/s: `bytes_per_second / max_nodes`, for all its downloads.

    Why a fixed share rather than the rate divided among the current holders: a
    share never needs the other nodes' state, cannot overshoot while holders come
    and go, and is what each node may count on. The cost: with fewer holders than
    slots the cluster uses less than the whole rate. `delay(n)` books `n` bytes and
    says how long to wait before reading more (a token bucket of one second).
    """

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.clock = clock
        self._next = 0.0  # when the bytes booked so far may have arrived at `rate`
        self._lock = threading.Lock()

    def delay(self, n: int) -> float:
        if self.rate <= 0:
            return 0.0
        with self._lock:
            now = self.clock()
            self._next = max(self._next, now) + n / self.rate  # idle time earns no credit
            return max(0.0, self._next - now - 1.0)  # up to one second ahead without waiting


def share(bytes_per_second: int, max_nodes: int) -> float:
    """One node's bytes/s; 0 (no pacing) when the chart sets no rate."""
    return bytes_per_second / max_nodes if bytes_per_second > 0 and max_nodes > 0 else 0.0


def describe(group: str, count: int, held_by: Iterable[str], value: str) -> str:
    """Why a node waits, naming the limit, who holds it and the chart value that raises it."""
    nodes = ", ".join(held_by) or "nobody (the slots are being taken)"
    where = "the origin" if group == GLOBAL else group
    plural = "node" if count == 1 else "nodes"
    return (
        f"waiting for the cluster's origin budget: {count} {plural} may pull from {where} at once "
        f"and {nodes} {'holds' if nodes.count(',') == 0 else 'hold'} it; pulling from peers meanwhile "
        f"when they have the model; raise the chart's {value} to allow more"
    )
