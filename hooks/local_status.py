"""Local mode status: the node agents' ModelCacheNode reports, summed up.

Per-node truth, cache-level sense. A failed node does not make the cache
Failed while another node can serve: the phase is taken over the healthy
(not Failed) nodes, and a `Degraded` condition names the failed ones and why.

Phase: every node Failed → Failed; every healthy node Ready → Ready; any Ready
or Downloading → Downloading; every healthy node Evicted → Evicted (the agent
rehydrates a copy when a Pod needs it); otherwise Pending, with the nodes'
waiting reasons (WaitingForSecret, InsufficientDisk, ...) counted in the Ready
condition's message. Nodes that should hold a copy but have no ModelCacheNode
observed yet count as pending.

Progress: the copies' bytes add up; the rate is the sum of the downloading copies'
rates, the time left the longest of theirs (none while one of them has no estimate yet;
copies not started are not counted).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from praesto.hooks import coldstart_summary, rolling
from praesto.hooks.common import (
    READY,
    Obj,
    condition,
    format_time,
    parse_time,
    section,
    selector_text,
)
from praesto.hooks.views import Copy, Parent

from praesto import names, progress
from praesto.quantity import format_bytes
from praesto.spec import ModelCacheSpec

MAX_LISTED_FAILURES = 3
DEGRADED = "Degraded"
SIZE_WITHIN_REQUEST = "SizeWithinRequest"  # the node agent's condition type on ModelCacheNodes too


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def node_phase(status: Mapping[str, Any]) -> str:
    phase = status.get("phase")
    return phase if phase in names.PHASES else names.PHASE_PENDING


def _ready_condition(status: Mapping[str, Any]) -> Mapping[str, Any]:
    return next(
        (c for c in status.get("conditions") or () if isinstance(c, dict) and c.get("type") == READY), {}
    )


def _failure_text(node: str, status: Mapping[str, Any]) -> str:
    ready = _ready_condition(status)
    reason = ready.get("reason") or "Failed"
    message = status.get("message") or ready.get("message") or "no message from the node agent"
    return f"{node}: {reason}: {message}"


def _waiting(statuses: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """Why pending nodes wait, by the agents' reasons: `2 nodes WaitingForSecret: <first message>`."""
    reasons: Counter[str] = Counter()
    first: dict[str, str] = {}
    for phase, status in statuses:
        if phase != names.PHASE_PENDING:
            continue
        ready = _ready_condition(status)
        reason = ready.get("reason")
        if isinstance(reason, str) and reason and reason != "Pending":
            reasons[reason] += 1
            first.setdefault(reason, str(status.get("message") or ready.get("message") or ""))
    parts = [f"{_nodes(n)} {reason}: {first[reason]}" for reason, n in sorted(reasons.items())]
    return "; ".join(parts)


def _nodes(count: int) -> str:
    return f"{count} node" if count == 1 else f"{count} nodes"


def rate_and_eta(statuses: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, int]:
    """bytesPerSecond summed over the downloading copies, etaSeconds the longest of theirs."""
    rates: list[int | None] = []
    etas: list[int | None] = []
    for phase, status in statuses:
        if phase == names.PHASE_DOWNLOADING:
            copy_progress = section(status, "progress")
            rates.append(_count(copy_progress.get(progress.BYTES_PER_SECOND)))
            etas.append(_count(copy_progress.get(progress.ETA_SECONDS)))
    out: dict[str, int] = {}
    known = [r for r in rates if r is not None]
    if known:
        out[progress.BYTES_PER_SECOND] = sum(known)
    every = [e for e in etas if e is not None]
    if every and len(every) == len(etas):
        out[progress.ETA_SECONDS] = max(every)
    return out


def _count(value: Any) -> int | None:
    """A non-negative int from an agent's status, None when absent or malformed."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def aggregate(
    parent: Parent,
    spec: ModelCacheSpec,
    node_names: Sequence[str],
    demand_count: int,
    copies: Sequence[Copy],
    rollout: rolling.Rollout,
    now: datetime,
) -> Obj:
    """The cache's status from its copies' reports and this pass's rollout (planned once, by the caller)."""
    before = parent.before
    by_node = {copy.node: copy.status for copy in copies if copy.node is not None}
    counts: Counter[str] = Counter()
    failures: list[str] = []
    failure_reasons: set[str] = set()
    failed_copies: list[str] = []
    size = 0
    last_used = parse_time(before.get("lastUsedTime"))
    statuses = []
    for node in node_names:
        status = by_node.get(node, {})
        phase = node_phase(status)
        counts[phase] += 1
        statuses.append((phase, status))
        if phase == names.PHASE_FAILED:
            failures.append(_failure_text(node, status))
            failure_reasons.add(str(_ready_condition(status).get("reason") or ""))
            failed_copies.append(names.modelcachenode_name(parent.name, node))
        # Every copy is the same model: any node's size (or planned total) is each node's size.
        size = max(size, _int(status.get("sizeBytes")), _int(section(status, "progress").get("bytesTotal")))
        used = parse_time(status.get("lastUsedTime"))
        if used and (last_used is None or used > last_used):
            last_used = used
    size = size or _int(before.get("sizeBytes"))

    done = total = 0
    for phase, status in statuses:
        copy_progress = section(status, "progress")
        node_total = _int(copy_progress.get(progress.BYTES_TOTAL)) or size
        total += node_total
        if phase == names.PHASE_READY:
            done += node_total
        elif phase == names.PHASE_DOWNLOADING:
            done += min(_int(copy_progress.get(progress.BYTES_DONE)), node_total)

    ready, downloading, failed = (
        counts[names.PHASE_READY],
        counts[names.PHASE_DOWNLOADING],
        counts[names.PHASE_FAILED],
    )
    count = len(node_names)
    healthy = count - failed
    if failed and not healthy:
        phase = names.PHASE_FAILED
    elif healthy and ready == healthy:
        phase = names.PHASE_READY
    elif ready or downloading:
        phase = names.PHASE_DOWNLOADING
    elif healthy and counts[names.PHASE_EVICTED] == healthy:
        phase = names.PHASE_EVICTED
    else:
        phase = names.PHASE_PENDING

    out: Obj = {
        "observedGeneration": parent.generation,
        "phase": phase,
        "mode": names.MODE_NODE,
        "readyNodes": ready,
        "totalNodes": count,
        "downloadingNodes": downloading,
        "failedNodes": failed,
        "pendingNodes": count - ready - downloading - failed,
        "evictedNodes": counts[names.PHASE_EVICTED],
    }
    out.update(rolling.status_fields(rollout))
    if size:
        out["sizeBytes"] = size
    if total:
        timing = rate_and_eta(statuses) if phase == names.PHASE_DOWNLOADING else {}
        eta = timing.get(progress.ETA_SECONDS)
        out["progress"] = {
            progress.BYTES_DONE: done,
            progress.BYTES_TOTAL: total,
            **timing,
            progress.SUMMARY: progress.summary(done, total, size, eta, count),
        }
    if last_used:
        out["lastUsedTime"] = format_time(last_used)
    pod_starts = coldstart_summary.summarize(status for _, status in statuses)
    if pod_starts:
        out["podStarts"] = pod_starts
    reason, message = _ready_reason(
        spec, phase, out, failures, demand_count, counts[names.PHASE_EVICTED], _waiting(statuses)
    )
    if phase == names.PHASE_FAILED and failure_reasons == {names.REASON_SIGNATURE_INVALID}:
        reason = names.REASON_SIGNATURE_INVALID  # the model itself is refused, the same on every node
    gen = out["observedGeneration"]
    out["conditions"] = [condition(before, READY, phase == names.PHASE_READY, reason, message, now, gen)]
    if count:
        retry = f"kubectl -n {parent.namespace} delete modelcachenode {' '.join(failed_copies[:MAX_LISTED_FAILURES])}"
        out["conditions"].append(_degraded(before, failures, count, retry, now, gen))
    if size:
        out["conditions"].append(size_condition(before, spec, size, now, out["observedGeneration"]))
    if spec.warm_new_nodes:
        out["conditions"].append(_warm_condition(before, by_node, now, gen))
    if rollout.rolling or any(
        isinstance(c, dict) and c.get("type") == names.CONDITION_ROLLING
        for c in before.get("conditions") or ()
    ):  # only caches whose revision changed once carry it
        ok, why, text = rolling.rolling_condition(rollout, spec, count)
        out["conditions"].append(condition(before, names.CONDITION_ROLLING, ok, why, text, now, gen))
    return out


def _warm_condition(
    before: Mapping[str, Any], by_node: Mapping[str, Mapping[str, Any]], now: datetime, gen: int
) -> Obj:
    """warmNewNodes: False while some node took Pods before its copy was Ready (the taint's deadline passed)."""
    late = sorted(
        node
        for node, status in by_node.items()
        if section(status, "startupTaint").get("reason") == names.REASON_WARM_DEADLINE
        and node_phase(status) != names.PHASE_READY
    )
    if not late:
        message = "nodes joining with the startup taint take Pods only once this cache is on disk there"
        return condition(
            before, names.CONDITION_WARM_BEFORE_SCHEDULABLE, True, "NodesWaitForCache", message, now, gen
        )
    listed = ", ".join(late[:MAX_LISTED_FAILURES]) + (
        f" and {len(late) - MAX_LISTED_FAILURES} more" if len(late) > MAX_LISTED_FAILURES else ""
    )
    message = (
        f"{listed} took Pods before this cache was on disk there: the startup taint's deadline passed "
        "(nodeAgent.startupTaint.deadlineSeconds); see the Degraded condition for why those copies are not Ready"
    )
    return condition(
        before, names.CONDITION_WARM_BEFORE_SCHEDULABLE, False, names.REASON_WARM_DEADLINE, message, now, gen
    )


def _degraded(
    before: Mapping[str, Any], failures: list[str], count: int, retry: str, now: datetime, gen: int
) -> Obj:
    """True while some node failed: which ones and why, and how to retry at once."""
    if not failures:
        return condition(
            before, DEGRADED, False, "AllNodesHealthy", f"no failed copy on {_nodes(count)}", now, gen
        )
    listed = "; ".join(failures[:MAX_LISTED_FAILURES])
    more = len(failures) - MAX_LISTED_FAILURES
    extra = f"; and {more} more" if more > 0 else ""
    message = (
        f"{len(failures)} of {_nodes(count)} failed: {listed}{extra}; the node agents retry with backoff "
        f"(at most every 10 minutes); fix the cause, then retry at once with: {retry}"
    )
    return condition(before, DEGRADED, True, "NodeFailed", message, now, gen)


def size_condition(
    before: Mapping[str, Any], spec: ModelCacheSpec, size: int, now: datetime, gen: int
) -> Obj:
    """The source's real size against storage.size, both numbers stated.

    Node agents refuse a model larger than storage.size before writing (agent/jobs.py); a copy
    over it can only be one cached before that rule, still served, so the message says that."""
    if size > spec.size_bytes:
        message = (
            f"the model is {format_bytes(size)} ({size} bytes), more than storage.size {spec.size} "
            f"({spec.size_bytes} bytes); node agents refuse to download it, and copies cached before "
            "storage.size became a limit are still served; recreate the ModelCache with a storage.size "
            "of at least the model's size"
        )
        return condition(before, SIZE_WITHIN_REQUEST, False, "SizeExceedsRequest", message, now, gen)
    message = f"the model is {format_bytes(size)}, within storage.size {spec.size}"
    return condition(before, SIZE_WITHIN_REQUEST, True, "SizeWithinRequest", message, now, gen)


def _ready_reason(
    spec: ModelCacheSpec,
    phase: str,
    status: Obj,
    failures: list[str],
    demand: int,
    evicted: int,
    waiting: str,
) -> tuple[str, str]:
    ready, total = status["readyNodes"], status["totalNodes"]
    if total == 0:
        if spec.node_selector:
            return (
                "NoNodesMatch",
                f"no Node matches spec.nodeSelector {{{selector_text(spec.node_selector)}}}; "
                "label the nodes that should hold a copy (kubectl label node <name> "
                f"{selector_text(spec.node_selector)}) or change the selector",
            )
        return "NoNodesMatch", "the cluster has no schedulable Nodes yet; the cache waits for one"
    summary = status.get("progress", {}).get(progress.SUMMARY)
    tail = f" ({summary})" if summary else ""
    if phase == names.PHASE_FAILED:
        listed = "; ".join(failures[:MAX_LISTED_FAILURES])
        more = len(failures) - MAX_LISTED_FAILURES
        extra = f"; and {more} more" if more > 0 else ""
        return (
            "NodeFailed",
            f"{len(failures)} of {_nodes(total)} failed: {listed}{extra}; fix the cause "
            "and delete the failed ModelCacheNode to retry",
        )
    demand_note = f", {demand} of them added for scheduled Pods" if demand else ""
    failed_note = f", {len(failures)} failed (see the Degraded condition)" if failures else ""
    if phase == names.PHASE_READY:
        reason = "AllNodesReady" if not failures else "ReadyOnHealthyNodes"
        return reason, f"model ready on {ready} of {_nodes(total)}{demand_note}{failed_note}"
    if phase == names.PHASE_EVICTED:
        return (
            "Evicted",
            f"every copy ({_nodes(evicted)}) was evicted as unused{failed_note}; "
            "a Pod that mounts the cache brings its node's copy back",
        )
    if phase == names.PHASE_DOWNLOADING:
        return (
            "Downloading",
            f"model ready on {ready} of {_nodes(total)}, {status['downloadingNodes']} downloading"
            f"{f', {evicted} evicted until used again' if evicted else ''}{failed_note}{tail}",
        )
    evicted_note = f", {evicted} evicted until used again" if evicted else ""
    if waiting:
        return "Waiting", f"waiting on {_nodes(total)}{demand_note}: {waiting}{evicted_note}{failed_note}"
    return (
        "Pending",
        f"waiting for the node agents on {_nodes(total)} to start the download{demand_note}{evicted_note}{failed_note}",
    )
