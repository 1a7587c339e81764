"""Shared benchmark helpers: interleaved rounds, spreads, ratios of medians, timed children.

Every benchmark compares contenders run interleaved in one invocation (round 1: A, B,
C; round 2: B, C, A; ...), so a slow spell of a shared machine hits each of them, and
reports min/median/max per contender plus the ratio of medians. One module, so the
bench files do not each grow their own formatting.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

ROUNDS = 3  # the least any benchmark runs (issue #14: no single lucky run)
T = TypeVar("T")
# `make bench` (bench/all.py) sets it: every table printed is also appended there as one JSON line,
# from which bench/report.py draws docs/benchmarks.md. Read once, here.
ENV_RESULTS = "PRAESTO_BENCH_RESULTS"
RESULTS_PATH = os.environ.get(ENV_RESULTS)


def machine() -> str:
    """CPU model and how many CPUs this process may use: the figures hold for this machine only
    (recorded with every result, and named under it on the page)."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {len(os.sched_getaffinity(0))} CPUs"


def record(kind: str, title: str, data: Mapping[str, object]) -> None:
    """Append one result (a table of samples, or a series) to the results file, if one is set."""
    if not RESULTS_PATH:
        return
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    command = " ".join(["python -m", spec.name, *sys.argv[1:]] if spec else ["python", *sys.argv])
    line = {
        "kind": kind,
        "command": command,
        "title": title,
        "time": time.time(),
        "machine": machine(),
        **data,
    }
    with open(RESULTS_PATH, "a") as out:
        out.write(json.dumps(line) + "\n")


def interleaved(contenders: Mapping[str, Callable[[], T]], rounds: int = ROUNDS) -> dict[str, list[T]]:
    """Run each contender once per round, rotating who goes first; samples per contender."""
    names = list(contenders)
    samples: dict[str, list[T]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            samples[name].append(contenders[name]())
    return samples


def spread(
    samples: list[float], *, scale: float = 1.0, unit: str = "s", width: int = 7, digits: int = 2
) -> str:
    """`min .. median .. max` of `samples` (times `scale`), e.g. seconds or `scale=1e3, unit="ms"`."""
    lo, mid, hi = (v * scale for v in (min(samples), statistics.median(samples), max(samples)))
    return f"min {lo:{width}.{digits}f}  median {mid:{width}.{digits}f}  max {hi:{width}.{digits}f} {unit}"


def plain(value: float) -> str:
    """A number as a reader writes it: 3 significant digits below 100, whole numbers above (1,024, not
    1.02e+03), never an exponent (0.0000000853, not 8.53e-08), no trailing zeros; "not reached" for a NaN
    (a phase past its deadline)."""
    if math.isnan(value):
        return "not reached"
    if value == 0 or math.isinf(value):
        return f"{value:g}"
    magnitude = math.floor(math.log10(abs(value)))
    if magnitude >= 2:
        return f"{value:,.0f}"
    text = f"{value:.{2 - magnitude}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def median(samples: list[float]) -> float:
    return statistics.median(samples)


def ratio(numerator: list[float], denominator: list[float]) -> float:
    """Ratio of medians (never of single runs)."""
    return statistics.median(numerator) / statistics.median(denominator)


def print_table(
    title: str, samples: Mapping[str, list[float]], *, recorded: bool = True, **spread_args: float | int | str
) -> None:
    """One row per contender: n, then min/median/max (and, unless `recorded` is false because the bench
    records its own richer result, recorded for the report)."""
    scale = float(spread_args.get("scale", 1.0))
    if recorded:
        unit = str(spread_args.get("unit", "s"))
        scaled = {name: [v * scale for v in values] for name, values in samples.items()}
        record("table", title, {"unit": unit, "samples": scaled})
    print(title)
    width = max(len(name) for name in samples)
    for name, values in samples.items():
        print(f"  {name:{width}s}  n={len(values)}  {spread(values, **spread_args)}")  # type: ignore[arg-type]


def sync() -> None:
    subprocess.run(["sync"], check=True)


def timed_child(cmd: list[str], env: Mapping[str, str], *, fresh: Path | None = None) -> tuple[float, float]:
    """(seconds including a final `sync`, peak RSS MiB) of one child process.

    `fresh` is removed first (and the disk synced), so each run writes into an empty place.
    """
    if fresh is not None:
        shutil.rmtree(fresh, ignore_errors=True)
        sync()
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=dict(env), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    sync()
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        raise RuntimeError(f"{cmd[:4]} failed ({proc.returncode}): {err[-2000:]}")
    if proc.stderr:
        proc.stderr.close()
    return seconds, usage.ru_maxrss / 1024


def rss_mib(pid: int | None = None) -> tuple[float, float]:
    """(current RSS, peak RSS) in MiB of a process (default: this one), from /proc."""
    fields = {}
    for line in Path(f"/proc/{pid or 'self'}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields.get("VmRSS", 0.0), fields.get("VmHWM", 0.0)
