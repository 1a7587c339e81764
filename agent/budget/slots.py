"""The pure part of the origin budget: queues of claims, who holds, Retry-After, pacing.

Each node claims its place in a group's queue with a `coordination.k8s.io/v1` Lease
of its own (`claim_name`), which only it may write (the chart's policy): nobody can
take another node's place, or write for it. The queue is ordered by the API server,
not by any clock: by the resourceVersion of a write (resource versions of one
resource are comparable integers: k8s.io/apimachinery pkg/util/resourceversion
CompareResourceVersion, v0.37.2). A waiting node whose turn it is marks its claim
as pulling, reads again, and pulls only when its mark is among the first `count`
marks, ordered by the resourceVersion of the marking writes; else it takes the
mark back. Why that bounds the pullers: a node looks only after its own mark is
written, so it sees every mark made before its own; one made later ranks after it.

Whose turn it is, is fairness, not safety (#21 item 7): when places free up, the
waiting claims of the namespaces that pull least go first (each claim names the
namespace of the download it queues for), and a namespace pulling more than its
share (`count` over the namespaces with live claims) while another waits gives
back its latest place, so each namespace gets its share of `maxNodes` in turn.

A claim is live while its holder renews it. Every value a node writes is bounded
when read, whatever the policy admitted: a lease duration longer than the budget's
own counts as the budget's, and a renewal time more than `MAX_CLOCK_SKEW` ahead of
the reader's clock is not believed (else one write could hold a place for ever).
The same holds for Retry-After (`cooldown_of`). Nothing here talks to the API server.
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
GLOBAL = ""  # the group of the cluster-wide budget; per-host groups are keyed by their origin
MAX_CLOCK_SKEW = 30.0  # seconds a written time may be ahead of the reader's clock and still be believed


def host_hash(host: str) -> str:
    """Lease names cannot hold every host name (ports, length): a stable short hash of it."""
    return hashlib.sha256(host.lower().encode()).hexdigest()[:10]


def group_key(group: str) -> str:
    """`all` for the cluster-wide budget, `h<hash>` per origin: no dot, so the node follows the first."""
    return "all" if group == GLOBAL else f"h{host_hash(group)}"


def claim_name(group: str, node: str) -> str:
    """The Lease by which `node` queues for `group`: `praesto-origin-<group key>.<node>`."""
    return f"{names.ORIGIN_LEASE_PREFIX}{group_key(group)}.{node}"


def claim_name_fits(node: str) -> bool:
    """Whether this node's claims fit in a Lease name (253 characters), for every group."""
    return len(claim_name("any host", node)) <= 253


def host_lease_name(host: str) -> str:
    """The per-host Lease that carries the shared Retry-After (its holder is never set)."""
    return f"{names.ORIGIN_LEASE_PREFIX}host-{host_hash(host)}"


def rfc3339(when: float) -> str:
    """MicroTime, as Lease renewTime/acquireTime are written."""
    return datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str | None) -> float | None:
    if not text or not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def holder(lease: Lease | None) -> str:
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


def _believed(when: float | None, now: float) -> float | None:
    """A time another node wrote, unless it lies beyond what clock skew explains."""
    return when if when is not None and when <= now + MAX_CLOCK_SKEW else None


def is_live(lease: Lease | None, now: float, max_seconds: int) -> bool:
    """Held and renewed in time, its duration counted as at most `max_seconds` (the budget's own)."""
    if lease is None or not holder(lease):
        return False
    spec = lease.get("spec") or {}
    renewed = _believed(parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime")), now)
    duration = spec.get("leaseDurationSeconds")
    if renewed is None or not isinstance(duration, int):
        return False
    return renewed + min(max(duration, 0), max_seconds) > now


def _annotations(lease: Lease) -> dict[str, str]:
    return dict(((lease.get("metadata") or {}).get("annotations")) or {})


def _version(value: object) -> int | None:
    return int(value) if isinstance(value, str) and value.isdigit() else None


def _claimed_at(lease: Lease) -> int:
    meta = lease.get("metadata") or {}
    for value in (_annotations(lease).get(names.ANNOTATION_CLAIMED_AT), meta.get("resourceVersion")):
        if (version := _version(value)) is not None:
            return version
    return 1 << 128  # never written by the API server: last


def pulling_since(lease: Lease) -> int | None:
    """The resourceVersion of the write that marked this claim as pulling; None when not marked."""
    value = _annotations(lease).get(names.ANNOTATION_PULLING_SINCE)
    if value == names.PULLING_NEW:
        return _version((lease.get("metadata") or {}).get("resourceVersion"))
    return _version(value)


def namespace_of(lease: Lease) -> str:
    return _annotations(lease).get(names.ANNOTATION_ORIGIN_NAMESPACE, "")


def queue(leases: Mapping[str, Lease], group: str, now: float, max_seconds: int) -> list[Lease]:
    """The live claims of `group`, first come first: by the API server's order of their claiming writes."""
    prefix = claim_name(group, "")
    live = [
        lease
        for name, lease in leases.items()
        if name.startswith(prefix) and is_live(lease, now, max_seconds)
    ]
    return sorted(live, key=lambda lease: (_claimed_at(lease), str(lease["metadata"]["name"])))


def pullers(leases: Mapping[str, Lease], group: str, now: float, max_seconds: int) -> list[Lease]:
    """The live claims marked as pulling, by the API server's order of their marking writes."""
    marked = [
        (since, lease)
        for lease in queue(leases, group, now, max_seconds)
        if (since := pulling_since(lease)) is not None
    ]
    return [
        lease for _, lease in sorted(marked, key=lambda pair: (pair[0], str(pair[1]["metadata"]["name"])))
    ]


def holders(leases: Mapping[str, Lease], group: str, count: int, now: float, max_seconds: int) -> list[str]:
    """The nodes that may pull from `group` now: the first `count` marks."""
    return [holder(lease) for lease in pullers(leases, group, now, max_seconds)[:count]]


def next_up(leases: Mapping[str, Lease], group: str, count: int, now: float, max_seconds: int) -> list[str]:
    """The waiting nodes whose turn it is, one per free place: the namespaces pulling least first,
    within a namespace first come first."""
    live = queue(leases, group, now, max_seconds)
    pulling: dict[str, int] = {}
    for lease in pullers(leases, group, now, max_seconds)[:count]:
        pulling[namespace_of(lease)] = pulling.get(namespace_of(lease), 0) + 1
    free = count - sum(pulling.values())
    if free <= 0:
        return []
    seen: dict[str, int] = {}
    waiting: list[tuple[int, int, str]] = []
    for position, lease in enumerate(live):
        if pulling_since(lease) is not None:
            continue
        ns = namespace_of(lease)
        waiting.append((pulling.get(ns, 0) + seen.get(ns, 0), position, holder(lease)))
        seen[ns] = seen.get(ns, 0) + 1
    return [node for _, _, node in sorted(waiting)[:free]]


def should_yield(
    leases: Mapping[str, Lease], group: str, count: int, me: str, now: float, max_seconds: int
) -> bool:
    """Whether `me` gives its place back for fairness: its namespace pulls more than its share while
    a namespace under its share waits, and `me` holds that namespace's latest place."""
    live = queue(leases, group, now, max_seconds)
    namespaces = {namespace_of(lease) for lease in live}
    share = max(1, count // max(1, len(namespaces)))
    pulling: dict[str, list[Lease]] = {}
    for lease in pullers(leases, group, now, max_seconds)[:count]:
        pulling.setdefault(namespace_of(lease), []).append(lease)
    mine = next((lease for lease in live if holder(lease) == me), None)
    if mine is None:
        return False
    ours = pulling.get(namespace_of(mine), [])
    starved = any(
        pulling_since(lease) is None and len(pulling.get(namespace_of(lease), [])) < share for lease in live
    )
    return starved and len(ours) > share and holder(ours[-1]) == me


def claimed(lease: Lease | None, name: str, me: str, now: float, duration: int, namespace: str = "") -> Lease:
    """The body that claims (or renews the claim) `name` for `me`, for a download of `namespace`:
    create it when `lease` is None.

    A new claim (none, given back, or lapsed) drops the place and the mark it had; a renewal
    records, once, the resourceVersion of the write that made the claim, and of the one that
    marked it, which keep its places. The resourceVersion read stays in the body: only `me`
    writes this Lease, so a conflict means only that `me` wrote it meanwhile.
    """
    body: Lease = (
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "labels": {names.LABEL_ORIGIN_BUDGET: names.ORIGIN_CLAIM}},
            "spec": {},
        }
        if lease is None
        else {**lease, "metadata": dict(lease.get("metadata") or {}), "spec": dict(lease.get("spec") or {})}
    )
    meta, spec = body["metadata"], body["spec"]
    annotations = _annotations(body)
    version = str(meta.get("resourceVersion") or "")
    if lease is None or holder(lease) != me or not is_live(lease, now, duration):
        spec["acquireTime"] = rfc3339(now)
        spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (lease is not None)
        annotations.pop(names.ANNOTATION_CLAIMED_AT, None)
        annotations.pop(names.ANNOTATION_PULLING_SINCE, None)
        annotations[names.ANNOTATION_ORIGIN_NAMESPACE] = namespace
    else:
        annotations.setdefault(names.ANNOTATION_CLAIMED_AT, version)
        if annotations.get(names.ANNOTATION_PULLING_SINCE) == names.PULLING_NEW:
            annotations[names.ANNOTATION_PULLING_SINCE] = version
    meta["annotations"] = annotations
    spec.update(holderIdentity=me, renewTime=rfc3339(now), leaseDurationSeconds=duration)
    return body


def marked(lease: Lease, pulling: bool) -> Lease:
    """The body that marks a claim as pulling (its turn came), or takes the mark back."""
    meta = dict(lease.get("metadata") or {})
    annotations = {k: v for k, v in _annotations(lease).items() if k != names.ANNOTATION_PULLING_SINCE}
    if pulling:
        annotations[names.ANNOTATION_PULLING_SINCE] = names.PULLING_NEW
    return {**lease, "metadata": {**meta, "annotations": annotations}}


def released(lease: Lease) -> Lease:
    """The body that gives a claim back: no holder, no place in the queue, no mark."""
    spec = {k: v for k, v in (lease.get("spec") or {}).items() if k not in ("holderIdentity", "renewTime")}
    meta = dict(lease.get("metadata") or {})
    dropped = (names.ANNOTATION_CLAIMED_AT, names.ANNOTATION_PULLING_SINCE)
    meta["annotations"] = {k: v for k, v in _annotations(lease).items() if k not in dropped}
    return {**lease, "metadata": meta, "spec": spec}


def renewal_due(lease: Lease | None, now: float, duration: int) -> bool:
    """A claim is written again a third of its duration after its last renewal (or when it lapsed)."""
    renewed = parse_time(((lease or {}).get("spec") or {}).get("renewTime"))
    return renewed is None or now - renewed >= duration / 3


# ---- Retry-After shared through the per-host Lease -------------------------------------------


@dataclass(frozen=True)
class Cooldown:
    """The origin asked to wait (429/503 Retry-After) until `until`, as node `by` was told."""

    until: float
    by: str


def cooldown_of(lease: Lease | None, now: float, max_seconds: float) -> Cooldown | None:
    """The Retry-After a host Lease carries, bounded: at most `max_seconds` after it was written
    (spec.renewTime), and none when that time lies in the future beyond clock skew."""
    annotations = ((lease or {}).get("metadata") or {}).get("annotations") or {}
    until = parse_time(annotations.get(names.ANNOTATION_RETRY_AFTER_UNTIL))
    written = _believed(parse_time(((lease or {}).get("spec") or {}).get("renewTime")), now)
    if until is None or written is None:
        return None
    return Cooldown(
        min(until, written + max_seconds), str(annotations.get(names.ANNOTATION_RETRY_AFTER_BY) or "")
    )


def with_cooldown(lease: Lease | None, name: str, host: str, cooldown: Cooldown, now: float) -> Lease | None:
    """The host Lease body recording `cooldown` (written at `now`), or None when it already asks to
    wait as long."""
    current = cooldown_of(lease, now, float("inf"))
    if current is not None and current.until >= cooldown.until:
        return None
    body: Lease = (
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "labels": {names.LABEL_ORIGIN_BUDGET: names.ORIGIN_HOST}},
            "spec": {},
        }
        if lease is None
        else {**lease, "metadata": dict(lease.get("metadata") or {}), "spec": dict(lease.get("spec") or {})}
    )
    body["metadata"]["annotations"] = {
        **(body["metadata"].get("annotations") or {}),
        names.ANNOTATION_ORIGIN_HOST: host,
        names.ANNOTATION_RETRY_AFTER_UNTIL: rfc3339(cooldown.until),
        names.ANNOTATION_RETRY_AFTER_BY: cooldown.by,
    }
    body["spec"]["renewTime"] = rfc3339(now)
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
