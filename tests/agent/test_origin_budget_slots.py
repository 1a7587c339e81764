"""The origin budget's pure logic: queues of claims, bounds on what others wrote, Retry-After, pacing."""

from __future__ import annotations

from typing import Any

import pytest
from praesto.agent.budget import origin_budget, slots
from praesto.agent.budget.slots import GLOBAL, Cooldown, Pace
from praesto.agent.download.api import Options, Plan

from praesto import names
from praesto.spec import Source

NOW = 1_800_000_000.0


def lease(
    name: str, holder: str | None, renewed: float | None = NOW, duration: int = 30, rv: str = "7"
) -> dict[str, Any]:
    spec: dict[str, Any] = {"leaseDurationSeconds": duration}
    if holder is not None:
        spec["holderIdentity"] = holder
    if renewed is not None:
        spec["renewTime"] = slots.rfc3339(renewed)
    return {"metadata": {"name": name, "resourceVersion": rv}, "spec": spec}


def claim(
    node: str, rv: int, group: str = GLOBAL, ns: str = "team-a", pulling: str | None = None, **kwargs: Any
) -> dict[str, Any]:
    """A live claim of `node` made at resourceVersion `rv`, for namespace `ns`; `pulling`: its mark."""
    body = lease(slots.claim_name(group, node), node, rv=str(rv), **kwargs)
    body["metadata"]["annotations"] = {names.ANNOTATION_ORIGIN_NAMESPACE: ns}
    if pulling is not None:
        body["metadata"]["annotations"][names.ANNOTATION_PULLING_SINCE] = pulling
    return body


def by_name(*leases: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {str(o["metadata"]["name"]): o for o in leases}


def test_claim_names_name_the_node_and_groups_never_collide() -> None:
    assert slots.claim_name(GLOBAL, "node-a") == "praesto-origin-all.node-a"
    host = slots.claim_name("huggingface.co", "node-a")
    assert host.endswith(".node-a") and host.split(".", 1)[0].startswith("praesto-origin-h")
    assert slots.claim_name("HuggingFace.co", "node-a") == host  # host names are case-insensitive
    assert slots.claim_name("cdn-lfs.hf.co", "node-a") != host
    assert "." not in slots.host_lease_name("huggingface.co")  # never taken for a claim
    assert slots.claim_name_fits("n" * 200) and not slots.claim_name_fits("n" * 230)


def test_the_first_marks_by_the_api_servers_order_pull() -> None:
    """Safety: whatever the turns, only the first `count` marking writes pull."""
    leases = by_name(
        claim("late", 30, pulling="new"), claim("early", 10, pulling="4"), claim("middle", 20, pulling="6")
    )
    assert slots.holders(leases, GLOBAL, 2, NOW, 30) == ["early", "middle"]  # "late" marked last: it waits
    # other groups' claims and host Leases are not in this queue
    other = claim("other", 1, group="huggingface.co", pulling="1")
    assert slots.holders(by_name(other, claim("early", 10, pulling="4")), GLOBAL, 1, NOW, 30) == ["early"]


def test_turns_go_first_come_first_within_a_namespace() -> None:
    leases = by_name(claim("c", 30), claim("a", 10), claim("b", 20), claim("held", 5, pulling="5"))
    assert slots.next_up(leases, GLOBAL, 3, NOW, 30) == ["a", "b"]
    renewed = claim("c", 99)  # a renewed claim keeps its place: its claiming write, recorded once
    renewed["metadata"]["annotations"][names.ANNOTATION_CLAIMED_AT] = "1"
    assert slots.next_up(by_name(renewed, claim("a", 10)), GLOBAL, 1, NOW, 30) == ["c"]
    assert slots.next_up(leases, GLOBAL, 1, NOW, 30) == []  # no free place


def test_the_namespace_pulling_least_goes_first_and_one_over_its_share_yields() -> None:
    """#21 item 7: each namespace gets a fair share of maxNodes when others wait."""
    busy = [claim(f"busy-{i}", i, ns="team-a", pulling=str(i)) for i in range(1, 4)]
    waiting = [claim("a-next", 10, ns="team-a"), claim("b-first", 20, ns="team-b")]
    leases = by_name(*busy[:2], *waiting)
    assert slots.next_up(leases, GLOBAL, 3, NOW, 30) == ["b-first"]  # team-b pulls nothing yet
    full = by_name(*busy, *waiting)  # team-a pulls all 3 places while team-b waits: share is 3 // 2 = 1
    assert [n for n in ("busy-1", "busy-2", "busy-3") if slots.should_yield(full, GLOBAL, 3, n, NOW, 30)] == [
        "busy-3"
    ]  # its latest place goes back first, one at a time
    alone = by_name(*busy, claim("a-next", 10, ns="team-a"))
    assert not slots.should_yield(alone, GLOBAL, 3, "busy-3", NOW, 30)  # nobody else waits


def test_given_back_and_lapsed_claims_leave_the_queue() -> None:
    given_back = slots.released(claim("a", 1, pulling="1"))
    lapsed = claim("b", 2, renewed=NOW - 31, pulling="2")
    assert slots.holders(by_name(given_back, lapsed, claim("c", 3, pulling="3")), GLOBAL, 1, NOW, 30) == ["c"]
    assert names.ANNOTATION_PULLING_SINCE not in given_back["metadata"]["annotations"]


def test_what_another_node_wrote_is_bounded_when_read() -> None:
    """#21 item 6: a claim with leaseDurationSeconds 2^31-1, or renewed in 2099, holds nothing for ever."""
    forever = claim("greedy", 1, renewed=NOW - 3600, duration=2**31 - 1)
    assert not slots.is_live(forever, NOW, 30)  # counted as the budget's own 30 s
    future = claim("greedy", 1, renewed=4_070_908_800.0)  # 2099
    assert not slots.is_live(future, NOW, 30)
    skewed = claim("slightly-ahead", 1, renewed=NOW + 5)  # a clock a little ahead is believed
    assert slots.is_live(skewed, NOW, 30)
    assert not slots.is_live(claim("no-duration", 1, duration="30"), NOW, 30)  # type: ignore[arg-type,unused-ignore]


def test_a_claim_records_its_place_on_renewal_and_a_new_claim_drops_it() -> None:
    name = slots.claim_name(GLOBAL, "c")
    first = slots.claimed(None, name, "c", NOW, 30, "team-a")
    assert first["metadata"]["labels"] == {names.LABEL_ORIGIN_BUDGET: names.ORIGIN_CLAIM}
    assert first["metadata"]["annotations"] == {names.ANNOTATION_ORIGIN_NAMESPACE: "team-a"}
    written = {**first, "metadata": {**first["metadata"], "resourceVersion": "41"}}
    renewed = slots.claimed(written, name, "c", NOW + 10, 30)
    assert renewed["metadata"]["annotations"][names.ANNOTATION_CLAIMED_AT] == "41"
    assert renewed["metadata"]["resourceVersion"] == "41"  # the write is guarded by it
    assert renewed["spec"]["acquireTime"] == slots.rfc3339(NOW)
    assert renewed["spec"]["renewTime"] == slots.rfc3339(NOW + 10)
    again = slots.claimed(renewed, name, "c", NOW + 100, 30)  # lapsed meanwhile: a new claim
    assert names.ANNOTATION_CLAIMED_AT not in again["metadata"]["annotations"]
    assert again["spec"]["acquireTime"] == slots.rfc3339(NOW + 100)
    marking = slots.marked(renewed, True)
    assert marking["metadata"]["annotations"][names.ANNOTATION_PULLING_SINCE] == names.PULLING_NEW
    assert (
        slots.pulling_since({**marking, "metadata": {**marking["metadata"], "resourceVersion": "50"}}) == 50
    )
    recorded = slots.claimed(
        {**marking, "metadata": {**marking["metadata"], "resourceVersion": "50"}}, name, "c", NOW + 12, 30
    )
    assert recorded["metadata"]["annotations"][names.ANNOTATION_PULLING_SINCE] == "50"
    assert names.ANNOTATION_PULLING_SINCE not in slots.marked(recorded, False)["metadata"]["annotations"]
    back = slots.released(renewed)
    assert not slots.holder(back) and names.ANNOTATION_CLAIMED_AT not in back["metadata"]["annotations"]
    assert slots.renewal_due(renewed, NOW + 20, 30) and not slots.renewal_due(renewed, NOW + 15, 30)


def test_retry_after_only_moves_later_and_is_bounded_when_read() -> None:
    name = slots.host_lease_name("hub")
    first = slots.with_cooldown(None, name, "hub", Cooldown(NOW + 5, "a"), NOW)
    assert first is not None
    assert first["metadata"]["labels"] == {names.LABEL_ORIGIN_BUDGET: names.ORIGIN_HOST}
    assert first["metadata"]["annotations"][names.ANNOTATION_ORIGIN_HOST] == "hub"
    assert first["spec"] == {"renewTime": slots.rfc3339(NOW)}  # when it was written: the bound's anchor
    assert slots.cooldown_of(first, NOW, 600) == Cooldown(pytest.approx(NOW + 5), "a")  # type: ignore[arg-type]
    assert (
        slots.with_cooldown(first, name, "hub", Cooldown(NOW + 3, "b"), NOW) is None
    )  # waits longer already
    later = slots.with_cooldown(first, name, "hub", Cooldown(NOW + 9, "b"), NOW)
    assert later is not None and slots.cooldown_of(later, NOW, 600) == Cooldown(pytest.approx(NOW + 9), "b")  # type: ignore[arg-type]
    assert slots.cooldown_of(None, NOW, 600) is None
    bad = {"metadata": {"annotations": {names.ANNOTATION_RETRY_AFTER_UNTIL: "soon"}}, "spec": {}}
    assert slots.cooldown_of(bad, NOW, 600) is None
    # #21 item 6: a Retry-After in 2099 counts as at most 600 s after it was written ...
    year_2099 = slots.with_cooldown(None, name, "hub", Cooldown(4_070_908_800.0, "evil"), NOW)
    held = slots.cooldown_of(year_2099, NOW, 600)
    assert held is not None and held.until == pytest.approx(NOW + 600)
    # ... and one that says it was written in the future is not believed at all
    assert slots.cooldown_of(year_2099, NOW - 3600, 600) is None


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


def test_an_object_store_origin_is_its_bucket_at_its_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    """#21 item 7: keyed by bucket name alone, a tenant's own S3-compatible server with a bucket named
    like another tenant's AWS bucket shared (and could hold) that bucket's places."""
    for key in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "S3_ENDPOINT", "PRAESTO_WORKLOAD_IDENTITY"):
        monkeypatch.delenv(key, raising=False)
    plan = Plan(Source("s3", "models/llama"), "v1", ())
    aws = origin_budget.origin_host(plan, Options())
    own = {"AWS_ACCESS_KEY_ID": "AKIA0000", "AWS_SECRET_ACCESS_KEY": "x" * 20}
    minio = origin_budget.origin_host(
        plan, Options(credentials={**own, "AWS_ENDPOINT_URL": "https://MinIO.tenant.example:9000"})
    )
    assert aws == "s3://default/models"
    assert minio == "s3://minio.tenant.example:9000/models"
    assert slots.claim_name(aws, "node-a") != slots.claim_name(minio, "node-a")
    assert slots.host_lease_name(aws) != slots.host_lease_name(minio)  # nor its Retry-After
    other_prefix = Plan(Source("s3", "models/mistral"), "v1", ())
    assert origin_budget.origin_host(other_prefix, Options()) == aws  # one bucket at one endpoint: one origin
    hub = Plan(Source("hf", "org/m"), "c" * 40, ())
    assert origin_budget.origin_host(hub, Options(endpoint="https://hub.example:8443/")) == "hub.example:8443"
