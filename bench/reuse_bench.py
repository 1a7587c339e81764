"""Dedup and re-use on one node: origin bytes and time to Ready, against a cold download.

    python -m bench.reuse_bench [--size-mib 256] [--rounds 3]

A real node agent (testkit/agent_harness.py: the production `Agent` and `KubeApi` against
the real kube-apiserver, bytes from the local hub over HTTP, store on this disk) in this
process. Each round, in a fresh store:

* cold: a ModelCacheNode for `org/first` (a few shards + small files), from the origin;
* same source, another team: a ModelCacheNode of `org/first` at the same commit in another
  namespace: every large file linked from the blob area; the small ones (known by git SHA-1
  only) are fetched again, since their bytes are shared only within a namespace (issue 21
  item 11: agent/download/publish.py origin_key);
* second identical cache: `org/second`, another repo with identical content, created once
  the first is Ready: every large file hard-linked from the content-addressed blob area;
* rehydrate after eviction: `org/second` evicted by its unusedTTL while `org/first` (same
  blobs) stays, then a hydration request (what the CSI driver writes on a mount).

Times run from the create (or the hydration request) to the status saying Ready, as seen
by polling the API every 10 ms; the agent runs with its harness timings (0.1 s tick).
Origin bytes are what the hub served for that step. Prints min/median/max per step.

For another repo, not zero but a few bytes, by design: files below the Hub's LFS threshold
(config.json) are known to the plan only by their git blob id (SHA-1), so across repos they
are fetched again. Sharing them by SHA-1 would let a repo author who forges a SHA-1
collision plant bytes in another tenant's cache on this node; the same source at the same
commit is shared within one namespace only.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from praesto.csi.storefs import CsiStore

from bench.common import ROUNDS, median, print_table
from praesto import names, store
from testkit.agent_harness import Env, env_context
from testkit.kube_real import proxied, running_plane

MiB = 1 << 20


@contextlib.contextmanager
def _env(work: Path) -> Iterator[Env]:
    """The agent on the real API server (`make cluster-bin` builds it), behind the fault proxy."""
    with running_plane(work / "kube-plane") as plane, proxied(plane) as kube:
        yield from env_context(kube, work)


def _files(size: int) -> dict[str, bytes]:
    shards = {f"model-{i:05d}-of-00004.safetensors": os.urandom(size // 4) for i in range(4)}
    return {**shards, "config.json": b'{"model_type": "bench"}', "tokenizer.json": os.urandom(MiB)}


def _until_ready(env: Env, cache: str, namespace: str = "team-a") -> float:
    started = time.perf_counter()
    deadline = started + 300
    while env.status(cache, namespace).get("phase") != names.PHASE_READY:
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{namespace}/{cache} not Ready: {env.status(cache, namespace)}")
        time.sleep(0.01)
    return time.perf_counter() - started


def one_round(work: Path, files: dict[str, bytes]) -> dict[str, tuple[float, int]]:
    """{step: (seconds to Ready, origin bytes)} for one fresh store."""
    out: dict[str, tuple[float, int]] = {}
    with _env(work) as env:
        env.hub.add_repo("org/first", files)
        env.hub.add_repo("org/second", files)
        env.start()
        env.hub.reset_counters()
        env.create_mcn("first")
        out["cold download"] = (_until_ready(env, "first"), env.hub.bytes_served)
        CsiStore(env.layout).record_mount(
            store.MountRecord("vol-1", "team-a", "first", "/var/lib/kubelet/x", time.time())
        )
        env.hub.reset_counters()
        env.create_mcn("first", namespace="team-b", repo="org/first")
        out["same source, another team"] = (_until_ready(env, "first", "team-b"), env.hub.bytes_served)
        env.hub.reset_counters()
        env.create_mcn("second", ttl="10m")
        out["second identical cache"] = (_until_ready(env, "second"), env.hub.bytes_served)
        CsiStore(env.layout).touch_used("team-a", "second")
        env.skip(11 * 60)  # past the TTL on the agent's clock
        env.wait_phase("second", names.PHASE_EVICTED, timeout=60)
        assert not env.layout.cache_dir("team-a", "second").exists()
        env.offset = 0.0
        env.hub.reset_counters()
        CsiStore(env.layout).request_hydration("team-a", "second")
        out["rehydrate after eviction"] = (_until_ready(env, "second"), env.hub.bytes_served)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-mib", type=int, default=256, help="model size (4 shards)")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--workdir", default="/var/tmp", help="on the disk to measure")
    args = parser.parse_args()
    files = _files(args.size_mib * MiB)
    total = sum(len(d) for d in files.values())
    seconds: dict[str, list[float]] = {}
    origin: dict[str, list[int]] = {}
    for _ in range(max(ROUNDS, args.rounds)):
        with tempfile.TemporaryDirectory(prefix="praesto-reuse-", dir=args.workdir) as tmp:
            for step, (took, served) in one_round(Path(tmp), files).items():
                seconds.setdefault(step, []).append(took)
                origin.setdefault(step, []).append(served)
    print(
        f"model {total / MiB:.0f} MiB (4 shards + 2 small files), one node agent, {len(origin['cold download'])} rounds"
    )
    model = f"a {total / MiB:.0f} MiB model, one node agent"
    print_table(f"reuse of {model}: seconds from create (or hydration request) to Ready", seconds)
    print_table(
        f"reuse of {model}: origin bytes per step, as a multiple of the model (dedup and rehydration)",
        {step: [b / total for b in sent] for step, sent in origin.items()},
        unit="x",
    )
    for step, sent in origin.items():
        print(f"  {step:24s} origin bytes per round: {sent}  ({max(sent) / total:.2f}x the model at most)")
    cold, second = median(seconds["cold download"]), median(seconds["second identical cache"])
    print(f"  second identical cache: {max(origin['second identical cache'])} origin bytes (small files of another repo are refetched, see above), "
          f"median {second:.2f} s (target < 1 s), {cold / second:.1f}x faster than cold")  # fmt: skip
    print(
        f"  rehydrate with blobs on disk: {max(origin['rehydrate after eviction'])} origin bytes (target 0)"
    )
    same = median(seconds["same source, another team"])
    print(f"  same source, another team: {max(origin['same source, another team'])} origin bytes (small files only), "
          f"median {same:.2f} s (target < 1 s)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
