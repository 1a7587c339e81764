"""Warm before schedulable, the pure decision (agent/startup_taint.py); the real-tier test is tests/cluster/test_warm_nodes.py."""

from __future__ import annotations

from typing import Any

import pytest
from praesto.agent.startup_taint import (
    REASON_DEADLINE,
    REASON_WARM,
    decide,
    node_age_seconds,
    warm_required,
    without_taint,
)

from praesto.spec import InvalidSpec, parse_spec

KEY = "praesto.io/warming"


def cache(name: str, namespace: str = "team-a", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"source": {"huggingface": {"repo": "org/m"}}, "storage": {"size": "1Gi"}, **spec}
    return {"metadata": {"name": name, "namespace": namespace}, "spec": body}


def test_only_local_warm_caches_selecting_the_node_are_required() -> None:
    caches = [
        cache("gpu-warm", warmNewNodes=True, nodeSelector={"pool": "gpu"}),
        cache("everywhere", "team-b", warmNewNodes=True),
        cache("cold", nodeSelector={"pool": "gpu"}),
        cache("cpu-warm", warmNewNodes=True, nodeSelector={"pool": "cpu"}),
        cache("shared", warmNewNodes=True, storage={"size": "1Gi", "storageClassName": "nfs"}),
        cache("broken", warmNewNodes=True, storage={"size": "-1"}),
        {
            **cache("leaving", warmNewNodes=True),
            "metadata": {"name": "leaving", "namespace": "t", "deletionTimestamp": "x"},
        },
    ]
    assert warm_required(caches, {"pool": "gpu"}, ("team-a", "team-b", "t")) == [
        ("team-a", "gpu-warm"),
        ("team-b", "everywhere"),
    ]


def test_only_listed_namespaces_and_caches_that_can_complete_hold_a_node() -> None:
    """#21 item 8: not any tenant's cache; never a Failed one or one the sync hook refused."""
    failed = {**cache("failed", warmNewNodes=True), "status": {"phase": "Failed"}}
    refused = {
        **cache("over-quota", warmNewNodes=True),
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "Ready", "status": "False", "reason": "QuotaExceeded"}],
        },
    }
    pending = {**cache("pending", warmNewNodes=True), "status": {"phase": "Pending"}}
    caches = [
        cache("listed", warmNewNodes=True),
        cache("tenant", "team-b", warmNewNodes=True),
        failed,
        refused,
        pending,
    ]
    assert warm_required(caches, {}, ("team-a",)) == [("team-a", "listed"), ("team-a", "pending")]
    assert warm_required(caches, {}, ()) == []  # none listed: no cache holds a new node


def test_the_taint_is_lifted_when_everything_is_on_disk_or_at_the_deadline() -> None:
    required = [("a", "one"), ("b", "two")]
    on_disk = {("a", "one")}
    waiting = decide(required, lambda ns, n: (ns, n) in on_disk, age_seconds=10, deadline_seconds=60)
    assert not waiting.lift and waiting.waiting_for == (("b", "two"),)
    late = decide(required, lambda ns, n: (ns, n) in on_disk, age_seconds=60, deadline_seconds=60)
    assert late.lift and late.reason == REASON_DEADLINE and late.waiting_for == (("b", "two"),)
    warm = decide(required, lambda ns, n: True, age_seconds=1, deadline_seconds=60)
    assert warm.lift and warm.reason == REASON_WARM and warm.waiting_for == ()
    assert decide([], lambda ns, n: False, 0, 60).lift  # nothing to wait for: lift at once


def test_only_the_startup_taint_is_removed() -> None:
    node = {
        "spec": {"taints": [{"key": KEY, "effect": "NoSchedule"}, {"key": "gpu", "effect": "NoSchedule"}]}
    }
    assert without_taint(node, KEY) == [{"key": "gpu", "effect": "NoSchedule"}]
    assert (
        node_age_seconds({"metadata": {"creationTimestamp": "2026-12-03T10:00:00Z"}}, 1796292000.0 + 30) == 30
    )


def test_warm_new_nodes_must_be_a_boolean() -> None:
    with pytest.raises(InvalidSpec, match=r"spec.warmNewNodes: Invalid value: 'yes': must be true or false"):
        parse_spec(
            {"source": {"huggingface": {"repo": "org/m"}}, "storage": {"size": "1Gi"}, "warmNewNodes": "yes"}
        )
    assert parse_spec(
        {"source": {"huggingface": {"repo": "org/m"}}, "storage": {"size": "1Gi"}, "warmNewNodes": True}
    ).warm_new_nodes
