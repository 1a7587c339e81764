"""ModelCache status.podStarts from the copies' reports, spec.prewarm to the copies, and their CRD schema."""

from __future__ import annotations

from typing import Any

import pytest
from praesto.agent import coldstart_reporter
from praesto.hooks import coldstart_summary
from praesto.hooks.modelcache import HOOKS

from praesto.spec import InvalidSpec, parse_spec
from testkit.hook_objects import NOW, SEED_LOCAL_SPEC, cache_node, mcn, modelcache, node_status, sync_request
from tests.hooks import golden
from tests.hooks.schemas import crd, crd_errors


def starts(hits: int, misses: int, *waits: Any) -> dict[str, Any]:
    return {"hits": hits, "misses": misses, "recentWaitSeconds": list(waits)}


def test_counts_add_up_and_percentiles_come_from_every_nodes_recent_waits() -> None:
    summary = coldstart_summary.summarize(
        [
            {"podStarts": starts(3, 1, 0.01, 0.02, 0.01, 41.5)},
            {"podStarts": starts(0, 2, 12.0, 30.25)},
            {"phase": "Ready"},  # a copy no Pod used yet
        ]
    )
    # six waits: nearest rank p50 = 3rd smallest, p95 = 6th
    assert summary == {"hits": 3, "misses": 3, "waitSeconds": {"p50": 0.02, "p95": 41.5, "samples": 6}}


def test_no_pod_yet_means_no_summary_and_junk_is_ignored() -> None:
    assert coldstart_summary.summarize([{}, {"podStarts": starts(0, 0)}]) is None
    junk = {"hits": True, "misses": -4, "recentWaitSeconds": ["3", None, -1, True, float("inf"), 2]}
    assert coldstart_summary.summarize([{"podStarts": junk}, {"podStarts": "nope"}]) is None
    assert coldstart_summary.summarize([{"podStarts": {**junk, "misses": 1}}]) == {
        "hits": 0,
        "misses": 1,
        "waitSeconds": {"p50": 2.0, "p95": 2.0, "samples": 1},
    }


@pytest.mark.parametrize(
    ("values", "p50", "p95"),
    [([5.0], 5.0, 5.0), ([1.0, 2.0], 1.0, 2.0), ([float(i) for i in range(1, 101)], 50.0, 95.0)],
)
def test_nearest_rank(values: list[float], p50: float, p95: float) -> None:
    assert (coldstart_summary.percentile(values, 50), coldstart_summary.percentile(values, 95)) == (p50, p95)


def test_sync_hook_reports_pod_starts_and_carries_prewarm_to_each_copy() -> None:
    parent = modelcache(spec={**SEED_LOCAL_SPEC, "prewarm": True})
    children = [
        mcn("tinyllama", "node-a", node_status("Ready", podStarts=starts(1, 0, 0.01))),
        mcn("tinyllama", "node-b", node_status("Ready", podStarts=starts(0, 1, 20.0))),
    ]
    request = sync_request(parent, nodes=[cache_node("node-a"), cache_node("node-b")], children=children)
    response = HOOKS["sync"](request, golden.CONFIG, NOW)
    assert response["status"]["podStarts"] == {
        "hits": 1,
        "misses": 1,
        "waitSeconds": {"p50": 0.01, "p95": 20.0, "samples": 2},
    }
    assert [c["spec"]["prewarm"] for c in response["children"]] == [True, True]
    for child in response["children"]:
        assert crd_errors(child) == []
    assert crd_errors({**parent, "status": response["status"]}) == []
    without = HOOKS["sync"](sync_request(modelcache(), nodes=[cache_node("node-a")]), golden.CONFIG, NOW)
    assert "prewarm" not in without["children"][0]["spec"] and "podStarts" not in without["status"]


def test_prewarm_must_be_a_boolean_named_in_the_error() -> None:
    assert parse_spec({**SEED_LOCAL_SPEC, "prewarm": True}).prewarm is True
    assert parse_spec(SEED_LOCAL_SPEC).prewarm is False
    with pytest.raises(InvalidSpec) as err:
        parse_spec({**SEED_LOCAL_SPEC, "prewarm": "yes"})
    assert "spec.prewarm: Invalid value: 'yes': must be true or false" in str(err.value)


def _props(kind: str, *path: str) -> dict[str, Any]:
    node = crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for key in path:
        node = node["properties"][key]
    return node  # type: ignore[no-any-return]


def test_crds_describe_the_new_fields_and_agree_with_the_agent() -> None:
    assert _props("ModelCache", "spec", "prewarm")["type"] == "boolean"
    assert _props("ModelCacheNode", "spec", "prewarm")["type"] == "boolean"
    for kind, fields in (
        ("ModelCache", ("hits", "misses", "waitSeconds")),
        ("ModelCacheNode", ("hits", "misses", "recentWaitSeconds", "lastPodStartTime")),
    ):
        pod_starts = _props(kind, "status", "podStarts")
        assert pod_starts["description"]
        assert set(pod_starts["properties"]) == set(fields)
    assert _props("ModelCache", "spec", "prewarm")["description"]
    recent = _props("ModelCacheNode", "status", "podStarts", "recentWaitSeconds")
    assert recent["maxItems"] == coldstart_reporter.RECENT
