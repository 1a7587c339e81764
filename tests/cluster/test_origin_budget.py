"""Issue #15 item 3: the cluster-wide origin budget, on the real control plane with real agents.

The chart is rendered with `originBudget` on; its Lease Role, RoleBinding and
ValidatingAdmissionPolicy are applied, and each `praesto-agent run` gets the
`--origin-budget-*` flags of the rendered DaemonSet, with a token bound to the
agent Pod on its node. Peers are off in these agents (no --peer-port), so the
budget is the only thing that serialises origin downloads.

To tell nodes apart at the origin, each node in the budget test has its own
local hub (same repo, same bytes) whose request log records when each request
came and went; together they are the cluster's origin log.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from praesto.agent.budget import slots

from praesto import names
from testkit.chart_install import render_for_cluster
from testkit.controlplane import wait_for
from testkit.helm_chart import NAMESPACE
from testkit.hub import LocalHub, Span
from testkit.metacontroller import CompositeController, gone
from tests.cluster.agents import AgentProcess, agent_pod, bound_to, remove_agent_pod
from tests.cluster.flows import modelcachenodes, phase_is
from tests.cluster.installed import AGENT_SA, Installed
from tests.cluster.tenants import modelcache, opted_in_namespace, ready_node

Obj = dict[str, Any]
NS = "origin-budget"
POOL = "test.praesto.io/budget-pool"
BUDGET = 2
VALUES = {
    "originBudget": {"enabled": True, "maxNodes": BUDGET, "leaseDurationSeconds": 15, "pollSeconds": 0.3}
}
NAME = "praesto-node-agent-origin-budget"
MODEL = {"config.json": b"{}", "model.safetensors": bytes(range(256)) * 3000}  # 768 KB, LFS
RATE = 400_000  # bytes/s per response: each node's download takes about two seconds


@pytest.fixture(scope="module")
def budget(installed: Installed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """The chart's origin budget objects applied; yields the agent flags the DaemonSet carries."""
    objects = render_for_cluster(tmp_path_factory.mktemp("budget-chart"), VALUES)
    mine = [o for o in objects if o["metadata"]["name"] == NAME]
    assert {o["kind"] for o in mine} == {
        "Role", "RoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
    }  # fmt: skip
    for obj in mine:
        installed.admin.apply(obj)
    (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
    args = [a for a in daemonset["spec"]["template"]["spec"]["containers"][0]["args"] if "origin-budget" in a]
    assert f"--origin-budget-namespace={NAMESPACE}" in args
    opted_in_namespace(installed.admin, NS)
    yield args
    for obj in reversed(mine):
        installed.admin.delete(obj["apiVersion"], obj["kind"], NAME, obj["metadata"].get("namespace"))
    for lease in leases(installed).values():
        installed.admin.delete("coordination.k8s.io/v1", "Lease", lease["metadata"]["name"], NAMESPACE)


def leases(installed: Installed) -> dict[str, Obj]:
    found = installed.admin.list("coordination.k8s.io/v1", "Lease", NAMESPACE, names.LABEL_ORIGIN_BUDGET)
    return {o["metadata"]["name"]: o for o in found}


def most_nodes_at_once(spans: dict[str, list[Span]]) -> int:
    """The largest number of distinct nodes with an origin byte request open at the same instant."""
    edges = sorted(
        (t, kind, node)
        for node, node_spans in spans.items()
        for s in node_spans
        if s.bytes
        for t, kind in ((s.start, 1), (s.end, 0))  # at equal times an end counts before a start
    )
    open_requests: dict[str, int] = {}
    most = 0
    for _, kind, node in edges:
        open_requests[node] = open_requests.get(node, 0) + (1 if kind else -1)
        most = max(most, sum(1 for n in open_requests.values() if n > 0))
    return most


def test_six_agents_with_budget_two_never_pull_from_more_than_two_nodes_at_once(
    installed: Installed, budget: list[str], composite: CompositeController, tmp_path: Path
) -> None:
    nodes = [f"budget-{i}" for i in range(6)]
    for node in nodes:
        ready_node(installed.admin, node, {POOL: "six"})
    with ExitStack() as stack:
        hubs = {node: stack.enter_context(LocalHub(tmp_path / f"hub-{node}")) for node in nodes}
        for hub in hubs.values():
            hub.add_repo("org/budget", MODEL)
            hub.faults.rate = RATE
        agents = {
            node: stack.enter_context(
                AgentProcess(installed, node, hubs[node].endpoint, tmp_path / node, tuple(budget))
            )
            for node in nodes
        }
        installed.admin.create(
            modelcache("six", NS, node_selector={POOL: "six"}, source={"huggingface": {"repo": "org/budget"}})
        )
        result = composite.wait_parent(NS, "six", phase_is(names.PHASE_READY), deadline=120)
        assert result is not None
        assert (result["status"]["readyNodes"], result["status"]["totalNodes"]) == (6, 6)
        spans = {node: list(hub.spans) for node, hub in hubs.items()}
        logs = {node: agent.log() for node, agent in agents.items()}
        children = modelcachenodes(installed.admin, NS, "six")
        installed.admin.delete(names.API_VERSION, names.MODELCACHE_KIND, "six", NS)
        composite.wait_parent(NS, "six", gone, deadline=90)  # the agents release their copies
    for node, node_spans in spans.items():  # every node fetched its own copy from the origin
        assert sum(1 for s in node_spans if s.cdn and s.method == "GET") >= 1, node
    assert most_nodes_at_once(spans) <= BUDGET, spans
    waited = [node for node, text in logs.items() if names.REASON_WAITING_FOR_ORIGIN_BUDGET in text]
    assert waited, "no agent ever waited: the budget was not exercised"
    assert "originBudget.maxNodes" in logs[waited[0]]
    # Each node queued with a claim of its own, given back when its downloads ended (not left to lapse).
    claims = {n: lease for n, lease in leases(installed).items() if n.startswith(slots.claim_name("", ""))}
    assert set(claims) == {slots.claim_name("", node) for node in nodes}
    assert all(not slots.holder(lease) for lease in claims.values()), claims
    assert len(children) == 6
    for node, child in children.items():
        assert child["status"]["phase"] == names.PHASE_READY, node


def test_one_nodes_429_holds_every_nodes_next_origin_request_until_retry_after(
    installed: Installed, budget: list[str], composite: CompositeController, tmp_path: Path
) -> None:
    nodes = ["retry-a", "retry-b", "retry-c"]
    for node in nodes:
        ready_node(installed.admin, node, {POOL: "retry"})
    with ExitStack() as stack:
        hub = stack.enter_context(LocalHub(tmp_path / "hub"))
        hub.add_repo("org/budget", MODEL)
        hub.faults.fail_status, hub.faults.retry_after, hub.faults.fail_first = 429, "6", 1
        first = stack.enter_context(
            AgentProcess(installed, nodes[0], hub.endpoint, tmp_path / nodes[0], tuple(budget))
        )
        installed.admin.create(
            modelcache(
                "retry", NS, node_selector={POOL: "retry"}, source={"huggingface": {"repo": "org/budget"}}
            )
        )
        host = hub.endpoint.split("://", 1)[1]
        shared: list[slots.Cooldown] = []

        def announced() -> bool:
            lease = leases(installed).get(slots.host_lease_name(host))
            cooldown = slots.cooldown_of(lease, time.time(), 600)
            if cooldown is not None:
                shared.append(cooldown)
            return cooldown is not None

        wait_for("the 429's Retry-After on the host's Lease", announced, 60)
        seen_at = (
            time.time()
        )  # the other nodes start only now; node A's requests in flight at the 429 are done
        cooldown = shared[-1]
        assert cooldown.by == nodes[0]
        assert cooldown.until > seen_at + 2, "Retry-After passed before the other nodes could start"
        others = [
            stack.enter_context(AgentProcess(installed, node, hub.endpoint, tmp_path / node, tuple(budget)))
            for node in nodes[1:]
        ]
        composite.wait_parent(NS, "retry", phase_is(names.PHASE_READY), deadline=120)
        later = [s for s in hub.spans if s.bytes and s.start > seen_at]
        logs = [agent.log() for agent in (first, *others)]
        installed.admin.delete(names.API_VERSION, names.MODELCACHE_KIND, "retry", NS)
        composite.wait_parent(NS, "retry", gone, deadline=90)
    assert later, "nothing was fetched after the 429"
    early = [s for s in later if s.start < cooldown.until]
    assert early == [], f"origin requests before the shared Retry-After ({cooldown.until}): {early}"
    for text in logs[1:]:  # the nodes that never got the 429 waited for it, and said so
        assert "Retry-After" in text and f"node {nodes[0]}" in text, text[-2000:]


def test_the_policy_keeps_an_agent_to_its_own_claims_and_bounded_values(
    installed: Installed, budget: list[str]
) -> None:
    """#21 item 6: an agent may create or renew only its own claim; it cannot take or release
    another node's place (live or not: admission has no clock to tell), write a lease duration or a
    Retry-After beyond the chart's bounds, or put itself earlier in the queue."""
    me, victim = "budget-policy", "budget-victim"
    ready_node(installed.admin, me)
    pod = agent_pod(installed, me)
    try:
        api = installed.plane.client_as(NAMESPACE, AGENT_SA, suffix=me, bound_object=bound_to(pod))
        leases_api = client.CoordinationV1Api(api)
        now = time.time()

        def write(body: Obj) -> Obj:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", **body}
            if body["metadata"].get("resourceVersion"):
                name = body["metadata"]["name"]
                written = leases_api.replace_namespaced_lease(name, NAMESPACE, body)
            else:
                written = leases_api.create_namespaced_lease(NAMESPACE, body)
            as_dict: Obj = api.sanitize_for_serialization(written)
            return as_dict

        def refused(body: Obj) -> str:
            try:
                write(body)
            except ApiException as err:
                return str(err.body) if err.status in (403, 422) else ""
            return ""  # written (the module's teardown deletes it)

        wait_for(
            "the origin budget policy to take effect",
            lambda: (
                "only the origin budget Leases" in refused(slots.claimed(None, "metacontroller", me, now, 15))
            ),
            30,
        )
        # A live claim of another node (its agent wrote it; the admin stands in).
        body = slots.claimed(None, slots.claim_name("", victim), victim, now, 15)
        body["metadata"]["namespace"] = NAMESPACE
        theirs = installed.admin.apply({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease"} | body)
        name, host = slots.claim_name("", me), slots.host_lease_name("origin.example")
        early = slots.claimed(None, name, me, now, 15)
        early["metadata"]["annotations"] = {names.ANNOTATION_CLAIMED_AT: "1"}
        first_puller = slots.claimed(None, name, me, now, 15)
        first_puller["metadata"]["annotations"] = {names.ANNOTATION_PULLING_SINCE: "1"}
        attacks = {  # what the agent tries -> (what the refusal must say, the body)
            "take another node's live place": ("only its own origin claims",
                                               slots.claimed(theirs, theirs["metadata"]["name"], me, now, 15)),
            "give back another node's place": ("only its own origin claims", slots.released(theirs)),
            "claim in another node's name": ("only its own origin claims",
                                             slots.claimed(None, slots.claim_name("", "other"), "other", now, 15)),
            "hold a Lease that is not a claim": ("has no holder",
                                                 slots.claimed(None, "praesto-origin-0", me, now, 15)),
            "lease for 2^31-1 seconds": ("lasts 1 to 15 seconds", slots.claimed(None, name, me, now, 2**31 - 1)),
            "jump the queue": ("place in the queue", early),
            "pull ahead of every mark": ("marked as pulling", first_puller),
            "Retry-After in 2099": ("at most 600 seconds", slots.with_cooldown(
                None, host, "origin.example", slots.Cooldown(4_070_908_800.0, me), now) or {}),
            "Retry-After in another node's name": ("written by the node that got it", slots.with_cooldown(
                None, host, "origin.example", slots.Cooldown(now + 60, victim), now) or {}),
        }  # fmt: skip
        answers = {attack: refused(body) for attack, (_, body) in attacks.items()}
        admitted = [attack for attack, answer in answers.items() if not answer]
        assert admitted == [], f"the policy admitted: {admitted}"
        for attack, (why, _) in attacks.items():
            assert why in answers[attack], (attack, answers[attack])

        # What an agent does: claim, renew (recording its place: the claim's resourceVersion), give back.
        mine = write(slots.claimed(None, name, me, now, 15))
        renewed = write(slots.claimed(mine, name, me, now + 5, 15))
        place = renewed["metadata"]["annotations"][names.ANNOTATION_CLAIMED_AT]
        assert place == mine["metadata"]["resourceVersion"]
        forged = slots.claimed(renewed, name, me, now + 10, 15)
        forged["metadata"]["annotations"][names.ANNOTATION_CLAIMED_AT] = "1"
        assert "place in the queue" in refused(forged)
        marking = write(slots.marked(renewed, True))  # its turn: marked "new", then its write's version
        recorded = write(slots.claimed(marking, name, me, now + 6, 15))
        since = recorded["metadata"]["annotations"][names.ANNOTATION_PULLING_SINCE]
        assert since == marking["metadata"]["resourceVersion"]
        moved = slots.claimed(recorded, name, me, now + 7, 15)
        moved["metadata"]["annotations"][names.ANNOTATION_PULLING_SINCE] = "1"
        assert "marked as pulling" in refused(moved)
        assert not slots.holder(write(slots.released(recorded)))
        fair = slots.with_cooldown(None, host, "origin.example", slots.Cooldown(now + 60, me), now)
        assert fair is not None
        assert slots.cooldown_of(write(fair), now, 600) == slots.Cooldown(pytest.approx(now + 60), me)  # type: ignore[arg-type]
    finally:
        remove_agent_pod(installed, pod)


def test_the_policy_is_rendered_from_the_shared_names(budget: list[str], tmp_path: Path) -> None:
    policy = next(
        o for o in render_for_cluster(tmp_path, VALUES)
        if o["kind"] == "ValidatingAdmissionPolicy" and o["metadata"]["name"] == NAME
    )  # fmt: skip
    text = str(policy["spec"])
    for name in (names.ORIGIN_LEASE_PREFIX, names.ANNOTATION_CLAIMED_AT, names.ANNOTATION_RETRY_AFTER_UNTIL,
                 names.ANNOTATION_RETRY_AFTER_BY, names.TOKEN_EXTRA_NODE_NAME):  # fmt: skip
        assert name in text, name
