"""The origin budget's pure slot logic: which Lease to take, expiry, conflicts, Retry-After, pacing."""

from __future__ import annotations

from typing import Any

import pytest
from praesto.agent.budget import slots
from praesto.agent.budget.slots import GLOBAL, Cooldown, Pace

from praesto import names

NOW = 1_800_000_000.0


def lease(name: str, holder: str | None, renewed: float | None = NOW, duration: int = 30) -> dict[str, Any]:
    spec: dict[str, Any] = {"leaseDurationSeconds": duration}
    if holder is not None:
        spec["holderIdentity"] = holder
    if renewed is not None:
        spec["renewTime"] = slots.rfc3339(renewed)
    return {"metadata": {"name": name, "resourceVersion": "7"}, "spec": spec}


def test_slot_names_per_group_never_collide() -> None:
    assert slots.slot_names(GLOBAL, 2) == ["praesto-origin-0", "praesto-origin-1"]
    host = slots.slot_names("huggingface.co", 2)
    assert host[0].startswith("praesto-origin-host-") and host[0].endswith("-0")
    assert slots.host_lease_name("huggingface.co") == host[0][: -len("-0")]
    assert slots.slot_names("HuggingFace.co", 1) == host[:1]  # host names are case-insensitive
    assert set(host).isdisjoint(slots.slot_names("cdn-lfs.hf.co", 2))
    assert all(len(n) <= 63 and names.is_dns_label(n) for n in host)


def test_a_node_keeps_the_slot_it_holds() -> None:
    group = {"s-0": lease("s-0", "a"), "s-1": lease("s-1", "b"), "s-2": None}
    assert slots.choose(group, "b", NOW) == "s-1"


def test_free_expired_and_missing_slots_can_be_taken_held_ones_not() -> None:
    held = {"s-0": lease("s-0", "a"), "s-1": lease("s-1", "b")}
    assert slots.choose(held, "c", NOW) is None
    assert slots.holders(held, NOW) == ["a", "b"]
    released = {**held, "s-1": lease("s-1", None, renewed=None)}
    assert slots.choose(released, "c", NOW) == "s-1"
    expired = {**held, "s-1": lease("s-1", "b", renewed=NOW - 31)}  # b stopped renewing: crashed
    assert slots.choose(expired, "c", NOW) == "s-1"
    assert slots.holders(expired, NOW) == ["a"]
    missing = {**held, "s-1": None}  # not created yet
    assert slots.choose(missing, "c", NOW) == "s-1"


def test_waiting_nodes_spread_over_free_slots() -> None:
    free = {f"s-{i}": None for i in range(4)}
    chosen = {slots.choose(free, f"node-{n}", NOW) for n in range(12)}
    assert len(chosen) > 1  # not every node conflicts on the same first slot


def test_taking_keeps_the_resource_version_so_a_concurrent_taker_conflicts() -> None:
    old = lease("s-0", "b", renewed=NOW - 60)
    body = slots.taken(old, "s-0", "c", NOW, 30)
    assert body["metadata"]["resourceVersion"] == "7"  # the update is refused if someone wrote since
    spec = body["spec"]
    assert (spec["holderIdentity"], spec["leaseDurationSeconds"]) == ("c", 30)
    assert spec["acquireTime"] == spec["renewTime"] == slots.rfc3339(NOW)
    assert spec["leaseTransitions"] == 1
    assert old["spec"]["holderIdentity"] == "b"  # the Lease read is not modified


def test_renewing_moves_only_the_renew_time() -> None:
    mine = slots.taken(None, "s-0", "c", NOW, 30)
    assert mine["metadata"]["labels"] == {names.LABEL_ORIGIN_BUDGET: "slot"}
    assert "resourceVersion" not in mine["metadata"]  # created, not updated
    mine["metadata"]["resourceVersion"] = "8"
    renewed = slots.taken(mine, "s-0", "c", NOW + 10, 30)
    assert renewed["spec"]["acquireTime"] == slots.rfc3339(NOW)
    assert renewed["spec"]["renewTime"] == slots.rfc3339(NOW + 10)
    assert renewed["spec"]["leaseTransitions"] == 0
    assert slots.expires_at(renewed) == pytest.approx(NOW + 40)


def test_released_slot_has_no_holder_and_is_free() -> None:
    body = slots.released(lease("s-0", "c"))
    assert "holderIdentity" not in body["spec"] and body["metadata"]["resourceVersion"] == "7"
    assert slots.is_free(body, NOW)


def test_retry_after_only_moves_later() -> None:
    name = slots.host_lease_name("hub")
    first = slots.with_cooldown(None, name, "hub", Cooldown(NOW + 5, "a"))
    assert first is not None
    annotations = first["metadata"]["annotations"]
    assert annotations[names.ANNOTATION_ORIGIN_HOST] == "hub"
    assert annotations[names.ANNOTATION_RETRY_AFTER_BY] == "a"
    assert slots.cooldown_of(first) == Cooldown(pytest.approx(NOW + 5), "a")  # type: ignore[arg-type]
    assert slots.with_cooldown(first, name, "hub", Cooldown(NOW + 3, "b")) is None  # already waits longer
    later = slots.with_cooldown(first, name, "hub", Cooldown(NOW + 9, "b"))
    assert later is not None and slots.cooldown_of(later) == Cooldown(pytest.approx(NOW + 9), "b")  # type: ignore[arg-type]
    assert slots.cooldown_of(None) is None
    assert (
        slots.cooldown_of({"metadata": {"annotations": {names.ANNOTATION_RETRY_AFTER_UNTIL: "soon"}}}) is None
    )


def test_pace_holds_a_node_to_its_share() -> None:
    now = [0.0]
    pace = Pace(slots.share(4_000, 2), clock=lambda: now[0])  # 4000 B/s for 2 nodes: 2000 each
    assert pace.rate == 2_000
    assert pace.delay(1_000) == pytest.approx(0.0)  # one second of burst is allowed
    assert pace.delay(2_000) == pytest.approx(0.5)
    now[0] = 10.0  # idle for long: the burst allowance is one second, not ten
    assert pace.delay(6_000) == pytest.approx(2.0)
    assert Pace(slots.share(0, 2)).delay(10**9) == 0.0


def test_waiting_message_names_limit_holders_and_chart_value() -> None:
    msg = slots.describe(GLOBAL, 2, ["node-a", "node-b"], "originBudget.maxNodes")
    assert "2 nodes may pull from the origin at once" in msg
    assert "node-a, node-b hold it" in msg and "originBudget.maxNodes" in msg
    one = slots.describe("huggingface.co", 1, ["node-c"], "originBudget.perHost")
    assert "1 node may pull from huggingface.co" in one and "node-c holds it" in one
