"""The scale tier: one ModelCache over N GPU-shaped Nodes (and C caches over them) on the real control plane.

    python -m bench.scale_bench [--nodes 100 1000] [--caches 1] [--rounds 3] [--steady 60]
    make test-scale                      # the same, alone (never part of `make test`)

Per N (a fresh control plane each: etcd, kube-apiserver, kube-controller-manager from
build/cluster), the chart installed as the control-plane tier installs it
(tests/cluster/installed.py: rendered objects, praesto-hooks from the installed wheel as
its ServiceAccount), N Nodes written as their kubelet, NFD, CNI and controller-manager
write them (bench/scale_nodes.py), the Metacontroller stand-in in its own process at the
chart's Metacontroller args, client rate limit included (bench/scale_standin.py), and a
fake agent per node that reports through the agent's status writer (bench/scale_agents.py).
Per round, for C caches at once: seconds from create until every ModelCacheNode exists,
until every cache is READY N/N, for a revision roll (a new pinned commit) until every cache
serves it on N nodes, and from delete until the caches and copies are gone. Then, with the
caches Ready, `--steady` seconds of kubelet heartbeats (20 nodes, each every 10 s): passes
per minute. Hook request bytes and seconds per call (by hook path), peak RSS of the hooks
and the stand-in, and the API server's own `apiserver_request_total` (requests/s by verb and
resource) over the rounds and over the steady window. Waits read watches (informers), so
the bench's own API calls are its creates, patches and deletes.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from bench.common import ROUNDS, print_table, record
from bench.scale_agents import FakeAgents
from bench.scale_background_pods import PodWriter, namespace_of, pod_body
from bench.scale_nodes import POOL, POOL_LABEL, Heartbeats, NodeWriter
from bench.scale_pods import PodStorm, delete_pods
from bench.scale_real_mc import RealMetacontroller
from bench.scale_restart import restart_phase
from bench.scale_standin import StandIn, Stats
from praesto import names
from testkit import apiserver_metrics
from testkit.chart_install import ensure_namespace
from testkit.controlplane import ControlPlane, start_control_plane
from testkit.helm_chart import NAMESPACE
from testkit.informer import Informer
from testkit.metacontroller_subchart import rendered_command_args, rendered_env
from tests.cluster.installed import METACONTROLLER_SA, Installed, install_chart
from tests.cluster.tenants import modelcache

NS = "scale"
COMMITS = ("a" * 40, "b" * 40)
HEARTBEAT_NODES, HEARTBEAT_PERIOD = 20, 10.0
MiB = 1 << 20
Obj = dict[str, Any]


class Watched:
    """What the bench waits on, from watches: the caches and their copies."""

    def __init__(self, api: client.ApiClient, agents: FakeAgents) -> None:
        self.caches = Informer(api, names.API_VERSION, "modelcaches", names.MODELCACHE_KIND).start()
        self.copies = agents.informer
        self.caches.synced.wait(30)

    def count_copies(self, cache: str, done: Callable[[Obj], bool] = lambda o: True) -> int:
        label = names.LABEL_MODEL_CACHE
        return len(
            self.copies.objects(
                home(cache), lambda o: o["metadata"].get("labels", {}).get(label) == cache and done(o)
            )
        )

    def status(self, cache: str) -> Obj:
        return (self.caches.get(home(cache), cache) or {}).get("status") or {}


class Run:
    """One N: the stand-in's stats gathered while waiting, the API server's counters per phase."""

    def __init__(self, installed: Installed, standin: StandIn | RealMetacontroller, watched: Watched,
                 agents: FakeAgents) -> None:  # fmt: skip
        self.installed, self.standin, self.watched, self.agents = installed, standin, watched, agents
        self.passes: Counter[str] = Counter()
        self.writes: Counter[str] = Counter()
        self.calls: list[tuple[str, int, float]] = []
        self.errors: list[str] = []
        self.last = Stats()
        self.failed: dict[str, dict[str, Any]] = {}  # hook path -> failed calls, their largest body, why
        self.extra: dict[str, Any] = {}
        # the stand-in's caches and queues at their furthest behind (scale_standin.Stats), all phases
        self.backlog: dict[str, tuple[int, float]] = {}
        self.queue_depth: dict[str, int] = {}
        self.create_failures: list[
            str
        ] = []  # ModelCache creates answered "retry" (a webhook timing out)  # "admission" (Pods created during a roll), "restart" (a rollout)

    def gather(self) -> None:
        stats = self.standin.stats()
        self.passes.update(stats.passes)
        self.writes.update(stats.writes)
        self.calls += stats.calls
        for path, size, why in stats.failed:  # per hook path: how many failed, the largest, the first reason
            seen = self.failed.setdefault(path, {"calls": 0, "max_bytes": 0, "error": why})
            seen["calls"], seen["max_bytes"] = seen["calls"] + 1, max(seen["max_bytes"], size)
        self.errors = (self.errors + stats.errors)[-5:]
        self.last = stats
        for kind, (count, age) in stats.backlog.items():
            most = self.backlog.get(kind, (0, 0.0))
            self.backlog[kind] = (max(most[0], count), max(most[1], age))
        for name, depth in stats.queue_depth.items():
            self.queue_depth[name] = max(self.queue_depth.get(name, 0), depth)

    def behind(self) -> str:
        """How far the stand-in's caches and work queues fell behind (its cache creating what exists)."""
        caches = ", ".join(
            f"{k} {n:,} events, oldest {age:.0f} s" for k, (n, age) in sorted(self.backlog.items())
        )
        queues = ", ".join(f"{k} {n:,}" for k, n in sorted(self.queue_depth.items()))
        return f"cache backlog: {caches or 'none'}; work queue depth: {queues or 'none'}"

    def wait(self, what: str, done: Callable[[], bool], deadline: float) -> float:
        """Seconds until `done()`, gathering stats every half second; nan (and a line) past `deadline`."""
        started = time.monotonic()
        while not done():
            self.gather()
            if time.monotonic() - started > deadline:
                print(
                    f"  !! {what}: not done after {deadline:.0f} s; stand-in errors: {self.errors}; "
                    f"fake agents' errors: {self.agents.errors[-3:]}; stand-in behind at most: "
                    f"{self.behind()}",
                    flush=True,
                )
                return float("nan")
            time.sleep(0.5)  # poll interval of the bench's own memory (watches), bounded by the deadline
        print(f"  {what}: {time.monotonic() - started:.1f} s", flush=True)
        return time.monotonic() - started

    def settle(self, quiet: float = 3.0, deadline: float = 600) -> None:
        """Until the stand-in made no pass for `quiet` seconds (its startup passes over every Node)."""
        end, calm_since = time.monotonic() + deadline, time.monotonic()
        while time.monotonic() < end and time.monotonic() - calm_since < quiet:
            before = sum(self.passes.values())
            time.sleep(0.5)
            self.gather()
            if sum(self.passes.values()) != before:
                calm_since = time.monotonic()


def cache_names(count: int) -> list[str]:
    return [f"gpu-model-{i:03d}" for i in range(count)]


def home(cache: str) -> str:
    """Each cache in a namespace of its own (`scale` for the first), as tenants' caches are. All in one
    namespace, the stand-in, not the product, is what slows: its claim scans every child of the parent's
    namespace each pass (testkit/metacontroller.py `_claim_children`), where Metacontroller v4.17.2 looks
    its children up by index (`pkg/controller/composite/controller.go` `claimChildren`); with 10,000
    copies in one namespace, 75 of 100 caches were still not Ready 9 minutes after all copies existed."""
    index = int(cache.rsplit("-", 1)[1])
    return NS if index == 0 else f"{NS}-{index:03d}"


def create_caches(run: Run, custom: client.CustomObjectsApi, caches: list[str], deadline: float) -> None:
    """Each cache created as a user would: again after an answer that says to retry (the ModelCache
    validating webhook timing out on a busy machine answers 500), each such answer kept."""
    for cache in caches:
        body = modelcache(cache, home(cache), node_selector={POOL_LABEL: POOL},
                          source={"huggingface": {"repo": "org/tiny", "revision": COMMITS[0]}})  # fmt: skip
        end = time.monotonic() + deadline
        while True:
            try:
                custom.create_namespaced_custom_object(
                    names.GROUP, names.VERSION, home(cache), "modelcaches", body
                )
                break
            except ApiException as error:
                if error.status not in (429, 500, 503, 504) or time.monotonic() > end:
                    raise
                why = f"create {cache}: HTTP {error.status}: {str(error.body)[:300]}"
                run.create_failures.append(why)
                print(f"  !! {why}", flush=True)
                time.sleep(1.0)  # a user's retry, bounded by the deadline above


def one_round(
    run: Run, admin: client.ApiClient, nodes: int, caches: list[str], deadline: float, pods: int = 0
) -> dict[str, float]:
    custom = client.CustomObjectsApi(admin)
    w = run.watched
    started = time.monotonic()
    create_caches(run, custom, caches, deadline)
    out = {
        "create → all copies": run.wait(
            "all copies", lambda: all(w.count_copies(c) == nodes for c in caches), deadline
        )
    }
    if math.isnan(out["create → all copies"]):  # what it reached, and no later phase can start
        run.extra["reached"] = {"copies": sum(w.count_copies(c) for c in caches), "of": nodes * len(caches),
                                "readyNodes": sum(int(w.status(c).get("readyNodes") or 0) for c in caches)}  # fmt: skip
        print(f"  reached: {run.extra['reached']}; failed hook calls: {run.failed}", flush=True)
        nan = float("nan")
        return {**out, "create → READY N/N": nan, "revision roll → READY N/N": nan, "delete → gone": nan}

    def ready(commit: str) -> Callable[[], bool]:
        def check() -> bool:
            return all(
                w.status(c).get("readyNodes") == nodes and w.status(c).get("phase") == names.PHASE_READY
                and w.status(c).get("resolvedRevision") == commit for c in caches
            )  # fmt: skip

        return check

    run.wait("READY N/N", ready(COMMITS[0]), deadline)
    out["create → READY N/N"] = time.monotonic() - started if ready(COMMITS[0])() else float("nan")
    started = time.monotonic()
    patch = {"spec": {"source": {"huggingface": {"repo": "org/tiny", "revision": COMMITS[1]}}}}
    for cache in caches:
        custom.patch_namespaced_custom_object(
            names.GROUP, names.VERSION, home(cache), "modelcaches", cache, patch
        )
    storm = PodStorm(admin.configuration, home(caches[0]), caches[0], pods).start() if pods else None
    out["revision roll → READY N/N"] = run.wait("roll", ready(COMMITS[1]), deadline)
    if storm is not None:  # Pods asking for the rolling cache, admitted while its copies roll
        rolled = started + out["revision roll → READY N/N"]
        summary = storm.join(deadline).summary(None if math.isnan(rolled) else rolled)
        print(f"  admission during the roll: { {k: round(v, 1) for k, v in summary.items()} }; "
              f"first failures: {storm.result.failures[:3]}", flush=True)  # fmt: skip
        run.extra["admission"] = summary
        delete_pods(admin.configuration, home(caches[0]))
    started = time.monotonic()
    for cache in caches:
        custom.delete_namespaced_custom_object(names.GROUP, names.VERSION, home(cache), "modelcaches", cache)
    gone = lambda: all(w.caches.get(home(c), c) is None and w.count_copies(c) == 0 for c in caches)  # noqa: E731
    out["delete → gone"] = run.wait("delete", gone, deadline)
    del started
    return out


def hooks_peak_rss(pid: int) -> float:
    """Peak RSS (MiB) of the hooks' largest process (gunicorn's master or a worker), from /proc."""
    peaks = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (proc / "stat").read_text()
            if int(proc.name) == pid or int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                for line in (proc / "status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        peaks.append(int(line.split()[1]) / 1024)
    return max(peaks, default=0.0)


def per_second(delta: apiserver_metrics.Sample, seconds: float, top: int = 8) -> dict[str, float]:
    rates = {f"{verb} {resource}": n / seconds for (verb, resource), n in delta.requests.items() if n}
    return dict(sorted(rates.items(), key=lambda kv: -kv[1])[:top])


@contextlib.contextmanager
def cluster(work: Path, nodes: int) -> Iterator[tuple[ControlPlane, Installed, float, int]]:
    plane = start_control_plane(work / "plane")
    try:
        with install_chart(plane, work / "installed") as installed:
            writer = NodeWriter(installed.admin.api.configuration)
            started = time.monotonic()
            writer.register_all(range(nodes))
            seconds = time.monotonic() - started
            raw = installed.admin.api.call_api(
                "/api/v1/nodes/gpu-00000", "GET", auth_settings=["BearerToken"], _preload_content=False
            )
            yield plane, installed, seconds, len(raw.data)
    finally:
        plane.stop()


def measure(nodes: int, caches: int, rounds: int, steady: float, deadline: float, pods: int = 0,
            restart: bool = False, binary: Path | None = None, others: int = 0) -> dict[str, list[float]]:  # fmt: skip
    shape = f"{caches} cache{'s' if caches > 1 else ''} x {nodes} nodes"
    shape += ", real Metacontroller" if binary else ""
    shape += f", {others:,} other Pods" if others else ""
    shape += f", {pods} Pods admitted during the roll" if pods else ""
    shape += ", node DaemonSet rolled" if restart else ""
    with (
        tempfile.TemporaryDirectory(prefix="scale-") as tmp,
        cluster(Path(tmp), nodes) as (plane, inst, secs, size),
    ):
        print(
            f"== {shape}: {nodes} Nodes written in {secs:.0f} s, {size / 1024:.1f} KiB each as returned",
            flush=True,
        )
        admin = inst.admin.api
        if others:  # before the controllers start, as on a running cluster
            started = time.monotonic()
            PodWriter(inst.admin, admin.configuration).write_all(others, nodes)
            first = pod_body(0, nodes)["metadata"]["name"]
            raw = admin.call_api(f"/api/v1/namespaces/{namespace_of(0)}/pods/{first}", "GET",
                                 auth_settings=["BearerToken"], _preload_content=False)  # fmt: skip
            print(f"  {others:,} other Pods written in {time.monotonic() - started:.0f} s, "
                  f"{len(raw.data) / 1024:.1f} KiB each as returned", flush=True)  # fmt: skip
        for namespace in sorted({home(c) for c in cache_names(caches)}):
            ensure_namespace(
                inst.admin, namespace, {names.LABEL_INJECTION: names.INJECTION_ENABLED} if pods else None
            )
        args = rendered_command_args(Path(tmp) / "args")
        print(f"  Metacontroller args (chart): {' '.join(args)}", flush=True)
        kubeconfig = plane.token_kubeconfig(NAMESPACE, METACONTROLLER_SA)
        assert inst.hooks.ca_path is not None
        controllers: StandIn | RealMetacontroller = (
            RealMetacontroller(binary, kubeconfig, inst.admin, inst.hooks.base_url, inst.hooks.ca_path, args,
                               rendered_env(Path(tmp) / "env"), Path(tmp) / "metacontroller")
            if binary else
            StandIn(kubeconfig, inst.hooks.base_url, inst.hooks.ca_path, inst.rendered("CompositeController"),
                    inst.rendered("DecoratorController"), args)
        )  # fmt: skip
        with FakeAgents(admin) as agents, controllers as standin:
            watched = Watched(admin, agents)
            try:
                run = Run(inst, standin, watched, agents)
                run.settle()
                run.calls.clear()
                run.passes.clear()
                names_ = cache_names(caches)
                samples: dict[str, list[float]] = {}
                before, started = apiserver_metrics.read(admin), time.monotonic()
                for index in range(rounds):
                    for key, value in one_round(run, admin, nodes, names_, deadline,
                                                pods if index == 0 else 0).items():  # fmt: skip
                        samples.setdefault(key, []).append(value)
                    if "reached" in run.extra:  # the caches never got their copies: nothing more to time
                        rounds = index + 1
                        break
                rounds_rate = per_second(apiserver_metrics.delta(before, apiserver_metrics.read(admin)),
                                         time.monotonic() - started)  # fmt: skip
                round_calls, round_passes = list(run.calls), Counter(run.passes)
                broken = "reached" in run.extra
                steady_out = ({}, {}, 0) if broken else steady_state(run, admin, inst, nodes, names_, steady,
                                                                      deadline)  # fmt: skip
                if restart and not broken:
                    run.extra["restart"] = restart_phase(run, admin, nodes)
                report(
                    shape,
                    samples,
                    round_calls,
                    round_passes,
                    rounds,
                    rounds_rate,
                    steady_out,
                    run,
                    inst,
                    size,
                )
                return samples
            finally:
                watched.caches.stop()


def steady_state(run: Run, admin: client.ApiClient, inst: Installed, nodes: int, caches: list[str],
                 seconds: float, deadline: float) -> tuple[dict[str, float], dict[str, float], int]:  # fmt: skip
    """Caches Ready, then `seconds` of heartbeats: (passes/min by controller hook, requests/s, beats)."""
    custom = client.CustomObjectsApi(admin)
    create_caches(run, custom, caches, deadline)
    run.wait(
        "steady: READY",
        lambda: all(run.watched.status(c).get("readyNodes") == nodes for c in caches),
        deadline,
    )
    run.settle()
    run.passes.clear()
    beats = Heartbeats(NodeWriter(admin.configuration, threads=1), list(range(min(nodes, HEARTBEAT_NODES))),
                       HEARTBEAT_PERIOD)  # fmt: skip
    before, started = apiserver_metrics.read(admin), time.monotonic()
    with beats:
        time.sleep(seconds)  # the measured window itself
    elapsed = time.monotonic() - started
    run.gather()
    rates = per_second(apiserver_metrics.delta(before, apiserver_metrics.read(admin)), elapsed)
    per_minute = {k: v * 60 / elapsed for k, v in run.passes.items()}
    return per_minute, rates, beats.sent


def report(shape: str, samples: dict[str, list[float]], calls: list[tuple[str, int, float]],
           passes: Counter[str], rounds: int, rounds_rate: dict[str, float],
           steady: tuple[dict[str, float], dict[str, float], int], run: Run, inst: Installed,
           node_bytes: int) -> None:  # fmt: skip
    print_table(
        f"scale, {shape}: seconds per phase, {rounds} rounds (chart's Metacontroller settings)",
        samples,
        recorded=False,  # the "scale" result below holds them, drawn against N
    )
    by_path: dict[str, list[tuple[int, float]]] = {}
    for path, size, secs in calls:
        by_path.setdefault(path, []).append((size, secs))
    for path, seen in sorted(by_path.items()):
        sizes, times = [s / MiB for s, _ in seen], [t for _, t in seen]
        print(f"  {path}: {len(seen)} calls ({len(seen) / rounds:.0f}/round); request MiB median "
              f"{statistics.median(sizes):.3f} max {max(sizes):.3f}; seconds median "
              f"{statistics.median(times):.3f} max {max(times):.3f}")  # fmt: skip
    print(f"  passes over {rounds} rounds: {dict(passes)}; load average now {os.getloadavg()[0]:.1f}")
    if run.failed:
        print(f"  failed hook calls: {run.failed}")
    print(f"  the stand-in's writes, all phases: {dict(run.writes)}")
    print(f"  the stand-in behind at most: {run.behind()}")
    per_minute, rates, beats = steady
    print(
        f"  steady state ({beats} heartbeats): passes/min { ({k: round(v, 1) for k, v in per_minute.items()}) }"
    )
    print(f"  API server requests/s during rounds: { {k: round(v, 1) for k, v in rounds_rate.items()} }")
    print(f"  API server requests/s in steady state: { {k: round(v, 2) for k, v in rates.items()} }")
    hooks_rss, standin_rss = hooks_peak_rss(inst.hooks.process.pid), run.last.peak_rss_mib
    if isinstance(run.standin, RealMetacontroller):
        heap = run.extra["metacontroller_heap_mib"] = {"peak": run.standin.peak_heap_mib,
                                                        "now": run.standin.heap_mib()}  # fmt: skip
        print(
            f"  Metacontroller's Go heap in use: at most {heap['peak']:.0f} MiB, {heap['now']:.0f} MiB at the end"
        )
    print(f"  peak RSS MiB: hooks {hooks_rss:.0f}, stand-in {standin_rss:.0f}; client limiter waited "
          f"{run.last.limiter_wait_s:.0f} s over {run.last.limiter_requests} requests")  # fmt: skip
    record("scale", shape, {
        "seconds": samples, "node_bytes": node_bytes, "rounds": rounds,
        "hook_calls": {p: {"calls": len(v), "max_bytes": max(s for s, _ in v),
                           "median_bytes": statistics.median(s for s, _ in v),
                           "median_seconds": statistics.median(t for _, t in v),
                           "max_seconds": max(t for _, t in v)} for p, v in by_path.items()},
        "passes_per_minute_steady": per_minute, "requests_per_second_rounds": rounds_rate,
        "requests_per_second_steady": rates, "hooks_peak_rss_mib": hooks_rss, "standin_peak_rss_mib": standin_rss,
        "load_average": os.getloadavg()[0], "failed_hook_calls": run.failed, "create_failures": run.create_failures, "errors": run.errors,
        "standin_backlog": run.backlog, "standin_queue_depth": run.queue_depth, **run.extra,
    })  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--caches", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--steady", type=float, default=60.0, help="seconds of heartbeats measured")
    parser.add_argument("--pods", type=int, default=0, help="annotated Pods created during the first roll")
    parser.add_argument("--restart", action="store_true", help="then roll the node DaemonSet (every agent)")
    parser.add_argument(
        "--other-pods", type=int, default=0, metavar="N",
        help="write N running Pods that use no cache first (what Metacontroller caches anyway)",
    )  # fmt: skip
    parser.add_argument(
        "--metacontroller", type=Path, metavar="BINARY",
        help="run this Metacontroller binary (built from its v4.17.2 source) instead of the stand-in",
    )  # fmt: skip
    parser.add_argument(
        "--deadline", type=float, default=900.0, help="seconds a phase may take before it counts as not done"
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop the control plane and the hooks
    for nodes in args.nodes:
        measure(
            nodes,
            args.caches,
            args.rounds,
            args.steady,
            args.deadline,
            args.pods,
            args.restart,
            args.metacontroller,
            args.other_pods,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
