"""Run every benchmark in turn (`make bench`); each prints its own ratios.

Each one measures its baseline in the same run, so the figures compare within
one invocation on this machine, never across machines.
"""

from __future__ import annotations

import os
import subprocess
import sys

BENCHMARKS = (
    "bench.hooks_bench",
    "bench.admission_bench",
    "bench.download_bench",
    "bench.reuse_bench",
    "bench.agent_scale_bench",
    "bench.objstore_bench",
    "bench.p2p_bench",
    "bench.swarm_sim",  # no network: the swarm rules projected to 1,024 nodes
    "bench.csi_bench",  # needs root for bind mounts
    "bench.prewarm_bench",  # needs root: drops the page cache, bind mounts
)


def main() -> int:
    failed = []
    for module in BENCHMARKS:
        if module in ("bench.csi_bench", "bench.prewarm_bench") and os.geteuid() != 0:
            print(f"== {module}: skipped, needs root (bind mounts, dropping the page cache)", flush=True)
            continue
        print(f"== {module}", flush=True)
        if subprocess.call([sys.executable, "-m", module]) != 0:
            failed.append(module)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
