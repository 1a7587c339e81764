"""Draw docs/benchmarks.md and its plots from what `make bench` recorded.

    python -m bench.report [--results build/bench/results.jsonl] [--out docs]

Every table a benchmark prints goes through `bench.common.print_table`, which also appends it to
the results file `bench/all.py` names (one JSON line: command, title, unit, samples per
contender); `bench.swarm_sim` records its simulated curves the same way. This module only reads
that file: one figure per table (the median of each contender with a bar from min to max), the
swarm curves with `bench.p2p_bench`'s measured points drawn over them (time over one node's), and
a page that names, under each figure, the command, the date, the machine and the medians with
their ranges. matplotlib's Agg backend draws without a display.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

PAGE = "benchmarks.md"
FIGURES = "benchmarks"  # folder beside the page
DEFAULT_RESULTS = Path("build/bench/results.jsonl")
P2P_TABLE = "seconds to all Ready (incl. sync)"
Result = dict[str, Any]


def load(path: Path) -> list[Result]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def machine() -> str:
    """CPU model and how many CPUs this process may use: the figures hold for this machine only."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {len(os.sched_getaffinity(0))} CPUs"


def _date(result: Result) -> str:
    return datetime.fromtimestamp(float(result["time"]), UTC).strftime("%Y-%m-%d")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60]


def _spread(values: list[float], unit: str) -> str:
    return f"{statistics.median(values):.3g} {unit} [{min(values):.3g}-{max(values):.3g}]"


def table_figure(result: Result, out: Path, where: str) -> None:
    """Median per contender as a bar, min to max as its error bar."""
    samples: dict[str, list[float]] = result["samples"]
    names = list(samples)
    medians = [statistics.median(samples[n]) for n in names]
    low = [m - min(samples[n]) for m, n in zip(medians, names, strict=True)]
    high = [max(samples[n]) - m for m, n in zip(medians, names, strict=True)]
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(names) + 1.8))
    ax.barh(names, medians, xerr=[low, high], capsize=4, color="#4c72b0")
    ax.invert_yaxis()
    ax.set_xlabel(result["unit"])
    ax.set_title(result["title"], fontsize=10)
    fig.text(0.01, 0.01, f"{result['command']} — {_date(result)} — {where}", fontsize=7)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _measured_swarm(results: Iterable[Result]) -> dict[int, list[float]]:
    """bench.p2p_bench's seconds to all Ready per node count, over its one-node samples' median."""
    for result in results:
        if result["kind"] == "table" and "p2p_bench" in result["command"] and result["title"] == P2P_TABLE:
            counts = {
                int(name.split()[0]): v for name, v in result["samples"].items() if name.split()[0].isdigit()
            }
            if 1 in counts:
                one = statistics.median(counts[1])
                return {n: [s / one for s in v] for n, v in sorted(counts.items())}
    return {}


def swarm_figure(series: Result, measured: dict[int, list[float]], out: Path, where: str) -> None:
    """Time over one node's against N: the simulated swarm, star and every node from the origin,
    and the measured swarm (median, min to max) where bench.p2p_bench ran."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    alone = float(series["alone"])
    for label, values in series["series"].items():
        ax.plot(series["x"], [v / alone for v in values], marker="o", label=f"{label} (simulated)")
    if measured:
        xs = list(measured)
        mids = [statistics.median(v) for v in measured.values()]
        err = [
            [m - min(v) for m, v in zip(mids, measured.values(), strict=True)],
            [max(v) - m for m, v in zip(mids, measured.values(), strict=True)],
        ]
        ax.errorbar(
            xs, mids, yerr=err, fmt="s", color="black", capsize=4, label="swarm (measured, p2p_bench)"
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("nodes selected at once")
    ax.set_ylabel("time to all nodes / one node's time")
    ax.set_title(series["title"], fontsize=10)
    ax.legend(fontsize=8)
    fig.text(0.01, 0.01, f"{series['command']} — {_date(series)} — {where}", fontsize=7)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)


def write_page(results: list[Result], out_dir: Path, where: str | None = None) -> Path:
    """docs/benchmarks.md and its PNGs; returns the page."""
    where = where or machine()
    figures = out_dir / FIGURES
    figures.mkdir(parents=True, exist_ok=True)
    for old in figures.glob("*.png"):
        old.unlink()
    lines = [
        "# Benchmarks",
        "",
        "Written by `make bench` (bench/all.py, then `python -m bench.report`); do not edit by hand.",
        "Each benchmark runs its contenders interleaved in one invocation, at least 3 rounds, and",
        "reports min/median/max; bars show the median, whiskers min to max. Figures hold for the",
        f"machine named under each one ({where} here): re-measure on yours before quoting them.",
        "",
    ]
    measured = _measured_swarm(results)
    for i, result in enumerate(results):
        name = f"{i:02d}-{_slug(result['command'] + ' ' + result['title'])}.png"
        title = result["title"].strip()
        lines += [f"## {title}", "", f"`{result['command']}` — {_date(result)} — {where}", ""]
        if result["kind"] == "field":
            lines += ["| " + " | ".join(result["columns"]) + " |", "|---" * len(result["columns"]) + "|"]
            lines += ["| " + " | ".join(row) + " |" for row in result["rows"]]
            lines += ["", result["note"], ""]
            continue
        if result["kind"] == "series":
            swarm_figure(result, measured, figures / name, where)
            alone = float(result["alone"])
            lines += [
                f"![{result['title']}]({FIGURES}/{name})",
                "",
                "| N | " + " | ".join(result["series"]) + " |",
            ]
            lines.append("|---" * (len(result["series"]) + 1) + "|")
            for j, n in enumerate(result["x"]):
                cells = [f"{v[j]:.1f} s ({v[j] / alone:.2f}x)" for v in result["series"].values()]
                lines.append(f"| {n} | " + " | ".join(cells) + " |")
        else:
            table_figure(result, figures / name, where)
            lines += [f"![{result['title']}]({FIGURES}/{name})", "", "| contender | median [min-max] | n |"]
            lines.append("|---|---|---|")
            for contender, values in result["samples"].items():
                lines.append(f"| {contender} | {_spread(values, result['unit'])} | {len(values)} |")
        lines.append("")
    page = out_dir / PAGE
    page.write_text("\n".join(lines))
    return page


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    parser.add_argument("--out", type=Path, default=Path("docs"))
    args = parser.parse_args(argv)
    if not args.results.is_file():
        print(f"no results at {args.results}: run `make bench` first", file=sys.stderr)
        return 2
    print(f"wrote {write_page(load(args.results), args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
