"""Run every benchmark in turn (`make bench`); each prints its own ratios, and the tables they
print are recorded (bench/common.py) and drawn into docs/benchmarks.md (bench/report.py).

Each one measures its baseline in the same run, so the figures compare within
one invocation on this machine, never across machines.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench.common import ENV_RESULTS
from bench.report import DEFAULT_RESULTS, load, write_page

ROOT_ONLY = "needs root (bind mounts, dropping the page cache)"
BENCHMARKS: tuple[tuple[str, ...], ...] = (
    ("bench.hooks_bench",),
    ("bench.admission_bench",),
    ("bench.download_bench",),  # page cache warm for every contender
    ("bench.download_bench", "--cold", "--no-hf", "--scenarios", "uncapped"),  # cp: the disk's limit
    ("bench.reuse_bench",),
    ("bench.xet_bench",),  # issue 40 item 4 (a)-(c) through Xet and the chunk store
    ("bench.agent_scale_bench",),
    ("bench.objstore_bench",),
    ("bench.p2p_bench",),
    ("bench.swarm_sim", "--field"),  # no network: the swarm rules projected to 1,024 nodes
    ("bench.csi_bench",),  # bind mounts
    ("bench.prewarm_bench",),  # drops the page cache, bind mounts
    ("bench.oci_bench",),  # containerd's overlayfs snapshots
    ("bench.scale_bench",),  # the real control plane with 100 and 1,000 GPU-shaped Nodes (make test-scale)
)
NEEDS_ROOT = ("bench.csi_bench", "bench.prewarm_bench", "bench.oci_bench", "--cold")
RESULTS = DEFAULT_RESULTS


def main() -> int:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.unlink(missing_ok=True)
    env = {**os.environ, ENV_RESULTS: str(RESULTS.resolve())}
    failed = []
    for argv in BENCHMARKS:
        name = " ".join(argv)
        if any(part in NEEDS_ROOT for part in argv) and os.geteuid() != 0:
            print(f"== {name}: skipped, {ROOT_ONLY}", flush=True)
            continue
        print(f"== {name}", flush=True)
        if subprocess.call([sys.executable, "-m", *argv], env=env) != 0:
            failed.append(name)
    if RESULTS.is_file():
        print(f"wrote {write_page(load(RESULTS), Path('docs'))}")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
