"""The node agent at scale: 200 ModelCaches on one node, one cache of 100,000 small files, and
what agents cost the API server.

    python -m bench.agent_scale_bench [--caches 200] [--files 100000] [--rounds 3]
    python -m bench.agent_scale_bench --api-cost [--agents 8] [--window 60] [--rounds 3]

1. `--caches` ModelCacheNodes of small models (3 files, ~20 KiB each model) on one node,
   served by a real node agent (testkit/agent_harness.py: production `Agent` and `KubeApi`
   against the real kube-apiserver, bytes from the local hub) with the production tick (1 s).
   Printed: time until every one is Ready; RSS of this process before the agent started
   and after all are Ready (the difference is the agent plus the API client's copies of
   the objects: an upper bound on what the agent holds); and the time of a full
   reconcile pass over every cache (what the agent's loop does every tick when nothing
   changes), `--rounds` passes, min/median/max, against a pass over one cache.
2. A repo of `--files` small files: plan (model_info + the recursive tree via
   huggingface_hub against the local hub, in one page: see bench_many_files), publication of a staged tree of that many
   real files (publish.publish: chmod, fsync of every directory, manifest, rename,
   complete marker), and the manifest's size. Min/median/max over `--rounds`.
3. `--api-cost` (alone): API calls per agent per minute, counted by the real kube-apiserver
   (`apiserver_request_total`, testkit/apiserver_metrics.py) by verb and resource, for
   `--agents` full agents in this process (production timings, peers on, the origin budget
   on with maxNodes 1, each as the agent ServiceAccount), in four windows per round: the
   server alone (its own background, subtracted from the others), agents idle with no copy,
   a swarm download (one ModelCacheNode per agent of one cache, from create until every copy
   is Ready: one leader pulls from a slowed origin, the others wait and copy from peers), and
   agents idle with a Ready copy each. Printed per window, for the resources the agent uses
   (`AGENT_RESOURCES`): requests per agent per minute by verb/resource, the same scaled to
   1,000 nodes in requests/s, watch events delivered per agent per minute, and open watches. The bench makes no API call inside a window but the
   swarm's creates (subtracted): it waits on the agents' own memory.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from praesto.agent.budget.leases import LeaseApi
from praesto.agent.budget.origin_budget import BudgetConfig, OriginBudget
from praesto.agent.download import Options
from praesto.agent.download.fetch import plan
from praesto.agent.download.publish import TREE, publish
from praesto.agent.kube import Door, KubeApi
from praesto.agent.metrics import AgentMetrics
from praesto.agent.node_agent import Agent
from praesto.agent.peers.peering import PeerConfig, Peering
from praesto.agent.settings import AgentSettings, ScrubSettings

from bench.common import ROUNDS, interleaved, median, print_table, record, rss_mib
from praesto import names
from praesto.spec import Source
from praesto.store import StoreLayout
from testkit import apiserver_metrics
from testkit.agent_harness import Env, env_context
from testkit.apiserver_metrics import Sample
from testkit.egress import LOOPBACK
from testkit.hub import LocalHub
from testkit.kube_real import RealKube, proxied, running_plane
from testkit.objects import modelcachenode
from testkit.peer_cluster import AGENT_SERVICE_ACCOUNT, NAMESPACE, agent_client, agent_pod

KiB = 1 << 10


@contextlib.contextmanager
def _env(work: Path) -> Iterator[Env]:
    """The agent on the real API server (`make cluster-bin` builds it), behind the fault proxy."""
    with running_plane(work / "kube-plane") as plane, proxied(plane) as kube:
        yield from env_context(kube, work)


def bench_caches(work: Path, caches: int, rounds: int) -> None:
    with _env(work) as env:
        for i in range(caches):
            env.add_model(f"m{i}", **{"config.json": b'{"i": %d}' % i, "w.bin": os.urandom(16 * KiB),
                                      "tokenizer.json": os.urandom(4 * KiB)})  # fmt: skip
        before, _ = rss_mib()
        agent = env.start(tick_seconds=1.0, progress_seconds=3.0)
        started = time.perf_counter()
        for i in range(caches):
            env.create_mcn(f"m{i}")
        deadline = started + 600
        while sum(1 for o in env.kube.list(f"{names.MODELCACHENODE_PLURAL}.{names.GROUP}")
                  if (o.get("status") or {}).get("phase") == names.PHASE_READY) < caches:  # fmt: skip
            if time.perf_counter() > deadline:
                raise TimeoutError("not every cache became Ready")
            time.sleep(0.1)
        ready = time.perf_counter() - started
        after, peak = rss_mib()
        keys = sorted(agent.objects)
        assert len(keys) == caches

        def full_pass() -> float:
            t0 = time.perf_counter()
            for key in keys:
                agent.reconcile(key)
            return time.perf_counter() - t0

        def one_cache() -> float:
            t0 = time.perf_counter()
            agent.reconcile(keys[0])
            return time.perf_counter() - t0

        samples = interleaved({f"full pass, {caches} caches": full_pass, "one cache": one_cache}, rounds)
    print(f"{caches} ModelCaches on one node (3 files each), production tick 1 s, {os.cpu_count()} CPUs")
    print(f"  all Ready {ready:.1f} s after the creates")
    print(f"  RSS of this process (agent + hub; the API server runs apart): before the agent {before:.0f} MiB, "
          f"all Ready {after:.0f} MiB (+{after - before:.0f} MiB), peak {peak:.0f} MiB")  # fmt: skip
    print_table(
        f"node agent with {caches} ModelCaches on one node: reconcile (ms)", samples, scale=1e3, unit="ms"
    )
    full = median(samples[f"full pass, {caches} caches"])
    print(f"  full pass {full * 1e3:.0f} ms median = {full / caches * 1e3:.2f} ms per cache; "
          f"once per 1 s tick that is {full * 100:.0f}% of one core")  # fmt: skip


def _stage(staging: Path, paths: list[str]) -> dict[str, str]:
    sha256 = {}
    for path in paths:
        target = staging / TREE / path
        target.parent.mkdir(parents=True, exist_ok=True)
        data = path.encode()
        target.write_bytes(data)
        sha256[path] = hashlib.sha256(data).hexdigest()
    return sha256


def bench_many_files(work: Path, count: int, rounds: int) -> None:
    files = {
        f"shards/{i // 1000:03d}/{i % 1000:03d}/item-{i}.json": f"item-{i}".encode() for i in range(count)
    }
    # One page: the local hub builds the whole listing for every page it serves (O(repo) per
    # page), which at 100 pages of 1000 would be its cost, not ours (2 minutes here).
    with LocalHub(work / "hub", page_size=count) as hub:
        hub.add_repo("org/many", files)
        options = Options(endpoint=hub.endpoint, egress=LOOPBACK)
        plans = []

        def planning() -> float:
            t0 = time.perf_counter()
            plans.append(plan(Source("hf", "org/many", "main"), options))
            return time.perf_counter() - t0

        plan_times = interleaved({"plan": planning}, rounds)
    planned = plans[-1]
    assert len(planned.files) == count
    publish_times = []
    manifest_size = 0
    for n in range(rounds):
        staging, dest = work / f"staging-{n}", work / f"dest-{n}"
        sha256 = _stage(staging, [f.path for f in planned.files])
        t0 = time.perf_counter()
        publish(planned, staging, dest, False, sha256)
        publish_times.append(time.perf_counter() - t0)
        manifest_size = (dest / names.MANIFEST_FILE).stat().st_size
    print(f"one cache of {count} small files ({count // 1000} directories of 1000)")
    print_table(
        f"one cache of {count} small files: seconds",
        {"plan (model_info + tree)": plan_times["plan"], "publish": publish_times},
    )
    print(f"  manifest {manifest_size / 2**20:.1f} MiB ({manifest_size / count:.0f} bytes per file)")


# ---- 3. what agents cost the API server --------------------------------------------------------
BUDGET_NAMESPACE = "praesto-system"
SWARM_FILE = "model.safetensors"
PER_1000 = 1000 / 60  # requests per agent per minute -> requests/s at 1,000 nodes
# What the agent asks for (praesto.rbac AGENT*): the API server's own informers renew their
# watches of everything else at random times, which no baseline window subtracts exactly.
AGENT_RESOURCES = {
    names.MODELCACHENODE_PLURAL, f"{names.MODELCACHENODE_PLURAL}/status", "leases", "events",
    "tokenreviews", "serviceaccounts/token", "secrets", "nodes",
}  # fmt: skip


def _api_agents(kube: RealKube, hub: LocalHub, work: Path, names_: list[str]) -> list[Agent]:
    """Full agents as the node agent runs them: production timings, peers, origin budget (1 node)."""
    started = []
    for i, node in enumerate(names_):
        api = agent_client(kube)
        base = work / node
        base.mkdir(parents=True)
        peer = PeerConfig(
            address="", pod=agent_pod(kube, node, node), service_account=AGENT_SERVICE_ACCOUNT,
            bind=(f"127.0.0.{i + 2}", 0),
        )  # fmt: skip
        budget = OriginBudget(
            BudgetConfig(BUDGET_NAMESPACE, max_nodes=1), LeaseApi(Door(api), BUDGET_NAMESPACE), node
        )
        settings = AgentSettings(
            node_name=node,
            base_path=base,
            hf_endpoint=hub.endpoint,
            reserve="0",
            scrub=ScrubSettings(0.0),
            egress=LOOPBACK,
        )
        agent = Agent(settings, KubeApi(api, node), AgentMetrics.create(), budget=budget,
                      peering=Peering(peer, Door(api), node, StoreLayout(base)))  # fmt: skip
        started.append(agent.start())
    for agent in started:
        if not agent.watcher.synced.wait(60):
            raise TimeoutError(f"agent {agent.settings.node_name} never listed its ModelCacheNodes")
    return started


def _window(
    kube: RealKube,
    seconds: float | None,
    until: Callable[[], bool] | None = None,
    first: Callable[[], None] = lambda: None,
) -> tuple[Sample, float]:
    """What the server counted over `seconds`, or from `first()` until `until()` holds (checked in
    memory only)."""
    before, t0 = apiserver_metrics.read(kube.admin), time.monotonic()
    first()
    quiet = threading.Event()
    if until is None:
        quiet.wait(seconds)
    else:
        deadline = t0 + 900
        while not until():
            if time.monotonic() > deadline:
                raise TimeoutError("the swarm did not finish within 15 minutes")
            quiet.wait(0.2)
    return apiserver_metrics.delta(before, apiserver_metrics.read(kube.admin)), time.monotonic() - t0


def _create_copies(kube: RealKube, cache: str, nodes: list[str]) -> None:
    for node in nodes:
        kube.create(modelcachenode(cache, node, NAMESPACE))


def _all_ready(agents: list[Agent]) -> bool:
    phases = [(o.get("status") or {}).get("phase") for a in agents for o in list(a.objects.values())]
    return len(phases) == len(agents) and all(p == names.PHASE_READY for p in phases)


def _per_agent_minute(
    window: Sample, seconds: float, base: Sample, base_seconds: float, agents: int
) -> dict[str, float]:
    """Requests per agent per minute by 'VERB resource' of the agent's resources, the server's own
    background subtracted."""
    rates = {}
    for key in {k for k in set(window.requests) | set(base.requests) if k[1] in AGENT_RESOURCES}:
        rate = window.requests[key] / seconds - base.requests[key] / base_seconds
        if rate * 60 / agents >= 0.05:
            rates[f"{key[0]} {key[1]}"] = rate * 60 / agents
    return rates


def bench_api_cost(
    work: Path, agents: int, window: float, rounds: int, swarm_mib: int, origin_kibps: int
) -> None:
    runs: dict[str, list[dict[str, float]]] = {}  # phase -> per round: 'VERB resource' -> /agent/min
    events: dict[str, list[float]] = {}  # phase -> per round: watch events delivered /agent/min
    watches: dict[str, list[float]] = {}  # phase -> per round: open watches at the window's end
    lengths: dict[str, list[float]] = {}  # phase -> per round: seconds
    with running_plane(work / "kube-plane") as plane, proxied(plane) as kube, LocalHub(work / "hub") as hub:
        kube.ensure_namespace(BUDGET_NAMESPACE)
        kube.ensure_namespace(NAMESPACE)
        hub.faults.rate = origin_kibps * KiB
        for r in range(rounds):
            cache = f"swarm-{r}"
            hub.add_repo(f"org/{cache}", {"config.json": b"{}", SWARM_FILE: os.urandom(swarm_mib << 20)})
            base, base_s = _window(kube, window)
            nodes = [f"r{r}-node-{i:02d}" for i in range(agents)]
            running = _api_agents(kube, hub, work / f"round-{r}", nodes)
            try:
                phases: dict[str, tuple[Sample, float]] = {"idle, no copy": _window(kube, window)}
                create = functools.partial(_create_copies, kube, cache, nodes)
                swarm = _window(kube, None, functools.partial(_all_ready, running), create)
                swarm[0].requests[("POST", names.MODELCACHENODE_PLURAL)] -= agents  # the bench's creates
                phases["swarm download"] = swarm
                phases["idle, one Ready copy"] = _window(kube, window)
            finally:
                for agent in running:
                    agent.stop()
            for phase, (sample, seconds) in phases.items():
                runs.setdefault(phase, []).append(_per_agent_minute(sample, seconds, base, base_s, agents))
                own = sum(n for r, n in sample.watch_events.items() if r in AGENT_RESOURCES)
                background = sum(n for r, n in base.watch_events.items() if r in AGENT_RESOURCES)
                events.setdefault(phase, []).append((own / seconds - background / base_s) * 60 / agents)
                watches.setdefault(phase, []).append(
                    float(sum(sample.open_watches[r] for r in AGENT_RESOURCES))
                )
                lengths.setdefault(phase, []).append(seconds)
    print(f"API calls per agent per minute ({agents} agents, production timings, peers on, origin budget on; "
          f"kube-apiserver's apiserver_request_total, its own background subtracted; {os.cpu_count()} CPUs; "
          f"swarm: {swarm_mib} MiB from an origin at {origin_kibps} KiB/s per response); "
          f"median [min-max] of {rounds}")  # fmt: skip
    for phase, samples in runs.items():
        print(f"  {phase} (window {median(lengths[phase]):.0f} s):")
        total = [sum(s.values()) for s in samples]
        rows = [(key, [s.get(key, 0.0) for s in samples]) for key in sorted({k for s in samples for k in s})]
        for key, values in [*rows, ("all requests", total)]:
            per_1000 = _spread([v * PER_1000 for v in values])
            print(f"    {key:<40} {_spread(values)} /agent/min = {per_1000} req/s per 1,000 nodes")
        print(f"    watch events delivered {_spread(events[phase])} /agent/min; "
              f"open watches at the end {_spread(watches[phase])}")  # fmt: skip
        record("series", f"agent API cost: {phase}", {"agents": agents, "per_agent_minute": samples, "total": total,
                                                      "watch_events_per_agent_minute": events[phase]})  # fmt: skip


def _spread(values: list[float]) -> str:
    return f"{median(values):7.2f} [{min(values):.2f}-{max(values):.2f}]"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--caches", type=int, default=200)
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--workdir", default="/var/tmp")
    parser.add_argument("--api-cost", action="store_true", help="only the API-cost bench (section 3)")
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--window", type=float, default=60.0, help="seconds of each idle window")
    parser.add_argument("--swarm-mib", type=int, default=32)
    parser.add_argument("--origin-kibps", type=int, default=256, help="the origin's rate per response")
    args = parser.parse_args()
    rounds = max(ROUNDS, args.rounds)
    if args.api_cost:
        with tempfile.TemporaryDirectory(prefix="praesto-api-cost-", dir=args.workdir) as tmp:
            bench_api_cost(Path(tmp), args.agents, args.window, rounds, args.swarm_mib, args.origin_kibps)
        return 0
    with tempfile.TemporaryDirectory(prefix="praesto-scale-", dir=args.workdir) as tmp:
        bench_caches(Path(tmp), args.caches, rounds)
    with tempfile.TemporaryDirectory(prefix="praesto-files-", dir=args.workdir) as tmp:
        bench_many_files(Path(tmp), args.files, rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
