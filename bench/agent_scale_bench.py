"""The node agent at scale: 200 ModelCaches on one node, and one cache of 100,000 small files.

    python -m bench.agent_scale_bench [--caches 200] [--files 100000] [--rounds 3]

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
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from praesto.agent.download import Options, plan
from praesto.agent.download.publish import TREE, publish

from bench.common import ROUNDS, interleaved, median, print_table, rss_mib
from praesto import names
from praesto.spec import Source
from testkit.agent_harness import Env, env_context
from testkit.egress import LOOPBACK
from testkit.hub import LocalHub
from testkit.kube_real import proxied, running_plane

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
    print_table("  reconcile (ms)", samples, scale=1e3, unit="ms")
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
    print_table("  seconds", {"plan (model_info + tree)": plan_times["plan"], "publish": publish_times})
    print(f"  manifest {manifest_size / 2**20:.1f} MiB ({manifest_size / count:.0f} bytes per file)")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--caches", type=int, default=200)
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--workdir", default="/var/tmp")
    args = parser.parse_args()
    rounds = max(ROUNDS, args.rounds)
    with tempfile.TemporaryDirectory(prefix="praesto-scale-", dir=args.workdir) as tmp:
        bench_caches(Path(tmp), args.caches, rounds)
    with tempfile.TemporaryDirectory(prefix="praesto-files-", dir=args.workdir) as tmp:
        bench_many_files(Path(tmp), args.files, rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
