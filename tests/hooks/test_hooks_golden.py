"""Golden requests in, expected responses out, for every scenario; plus the rules they show."""

from __future__ import annotations

from typing import Any

import pytest
from praesto.hooks import hook_protocol
from praesto.hooks.modelcache import HOOKS

from praesto import names
from testkit.hook_objects import COMMIT, NOW
from tests.hooks import golden
from tests.hooks.scenarios import SCENARIOS


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_golden(name: str) -> None:
    doc = golden.load(name)
    hook, build = SCENARIOS[name]
    assert doc["hook"] == hook
    assert doc["request"] == build(), "scenario request changed: regenerate the golden file and review it"
    response = HOOKS[hook](doc["request"], golden.CONFIG, NOW)
    assert hook_protocol.check_response(hook, response) == []
    assert response == doc["response"]


def _response(name: str) -> dict[str, Any]:
    return golden.load(name)["response"]  # type: ignore[no-any-return]


def _kinds(response: dict[str, Any]) -> list[str]:
    return [c["kind"] for c in response["children"]]


def _status(name: str) -> dict[str, Any]:
    return _response(name)["status"]  # type: ignore[no-any-return]


def _ready_condition(name: str) -> dict[str, Any]:
    (cond,) = [c for c in _status(name)["conditions"] if c["type"] == "Ready"]
    assert cond["type"] == "Ready"
    return cond  # type: ignore[no-any-return]


def test_local_nodes_follow_selector_and_demand() -> None:
    assert [c["spec"]["nodeName"] for c in _response("local-seed-first-sync")["children"]] == [
        "node-a",
        "node-b",
    ]
    assert [c["spec"]["nodeName"] for c in _response("local-node-added")["children"]] == [
        "node-a",
        "node-b",
        "node-d",
    ]
    assert [c["spec"]["nodeName"] for c in _response("local-node-removed")["children"]] == ["node-a"]
    demand = _response("local-demand-node")
    nodes = [c["spec"]["nodeName"] for c in demand["children"]]
    assert "node-c" in nodes and "node-z" not in nodes and len(nodes) == 4
    for child in demand["children"]:
        assert len(child["metadata"]["name"]) <= 63
        assert names.is_label_value(child["metadata"]["labels"][names.LABEL_NODE])


@pytest.mark.parametrize(
    ("name", "phase", "ready", "total"),
    [
        ("local-seed-first-sync", "Pending", 0, 2),
        ("local-pending", "Pending", 0, 2),
        ("local-downloading", "Downloading", 0, 2),
        ("local-ready-pins-revision", "Ready", 2, 2),
        ("local-one-node-failed", "Ready", 1, 2),
        ("local-all-nodes-failed", "Failed", 0, 2),
        ("local-all-evicted", "Evicted", 0, 2),
        ("local-waiting-for-secret", "Pending", 0, 2),
        ("local-evicted-counts-pending", "Downloading", 1, 2),
        ("local-no-nodes-match", "Pending", 0, 0),
        ("pvc-seed-first-sync", "Pending", 0, 1),
        ("pvc-downloading", "Downloading", 0, 1),
        ("pvc-ready", "Ready", 1, 1),
        ("pvc-failed", "Failed", 0, 1),
        ("pvc-evicted", "Evicted", 0, 1),
        ("pvc-rehydrate-on-new-consumer", "Pending", 0, 1),
        ("invalid-spec-keeps-children", "Failed", None, None),
    ],
)
def test_phase_transitions(name: str, phase: str, ready: int | None, total: int | None) -> None:
    status = _status(name)
    assert status["phase"] == phase
    assert status.get("readyNodes") == ready and status.get("totalNodes") == total
    assert (_ready_condition(name)["status"] == "True") == (phase == "Ready")


def test_conditions_say_why() -> None:
    assert _ready_condition("local-no-nodes-match")["reason"] == "NoNodesMatch"
    assert "praesto.io/cache-node=true" in _ready_condition("local-no-nodes-match")["message"]
    failed = _ready_condition("local-all-nodes-failed")
    assert failed["reason"] == "NodeFailed" and "node-b: InsufficientDiskSpace" in failed["message"]
    # One failed node of two: Ready where the copy is, Degraded naming the failure and the retry.
    one = _status("local-one-node-failed")
    assert one["phase"] == "Ready" and _ready_condition("local-one-node-failed")["status"] == "True"
    degraded = next(c for c in one["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and "node-b: InsufficientDiskSpace" in degraded["message"]
    assert "kubectl -n default delete modelcachenode tinyllama-node-b-" in degraded["message"]
    waiting = _ready_condition("local-waiting-for-secret")
    assert (
        waiting["reason"] == "Waiting"
        and "2 nodes WaitingForSecret: Secret default/hf-token" in waiting["message"]
    )
    assert _ready_condition("local-all-evicted")["reason"] == "Evicted"
    job_failed = _ready_condition("pvc-failed")
    assert job_failed["reason"] == "BackoffLimitExceeded" and "backoff limit" in job_failed["message"]
    invalid = _ready_condition("invalid-spec-keeps-children")
    assert invalid["reason"] == "InvalidSpec"
    assert "spec.storage.size" in invalid["message"] and "spec.source.huggingface.repo" in invalid["message"]


def test_progress_and_revision() -> None:
    status = _status("local-downloading")
    assert status["progress"]["bytesDone"] == 900_000_000
    assert status["progress"]["summary"].startswith("20% of ")
    assert status["resolvedRevision"] == COMMIT
    ready = _response("local-ready-pins-revision")
    assert {c["spec"]["source"]["revision"] for c in ready["children"]} == {COMMIT}
    assert ready["status"]["lastUsedTime"] == "2026-12-01T11:30:00Z"


def test_token_secret_grant_is_one_secret_to_the_credentials_broker_not_the_agents() -> None:
    """Bound to praesto-hooks' account: its broker hands the Secret to the agent of a node whose copy
    needs it, only (hooks/broker.py); the agents' ServiceAccount reads no tenant Secret."""
    children = _response("local-token-secret")["children"]
    role = next(c for c in children if c["kind"] == "Role")
    binding = next(c for c in children if c["kind"] == "RoleBinding")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["hf-token"], "verbs": ["get"]}
    ]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "praesto-hooks", "namespace": "praesto-system"}
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    pvc_children = _response("pvc-token-and-overrides")["children"]
    # PVC mode: the kubelet reads the Secret for the Job's Pod; the one Role is the Job's live progress
    assert _kinds(_response("pvc-token-and-overrides")) == [
        "PersistentVolumeClaim",
        "Job",
        "Role",
        "RoleBinding",
    ]
    (pvc_role,) = (c for c in pvc_children if c["kind"] == "Role")
    assert [r["resources"] for r in pvc_role["rules"]] == [["jobs"]]
    container = pvc_children[1]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "HF_TOKEN"}}} in (
        container["env"]
    )
    assert container["image"] == "registry.example/praesto:custom"


def test_pvc_eviction_and_rehydration() -> None:
    running = ["PersistentVolumeClaim", "Job", "Role", "RoleBinding"]  # the Role: live progress
    assert _kinds(_response("pvc-seed-first-sync")) == running
    before = _response("pvc-unused-before-expiry")
    assert before["resyncAfterSeconds"] == 3600.0  # last used 11:00, TTL 2h, now 12:00
    evicted = _response("pvc-evicted")
    assert evicted["children"] == [] and "resyncAfterSeconds" not in evicted
    assert _kinds(_response("pvc-rehydrate-on-new-consumer")) == running
    assert _status("pvc-in-use-advances-last-used")["lastUsedTime"] == "2026-12-01T12:00:00Z"
    assert _status("pvc-in-use-last-used-quantized")["lastUsedTime"] == "2026-12-01T11:59:30Z"


def test_finalize_waits_for_every_node_copy() -> None:
    assert _response("finalize-waiting-for-node-agents")["finalized"] is False
    assert _response("finalize-done")["finalized"] is True
    assert _response("finalize-done")["children"] == []


def test_invalid_spec_keeps_observed_children_unchanged() -> None:
    doc = golden.load("invalid-spec-keeps-children")
    (kept,) = doc["response"]["children"]
    (observed,) = doc["request"]["children"][hook_protocol.MODELCACHENODE].values()
    assert kept["spec"] == observed["spec"] and kept["metadata"]["name"] == observed["metadata"]["name"]
    assert "status" not in kept and "resourceVersion" not in kept["metadata"]


def test_status_is_stable_across_repeated_syncs() -> None:
    """The same observed state twice gives the same status: no resync loop."""
    for name, (hook, build) in SCENARIOS.items():
        if hook != "sync":
            continue
        first = HOOKS[hook](build(), golden.CONFIG, NOW)
        request = build()
        request["parent"]["status"] = first["status"]
        later = NOW.replace(minute=NOW.minute + 0, second=20)
        second = HOOKS[hook](request, golden.CONFIG, later)
        assert second["status"] == first["status"], name
