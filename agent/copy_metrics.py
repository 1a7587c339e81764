"""`praesto_agent_copies` and `praesto_agent_copy_bytes_*`: this node's copies, read at scrape time.

The alerts on a Failed copy, a stalled download and a node out of room (charts/praesto/files/alerts.yaml)
need each copy's phase, Ready reason and byte progress. They are read from the agent's shared view
(`Copies`: the ModelCacheNodes as the watch and the agent's own status writes left them) on each
scrape, not set as copies change: a copy that is gone leaves no stale series, and no collaborator has
to remember a gauge. One series per copy in `praesto_agent_copies` (value 1, its current phase and
reason), so `sum by (phase)` counts copies and a phase change shows as one series ending, another
starting.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeGuard

from praesto.agent import status as st
from praesto.agent.copies import Copies, Obj, cache_of
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from praesto import names

COPY_LABELS = ("namespace", "model_cache")  # as praesto_scrub_mismatches and praesto_pod_model_* label them


class CopyCollector(Collector):
    """Registered on the agent's registry by `Agent` (node_agent.py), beside `AgentMetrics`."""

    def __init__(self, copies: Copies) -> None:
        self.copies = copies

    def describe(self) -> Iterator[Metric]:
        """The families without samples: registering reads no copy (nor takes the lock)."""
        return iter(_families())

    def collect(self) -> Iterator[Metric]:
        with self.copies.lock:
            objects = list(self.copies.objects.values())
        phases, done, total = _families()
        for obj in objects:
            labels = [str(obj["metadata"].get("namespace", "")), cache_of(obj)]
            status: dict[str, Any] = obj.get("status") or {}
            phase = str(status.get("phase") or names.PHASE_PENDING)  # the agent has not written it yet
            phases.add_metric([*labels, phase, st.ready_reason(status)], 1)
            progress = _progress(obj)
            if progress is not None:
                done.add_metric(labels, progress[0])
                total.add_metric(labels, progress[1])
        yield from (phases, done, total)


def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
    return (
        GaugeMetricFamily(
            "praesto_agent_copies",
            "This node's copies (ModelCacheNodes), 1 per copy, by phase and the reason of its Ready "
            "condition",
            labels=[*COPY_LABELS, "phase", "reason"],
        ),
        GaugeMetricFamily(
            "praesto_agent_copy_bytes_done",
            "Bytes of a copy's download done (status.progress.bytesDone); rises while it downloads, "
            "starts again from 0 with the next download",
            labels=list(COPY_LABELS),
        ),
        GaugeMetricFamily(
            "praesto_agent_copy_bytes_total",
            "Bytes of a copy's download in all (status.progress.bytesTotal)",
            labels=list(COPY_LABELS),
        ),
    )


def _progress(obj: Obj) -> tuple[int, int] | None:
    progress = (obj.get("status") or {}).get("progress")
    if not isinstance(progress, dict):
        return None
    done, total = progress.get("bytesDone"), progress.get("bytesTotal")
    return (done, total) if _is_count(done) and _is_count(total) else None


def _is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
