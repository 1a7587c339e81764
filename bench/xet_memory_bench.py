"""The agent's memory for a first download through Xet: many large files at once (xetmemory.py).

    python -m bench.xet_memory_bench [--size-mib 1024] [--files 16] [--rounds 3]

A model of `--files` incompressible files (bench/xet_bench.py's shards: every range of such a file
is a whole xorb of up to 64 MiB) uploaded by the real hf_xet to the CAS double, then downloaded
through Xet by a fresh process per round (its own peak RSS, VmHWM, less what it held before the
download: the downloader alone, not the doubles), interleaved: with the agent's range budget
(`xetmemory.RANGE_MEMORY_BYTES`), without one (what the agent did before it), and through
`resolve/` (the baseline); each with `MALLOC_ARENA_MAX=2`, as the image runs it. Seconds are
noisy on a shared machine; the memory is the figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import bench.xet_bench as xet_bench
from bench.common import ROUNDS, interleaved, print_table
from bench.xet_bench import REPO, Link, MiB, served
from testkit.dockerfile import image_env

CONTENDERS = {"xet, range budget": "budget", "xet, unbounded": "unbounded", "resolve/": "resolve"}


def child(endpoint: str, commit: str, dest: str, mode: str) -> None:
    """One download in this process; prints {"seconds", "peak_mib"} (VmHWM less the RSS before)."""
    from praesto.agent.download.api import Options
    from praesto.agent.download.fetch import download, plan
    from praesto.agent.download.origins.huggingface import xetmemory

    from praesto import store
    from praesto.spec import Source
    from testkit.egress import LOOPBACK

    if mode == "unbounded":
        xetmemory.RANGES.limit = 1 << 62
    layout = store.StoreLayout(Path(dest))
    options = Options(endpoint=endpoint, egress=LOOPBACK, xet=mode != "resolve", blobs_dir=layout.blobs_dir)
    wanted = plan(Source("hf", REPO, commit, (), ()), options)
    before = _status("VmRSS")
    started = time.monotonic()
    download(wanted, Path(dest) / "copy", options)
    took = time.monotonic() - started
    print(json.dumps({"seconds": took, "peak_mib": (_status("VmHWM") - before) / 1024}))


def _status(field: str) -> int:
    """A field of /proc/self/status in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def run(work: Path, endpoint: str, commit: str, mode: str) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="node-", dir=work) as dest:
        out = subprocess.run(
            [sys.executable, "-m", "bench.xet_memory_bench", "--child", endpoint, commit, dest, mode],
            env={**os.environ, **image_env()},  # as the image runs it: MALLOC_ARENA_MAX
            check=True,
            capture_output=True,
            text=True,
            timeout=900,
        )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return float(result["seconds"]), float(result["peak_mib"])


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        child(*sys.argv[2:6])
        return 0
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--workdir", default="/var/tmp", help="on the disk to measure")
    args = parser.parse_args()
    xet_bench.SHARDS = args.files  # the models' shape: `--files` shards of the model's size
    link = Link()
    link.rate = 0  # uncapped: the downloader's own pace
    with tempfile.TemporaryDirectory(prefix="praesto-xet-memory-", dir=args.workdir) as tmp:
        work = Path(tmp)
        with served(work, args.size_mib * MiB, link) as (hub, _, commits):

            def contender(mode: str) -> Callable[[], tuple[float, float]]:
                return lambda: run(work, hub.endpoint, commits[0], mode)

            contenders = {name: contender(mode) for name, mode in CONTENDERS.items()}
            samples = interleaved(contenders, max(ROUNDS, args.rounds))
    title = f"Xet first download, {args.files} files of {args.size_mib // args.files} MiB, uncapped"
    print_table(f"{title}: downloader peak RSS above its start, MiB", {
        k: [m for _, m in v] for k, v in samples.items()}, unit="MiB", digits=0)  # fmt: skip
    print_table(f"{title}: seconds", {k: [s for s, _ in v] for k, v in samples.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
