"""The agent's pod-start reports: the status summary it keeps, what the Pod's Event says, and the copy's bytes."""

from __future__ import annotations

import json
from pathlib import Path

from praesto.agent.coldstart_reporter import (
    REASON_HIT,
    REASON_MISS,
    RECENT,
    copy_bytes,
    event_for,
    record_copy,
    updated_summary,
)
from praesto.agent.download.api import Plan, Result

from praesto import coldstart_record, names, store
from praesto.spec import Source

UID = "0b6a2d4e-1111-2222-3333-444455556666"


def start(hit: bool, wait: float, first: float = 1_800_000_000.0) -> coldstart_record.PodStart:
    return coldstart_record.PodStart(UID, "server-0", "team-a", "llm", first, hit, first + wait)


def test_summary_counts_and_keeps_the_latest_waits() -> None:
    summary = updated_summary(None, start(False, 41.25))
    assert summary == {
        "hits": 0,
        "misses": 1,
        "recentWaitSeconds": [41.25],
        "lastPodStartTime": "2027-01-15T08:00:41Z",
    }
    for i in range(RECENT + 5):
        summary = updated_summary(summary, start(True, i / 1000))
    assert (summary["hits"], summary["misses"]) == (RECENT + 5, 1)
    assert summary["recentWaitSeconds"] == [i / 1000 for i in range(5, RECENT + 5)]
    # a status someone else mangled is counted from what is sound in it
    assert updated_summary({"hits": "x", "recentWaitSeconds": [None, 2]}, start(True, 0.5))["hits"] == 1


def test_events_say_hit_or_miss_the_wait_and_where_the_bytes_came_from() -> None:
    reason, message = event_for(start(True, 0.012), "node-a", None)
    assert reason == REASON_HIT
    assert message == (
        "model cache team-a/llm was Ready on node node-a at the Pod's first mount attempt: mounted in 0.01s"
    )
    reason, message = event_for(
        start(False, 41.25), "node-a", {"source": 3 << 30, "peer": 1 << 30, "dedup": 0}
    )
    assert reason == REASON_MISS
    assert message == (
        "model cache team-a/llm was not on node node-a at the Pod's first mount attempt: the Pod waited "
        "41.2s for it; the copy took 3.0 GiB from the origin, 1.0 GiB from peer nodes and 0 B from "
        "identical files already on the node (dedup)"
    )
    assert "is unknown" in event_for(start(False, 3), "node-a", None)[1]


def test_copy_bytes_belong_to_the_copy_on_disk_only(tmp_path: Path) -> None:
    layout = store.StoreLayout(tmp_path)
    cache = layout.cache_dir("team-a", "llm")
    cache.mkdir(parents=True)
    (cache / names.MANIFEST_FILE).write_text(json.dumps({"completedAt": "2026-12-01T10:00:00Z"}))
    plan = Plan(Source("hf", "org/llm", "main"), "a" * 40, ())
    result = Result(plan, bytes_from_origin=700, bytes_from_peers=200, bytes_deduplicated=100, seconds=1.5)
    assert copy_bytes(layout, "team-a", "llm") is None  # pre-baked: never downloaded here
    record_copy(layout, "team-a", "llm", result)
    assert copy_bytes(layout, "team-a", "llm") == {"source": 700, "peer": 200, "dedup": 100}
    # the copy was replaced (evicted, downloaded again elsewhere or pre-baked): the record is stale
    (cache / names.MANIFEST_FILE).write_text(json.dumps({"completedAt": "2026-12-02T10:00:00Z"}))
    assert copy_bytes(layout, "team-a", "llm") is None
