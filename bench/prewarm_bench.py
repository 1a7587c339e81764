"""spec.prewarm: reading a whole model through its read-only bind mount, cold vs prewarmed, same run.

    sudo python -m bench.prewarm_bench [--size-mib 1024] [--head-start 2.0] [--rounds 3]

A model of a few shards (config + safetensors-sized files) is laid out as a
complete node copy and bind-mounted read-only like the CSI driver does. Each
round, for each contender (interleaved, rotating who goes first):

1. `sync` and drop the page cache (`echo 1 > /proc/sys/vm/drop_caches`, root):
   the copy is on disk only, as on a node where it was downloaded long ago;
2. t=0 is the mount (NodePublish). With prewarm the node agent's own code
   (`praesto.agent.prewarm.Prewarmer`, the same call the agent makes) starts
   reading the copy in the background here;
3. after `--head-start` seconds, which stand for the gap between the mount and
   the model server's first read (container start, runtime imports; seconds to
   tens of seconds for real servers), the "model server" reads every file
   through the mount in 16 MiB reads, in path order.

Timed: the whole read (first byte to last) and the first byte alone. A third
contender starts the load only 0.25 s after the mount, while the prewarm is
still reading (a server that starts fast); `warm` reads a copy already in the
page cache: the floor prewarm can reach. The ratio cold/prewarm says how much
of the load prewarm took off.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from praesto.agent.prewarm import Prewarmer, PrewarmResult
from praesto.csi import mounts, storefs

from bench.common import interleaved, print_table, ratio, sync
from praesto import names, store

NAMESPACE, CACHE = "bench", "model"
READ = 16 << 20


def make_copy(layout: store.StoreLayout, size: int) -> Path:
    """A complete node copy: config, tokenizer and four equal shards (random bytes, as weights are)."""
    cache = layout.cache_dir(NAMESPACE, CACHE)
    cache.mkdir(parents=True)
    files = {"config.json": 1 << 10, "tokenizer.json": 2 << 20}
    shard = (size - sum(files.values())) // 4
    files.update({f"model-0000{i}-of-00004.safetensors": shard for i in range(1, 5)})
    chunk = os.urandom(8 << 20)
    for rel, length in files.items():
        with open(cache / rel, "wb") as handle:
            left = length
            while left:
                left -= handle.write(chunk[: min(left, len(chunk))])
    manifest = {"files": [{"path": rel, "size": length} for rel, length in sorted(files.items())]}
    (cache / names.MANIFEST_FILE).write_text(json.dumps(manifest))
    (cache / names.COMPLETE_FILE).write_text("")
    return cache


def drop_page_cache() -> None:
    sync()
    Path("/proc/sys/vm/drop_caches").write_text("1\n")


def model_load(target: Path) -> tuple[float, float, int]:
    """(seconds to first byte, seconds for all bytes, bytes) of reading every file the way a loader does."""
    buffer = bytearray(READ)
    start = time.perf_counter()
    first = 0.0
    total = 0
    for path in sorted(p for p in target.rglob("*") if p.is_file() and not p.name.startswith(".praesto")):
        with open(path, "rb", buffering=0) as handle:
            while got := handle.readinto(buffer):
                if not first:
                    first = time.perf_counter() - start
                total += got
    return first, time.perf_counter() - start, total


def run(cache: Path, target: Path, head_start: float, mode: str) -> tuple[float, float, PrewarmResult | None]:
    """One model load through the mount; `mode` is cold, prewarm or warm."""
    if mode == "warm":
        model_load(target)  # everything in the page cache first
    else:
        drop_page_cache()
    done: list[PrewarmResult] = []
    prewarmer = Prewarmer()
    if mode == "prewarm":
        assert prewarmer.start((NAMESPACE, CACHE), cache, done.append)  # t=0: the mount
    time.sleep(head_start)  # the model server is starting
    first, whole, _bytes = model_load(target)
    prewarmer.stop(timeout=60)
    return first, whole, done[0] if done else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024, help="model size (default %(default)s MiB)")
    parser.add_argument("--head-start", type=float, default=2.0, help="seconds from mount to model load")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path("/var/tmp"))
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("prewarm_bench: dropping the page cache and bind mounts need root", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="prewarm-bench-", dir=args.workdir))
    layout = store.StoreLayout(work / "store")
    target = work / "pod" / "models"
    target.mkdir(parents=True)
    try:
        cache = make_copy(layout, args.size_mib << 20)
        with storefs.store_dir(layout.base, (NAMESPACE, CACHE)) as fd:
            assert fd is not None
            mounts.bind_read_only(f"/proc/self/fd/{fd}", str(target))
        late = min(args.head_start, 0.25)
        runs = {
            "cold": ("cold", args.head_start),
            "prewarm": ("prewarm", args.head_start),
            f"prewarm, load at {late:g}s": ("prewarm", late),  # the load overlaps the prewarm
            "warm": ("warm", args.head_start),
        }
        contenders: dict[str, Callable[[], tuple[float, float, PrewarmResult | None]]] = {
            label: functools.partial(run, cache, target, head, mode) for label, (mode, head) in runs.items()
        }
        results = interleaved(contenders, args.rounds)
        print(
            f"model {args.size_mib} MiB in 6 files, read through a read-only bind mount in 16 MiB reads; "
            f"head start {args.head_start:g}s from mount to model load; page cache dropped before cold and "
            f"prewarm runs; {args.rounds} rounds interleaved; {os.cpu_count()} CPUs"
        )
        model = f"a {args.size_mib} MiB model read through the CSI bind mount"
        print_table(
            f"{model}: whole model read (first byte to last)",
            {k: [r[1] for r in v] for k, v in results.items()},
        )
        print_table(
            f"{model}: time to first byte",
            {k: [r[0] for r in v] for k, v in results.items()},
            scale=1e3,
            unit="ms",
        )
        prewarms = [r[2] for r in results["prewarm"] if r[2] is not None]  # the full head start
        if prewarms:
            print_table(
                f"{model}: prewarm itself (background, from the mount)",
                {"prewarm": [p.seconds for p in prewarms]},
            )
            cut = sorted({p.stopped or "done" for p in prewarms})
            print(
                f"  prewarm read {min(p.bytes_read for p in prewarms) >> 20} MiB at least ({', '.join(cut)})"
            )
        whole = {k: [r[1] for r in v] for k, v in results.items()}
        print(f"ratio cold/prewarm (whole read, medians): {ratio(whole['cold'], whole['prewarm']):.2f}x")
        overlap = whole[f"prewarm, load at {late:g}s"]
        print(
            f"ratio cold/prewarm with the load at {late:g}s (medians): {ratio(whole['cold'], overlap):.2f}x"
        )
        print(f"ratio prewarm/warm (whole read, medians): {ratio(whole['prewarm'], whole['warm']):.2f}x")
    finally:
        if mounts.mounts_at(mounts.read_mountinfo(), str(target)):
            mounts.unmount(str(target), mounts.MNT_DETACH)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
