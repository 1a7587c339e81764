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
import math
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

from bench.common import machine, plain
from bench.report_scale import scale_section

PAGE = "benchmarks.md"
FIGURES = "benchmarks"  # folder beside the page
DEFAULT_RESULTS = Path("build/bench/results.jsonl")
P2P_TABLE = "seconds to all Ready (incl. sync)"  # how bench.p2p_bench's time table ends (P2P_SECONDS)
P2P_NOTE = (
    'The N "nodes" here are N `praesto-agent run` processes on this one machine ({where}), talking to each '
    "other over loopback, each behind an upload cap that stands in for its NIC: they share its CPUs and "
    "disk, so this shows the swarm's shape (time flat in N, origin bytes 1x), not a cluster's speed."
)
Result = dict[str, Any]


def load(path: Path) -> list[Result]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _date(result: Result) -> str:
    return datetime.fromtimestamp(float(result["time"]), UTC).strftime("%Y-%m-%d")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60]


def _spread(values: list[float], unit: str) -> str:
    finite = [v for v in values if not math.isnan(v)] or [math.nan]
    missed = len(values) - len([v for v in values if not math.isnan(v)])
    text = f"{plain(statistics.median(finite))} {unit} [{plain(min(finite))}-{plain(max(finite))}]"
    return text + (f", {missed} not reached" if missed else "")


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
    ax.ticklabel_format(axis="x", style="plain", useOffset=False)
    ax.set_title(result["title"], fontsize=10)
    fig.text(0.01, 0.01, f"{result['command']} — {_date(result)} — {where}", fontsize=7)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _measured_swarm(results: Iterable[Result]) -> dict[int, list[float]]:
    """bench.p2p_bench's seconds to all Ready per node count, over its one-node samples' median."""
    for result in results:
        if (
            result["kind"] == "table"
            and "p2p_bench" in result["command"]
            and result["title"].endswith(P2P_TABLE)
        ):
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


def heading(result: Result, seen: set[str]) -> str:
    """The result's title, told apart from an earlier one of the same title by the command's flags."""
    title = str(result["title"]).strip()
    if title in seen:
        flags = result["command"].split(" ", 3)[3:] or [result["command"]]
        title = f"{title} ({flags[0]})"
    seen.add(title)
    return title


def write_page(results: list[Result], out_dir: Path, where: str | None = None) -> Path:
    """docs/benchmarks.md and its PNGs; returns the page."""
    where = where or machine()  # this machine; a result recorded with its own `machine` names that one
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
        "machine named under each one: re-measure on yours before quoting them.",
        "",
    ]
    measured = _measured_swarm(results)
    headings: set[str] = set()
    for i, result in enumerate(results):
        if result["kind"] == "scale":
            continue  # drawn together below (bench/report_scale.py)
        name = f"{i:02d}-{_slug(result['command'] + ' ' + result['title'])}.png"
        title, ran_on = heading(result, headings), result.get("machine") or where
        lines += [f"## {title}", "", f"`{result['command']}` — {_date(result)} — {ran_on}", ""]
        if "p2p_bench" in result["command"] and result["title"].endswith(P2P_TABLE):
            lines += [P2P_NOTE.format(where=ran_on), ""]
        elif result["kind"] == "series" and measured:
            lines += [
                "The black squares are bench.p2p_bench's measured swarm. " + P2P_NOTE.format(where=ran_on),
                "",
            ]
        if result["kind"] == "field":
            lines += ["| " + " | ".join(result["columns"]) + " |", "|---" * len(result["columns"]) + "|"]
            lines += ["| " + " | ".join(row) + " |" for row in result["rows"]]
            lines += ["", result["note"], ""]
            continue
        if result["kind"] == "series":
            swarm_figure(result, measured, figures / name, ran_on)
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
            table_figure(result, figures / name, ran_on)
            lines += [f"![{result['title']}]({FIGURES}/{name})", "", "| contender | median [min-max] | n |"]
            lines.append("|---|---|---|")
            for contender, values in result["samples"].items():
                lines.append(f"| {contender} | {_spread(values, result['unit'])} | {len(values)} |")
        lines.append("")
    lines += scale_section([r for r in results if r["kind"] == "scale"], figures, where)
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
