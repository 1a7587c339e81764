"""Issue #38 item 3: agents watch, they do not poll, counted by the real kube-apiserver itself.

Full agents (peers on, the origin budget on) against the real API server, with every
poll period shrunk to 0.1 s so any periodic read would show many times in the window.
Counted from the server's `apiserver_request_total` (testkit/apiserver_metrics.py): the
tests make no API call inside a window, so every request counted there is the agents'.
A waiting agent is woken by the change it waits for (a watch event), not by its period:
with the period set to 30 s, the wait ends within seconds of the change. The same tests
fail on the polling agents this replaced (a list per waiter per period).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from praesto.agent.budget import slots
from praesto.agent.budget.origin_budget import BudgetConfig

from praesto import names
from testkit import apiserver_metrics
from testkit.agent_harness import ready_condition
from testkit.kube_real import RealKube
from testkit.peer_cluster import MCN, NAMESPACE, Cluster, cluster

WINDOW = 3.0  # seconds observed: 30 periods of 0.1 s
PROMPT = 10.0  # a woken waiter acts within this; its period (30 s) would take longer
BUDGET_NS = "praesto-system"
READS = ("LIST", "GET")
WATCHED = (names.MODELCACHENODE_PLURAL, "leases")
# two waiters: one looking again every 0.1 s (a poll would list 30 times in the window), one
# every 30 s (it can act within PROMPT only when a watch event wakes it)
FOLLOWERS = {"node-b": 0.1, "node-c": 30.0}


@pytest.fixture
def agents(kube: RealKube, tmp_path: Path) -> Iterator[Cluster]:
    kube.ensure_namespace(BUDGET_NS)
    with cluster(kube, tmp_path) as running:
        yield running


def reads_over_window(kube: RealKube) -> dict[tuple[str, str], int]:
    """LIST and GET requests the server counted for ModelCacheNodes and Leases over `WINDOW`."""
    before = apiserver_metrics.read(kube.admin)
    threading.Event().wait(WINDOW)  # the observation window itself: nothing is awaited
    counted = apiserver_metrics.delta(before, apiserver_metrics.read(kube.admin)).requests
    return {k: n for k, n in counted.items() if k[0] in READS and k[1] in WATCHED and n}


def shows(c: Cluster, node: str, reason: str) -> bool:
    """Whether the copy of "model" on `node` shows `reason` on its Ready condition."""
    return ready_condition(c.status("model", node)).get("reason") == reason


def test_idle_agents_make_no_list_or_get_calls(agents: Cluster, kube: RealKube) -> None:
    budget = BudgetConfig(BUDGET_NS, max_nodes=1, poll_seconds=0.1)
    agents.hub.add_repo("org/small", {"config.json": b"{}"})
    for node in ("node-a", "node-b"):
        agents.start(node, budget=budget)
        agents.select("small", node)
    agents.wait_ready("small", ["node-a", "node-b"])
    # their downloads ended: no watch of the budget's Leases (nor of the cache's copies) remains
    budgets = [n.agent.budget for n in agents.nodes.values() if n.agent and n.agent.budget]
    kube.wait_until(
        lambda: not any(b.leases.watched.running for b in budgets), PROMPT, "Lease watches closed"
    )
    mark = len(kube.requests)
    assert reads_over_window(kube) == {}  # their own watches renew (WATCH), nothing else
    assert {r.verb for r in kube.requests[mark:]} <= {"watch"}, kube.requests[mark:]


def test_followers_wait_for_their_leader_on_the_watch(agents: Cluster, kube: RealKube) -> None:
    agents.hub.add_repo("org/model", {"config.json": b"{}", "w.bin": b"w" * 4096})
    # a leader that never moves (no agent behind it): the followers wait for it, then are woken
    # by its deletion; node-b fetches from the origin, node-c copies from node-b
    leader = agents.select("model", "node-a")
    status = {"phase": names.PHASE_PENDING, "peer": {"address": "127.0.0.250:9"}}
    kube.patch(MCN, leader["metadata"]["name"], {"status": status}, NAMESPACE, "status")
    for node, period in FOLLOWERS.items():
        agents.start(node, poll_seconds=period, stall_seconds=600.0)
        agents.select("model", node)
    for node in FOLLOWERS:
        kube.wait_until(functools.partial(shows, agents, node, "WaitingForPeer"), 30, f"{node} waits")
    assert reads_over_window(kube) == {}  # waiting: one list when it began, then the watch only
    kube.delete(MCN, leader["metadata"]["name"], NAMESPACE)
    gone = time.monotonic()
    agents.wait_ready("model", list(FOLLOWERS), timeout=PROMPT)
    assert time.monotonic() - gone < PROMPT  # watch events woke node-c, not its 30 s period


def test_nodes_wait_for_an_origin_slot_on_the_watch(agents: Cluster, kube: RealKube) -> None:
    agents.hub.add_repo("org/model", {"config.json": b"{}", "w.bin": b"w" * 4096})
    # another node holds the only slot (a live, marked claim) until the test gives it back
    name = slots.claim_name(slots.GLOBAL, "node-z")
    claim = slots.marked(slots.claimed(None, name, "node-z", time.time(), 600, NAMESPACE), True)
    held = kube.create({**claim, "metadata": {**claim["metadata"], "namespace": BUDGET_NS}})
    for node, period in FOLLOWERS.items():
        budget = BudgetConfig(BUDGET_NS, max_nodes=1, poll_seconds=period, lease_seconds=600)
        agents.start(node, peers=False, budget=budget)
        agents.select("model", node)
    waiting = names.REASON_WAITING_FOR_ORIGIN_BUDGET
    for node in FOLLOWERS:
        kube.wait_until(functools.partial(shows, agents, node, waiting), 30, f"{node} waits")
    assert reads_over_window(kube) == {}  # waiting: the Leases come by the watch
    kube.call("PUT", kube.path("leases.coordination.k8s.io", BUDGET_NS, name), slots.released(held))
    given_back = time.monotonic()
    # one after the other (one slot): each woken by a Lease's change, not its period
    agents.wait_ready("model", list(FOLLOWERS), timeout=PROMPT)
    assert time.monotonic() - given_back < PROMPT
