"""A rollout of the node DaemonSet at fleet size: every agent's start, replayed with the agent's own calls.

A restarted agent is a new process: a new client (new connection, new TLS handshake), empty
memory, and, with the chart's defaults and its copies Ready on disk, these calls and no other
(agent/daemon.py `run`, agent/node_agent.py `Agent.start`):

* its Reflector's LIST of this node's ModelCacheNodes (agent/kube.py `KubeApi.list_nodes`, the
  label selector `praesto.io/node=<node>`), then its WATCH from that list's resourceVersion
  (`watch_nodes`; opened here and closed at once: the real agent holds it open 300 s and resumes);
* the startup taint's first step (agent/startup_taint.py `StartupTaint.step`, the chart's
  `nodeAgent.startupTaint.key` is set by default): GET its Node, which carries no taint, so it stops;
* each listed copy reconciled from fresh memory through the agent's status writer (bench/scale_agents.py
  `FakeAgents.reconcile`): a Ready copy at the revision it is told writes nothing.

Peers, the origin budget and trust material open their watches only while a copy downloads or
names trust, so a Ready fleet's restart opens none. The rollout goes `maxUnavailable` agents at a
time (the chart's `nodeAgent.updateStrategy.rollingUpdate.maxUnavailable`, 10%) with no Pod start
time between them: the API server sees the fastest a rollout can be.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kubernetes import client
from praesto.agent.kube import Door, KubeApi
from praesto.agent.startup_taint import StartupTaint

from bench.scale_agents import FakeAgents
from bench.scale_nodes import node_name
from testkit import apiserver_metrics

if TYPE_CHECKING:
    from bench.scale_bench import Run

Obj = dict[str, Any]


@dataclass
class AgentChart:
    """What the rendered node DaemonSet says about a restart: the startup taint and the rollout's pace."""

    taint_key: str
    taint_deadline: float
    max_unavailable: str  # "10%" or a count

    @staticmethod
    def of(daemonset: Obj) -> AgentChart:
        spec = daemonset["spec"]
        (agent,) = [c for c in spec["template"]["spec"]["containers"] if c["name"] == "agent"]
        flags = dict(a.removeprefix("--").split("=", 1) for a in agent.get("args", []) if "=" in a)
        rolling = (spec.get("updateStrategy") or {}).get("rollingUpdate") or {}
        return AgentChart(flags.get("startup-taint-key", ""), float(flags.get("startup-taint-deadline", 0)),
                          str(rolling.get("maxUnavailable", 1)))  # fmt: skip

    def at_once(self, nodes: int) -> int:
        """maxUnavailable as the DaemonSet controller reads it (a percentage rounds up)."""
        value = self.max_unavailable
        return max(1, -(-nodes * int(value[:-1]) // 100) if value.endswith("%") else int(value))


@dataclass
class RolloutResult:
    agents: int = 0
    seconds: float = 0.0
    copies_listed: int = 0
    errors: list[str] = field(default_factory=list)


def restart_one(configuration: client.Configuration, agents: FakeAgents, chart: AgentChart, node: str) -> int:
    """One agent's start as the real one makes it; the copies it listed."""
    api = client.ApiClient(configuration=configuration)  # a new process: a new client
    try:
        kube = KubeApi(api, node)
        items, version = kube.list_nodes()
        events: Any = kube.watch_nodes(version)
        events.close()
        if chart.taint_key:
            StartupTaint(Door(api), kube, node, chart.taint_key, chart.taint_deadline, lambda *_: True).step()
        agents.forget(node)  # empty memory: a fresh status writer, as the new process has
        for obj in items:
            agents.reconcile(obj)
        return len(items)
    finally:
        api.close()


def rollout(
    configuration: client.Configuration, agents: FakeAgents, chart: AgentChart, nodes: list[str]
) -> RolloutResult:
    """Every node's agent restarted, the chart's maxUnavailable at a time."""
    result = RolloutResult(agents=len(nodes))
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=chart.at_once(len(nodes))) as pool:
        futures = {pool.submit(restart_one, configuration, agents, chart, node): node for node in nodes}
        for future, node in futures.items():
            try:
                result.copies_listed += future.result()
            except Exception as error:  # counted and shown; the rollout goes on
                if len(result.errors) < 5:
                    result.errors.append(f"{node}: {type(error).__name__}: {str(error)[:200]}")
    result.seconds = time.monotonic() - started
    return result


def restart_phase(run: Run, admin: client.ApiClient, nodes: int) -> dict[str, Any]:
    """The node DaemonSet rolled with the caches Ready: the API server's and the hooks' cost of it."""
    run.settle()
    run.passes.clear()
    calls_before = len(run.calls)
    before = apiserver_metrics.read(admin)
    (daemonset,) = [
        o for o in run.installed.objects if o["kind"] == "DaemonSet" and "node-agent" in o["metadata"]["name"]
    ]
    chart = AgentChart.of(daemonset)
    result = rollout(admin.configuration, run.agents, chart, [node_name(i) for i in range(nodes)])
    run.settle(quiet=5.0)  # the passes the restarts caused, if any, and the watches' ends counted
    requests = apiserver_metrics.delta(before, apiserver_metrics.read(admin)).requests
    totals = {f"{verb} {resource}": n for (verb, resource), n in sorted(requests.items(), key=lambda kv: -kv[1])
              if n}  # fmt: skip
    out = {
        "agents": result.agents, "seconds": result.seconds, "copies_listed": result.copies_listed,
        "errors": result.errors, "requests": dict(list(totals.items())[:10]),
        "requests_per_second": {k: n / result.seconds for k, n in list(totals.items())[:10]},
        "passes": dict(run.passes), "hook_calls": len(run.calls) - calls_before,
        "hook_bytes": sum(size for _, size, _ in run.calls[calls_before:]),
    }  # fmt: skip
    print(f"  DaemonSet rollout, {chart.at_once(nodes)} at a time ({chart}): {out}", flush=True)
    return out
