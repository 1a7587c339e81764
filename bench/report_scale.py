"""docs/benchmarks.md's "Scale" section, from what bench.scale_bench recorded (kind "scale", one per shape).

Each figure is drawn against N (selected Nodes) on log axes: seconds per phase (median, whiskers
min to max), the largest hook request per hook path, and the peak RSS of the hooks and of the
Metacontroller stand-in; tables below give every figure with its range.
"""

from __future__ import annotations

import math
import re
import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.common import plain

Result = dict[str, Any]
MiB = 1 << 20
INTRO = (
    "Caches over N GPU-shaped Nodes (80 feature-discovery labels, 50 images, written by kubelet, NFD, CNI "
    "and controller-manager; the size as the API server returns one is in the first table) on the real "
    "kube-apiserver, etcd and kube-controller-manager, with the chart's controllers run by the Metacontroller "
    "stand-in at the chart's Metacontroller args (client rate limit modelled: testkit/client_rate_limit.py), "
    "praesto-hooks from the installed wheel, and a fake agent per node reporting through the agent's status "
    "writer (bench/scale_agents.py). Everything shares this one machine's CPUs, so the times are an upper "
    "bound for a real control plane; the rate limit's share is N/qps at most. The machine was shared with "
    "other work while these ran (benches under `nice -n 5`; the load average at the end of each is in "
    "a table below), so read the times as noisy. With several caches each is in a namespace of its own "
    "(bench/scale_bench.py `home`). Shapes that stopped say where and why in the last table; "
    "docs/scale.md has the design note for going past the envelope."
)


def _shape(result: Result) -> tuple[int, int]:
    """(caches, nodes) from a title like `1 cache x 1000 nodes`."""
    caches = re.search(r"(\d+) caches?", result["title"])
    nodes = re.search(r"(\d+) nodes", result["title"])
    return (int(caches.group(1)) if caches else 1, int(nodes.group(1)) if nodes else 0)


def _series(result: Result) -> str:
    """The shape with N left out: its points against N form one line (`1 cache x N nodes`)."""
    return re.sub(r"\d+ nodes", "N nodes", str(result["title"]))


def _short(series: str) -> str:
    """A legend's name for a series: the shape's extras abbreviated."""
    short = re.sub(r", \d+ Pods admitted during the roll", " +Pods", series)
    return short.replace(", node DaemonSet rolled", " +rollout").replace(" x N nodes", "")


def _cell(values: list[float], unit: str = "s") -> str:
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return "not reached"
    missed = len(values) - len(finite)
    text = f"{plain(statistics.median(finite))} {unit} [{plain(min(finite))}-{plain(max(finite))}]"
    return text + (f" ({missed} not reached)" if missed else "")


def _total(rates: dict[str, float]) -> float:
    return sum(rates.values())


def _more_panels(axes: Any, members: list[Result], xs: list[int], suffix: str) -> None:
    """Hook calls per round, API server requests/s, and admission latency where it was measured."""
    for path in sorted({p for r in members for p in r["hook_calls"]}):
        pts = [(x, r["hook_calls"][path]["calls"] / r["rounds"]) for x, r in zip(xs, members, strict=True)
               if path in r["hook_calls"]]  # fmt: skip
        axes[3].plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{path}{suffix}")
    for key, label in (("requests_per_second_rounds", "rounds"), ("requests_per_second_steady", "steady")):
        axes[4].plot(xs, [_total(r[key]) for r in members], marker="o", label=f"{label} (top verbs){suffix}")
    rolled = [(x, r["restart"]) for x, r in zip(xs, members, strict=True) if "restart" in r]
    if rolled:
        axes[4].plot([x for x, _ in rolled], [_total(r["requests_per_second"]) for _, r in rolled], marker="^",
                     label=f"DaemonSet rollout{suffix}")  # fmt: skip
    admitted = [(x, r["admission"]) for x, r in zip(xs, members, strict=True) if "admission" in r]
    for key in ("p50_ms", "p99_ms"):
        if admitted:
            axes[5].plot([x for x, _ in admitted], [a[key] for _, a in admitted], marker="o",
                         label=f"Pod CREATE {key[:3]} during a roll{suffix}")  # fmt: skip


def _figure(results: list[Result], out: Path, where: str) -> None:
    fig, grid = plt.subplots(2, 3, figsize=(14, 8.4))
    axes = list(grid.flat)
    groups: dict[str, list[Result]] = {}
    for result in results:
        groups.setdefault(_series(result), []).append(result)
    for series, members in sorted(groups.items()):
        members.sort(key=lambda r: _shape(r)[1])
        xs = [_shape(r)[1] for r in members]
        suffix = "" if len(groups) == 1 else f" ({_short(series)})"
        for phase in members[0]["seconds"]:
            mids, low, high, kept = [], [], [], []
            for x, r in zip(xs, members, strict=True):
                finite = [v for v in r["seconds"].get(phase, []) if not math.isnan(v)]
                if finite:
                    mid = statistics.median(finite)
                    mids.append(mid)
                    low.append(mid - min(finite))
                    high.append(max(finite) - mid)
                    kept.append(x)
            axes[0].errorbar(kept, mids, yerr=[low, high], marker="o", capsize=3, label=phase + suffix)
        paths = sorted({p for r in members for p in r["hook_calls"]})
        for path in paths:
            pts = [(x, r["hook_calls"][path]["max_bytes"] / MiB) for x, r in zip(xs, members, strict=True)
                   if path in r["hook_calls"]]  # fmt: skip
            axes[1].plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{path} (max){suffix}")
        failed = [(x, p, f["max_bytes"] / MiB) for x, r in zip(xs, members, strict=True)
                  for p, f in (r.get("failed_hook_calls") or {}).items()]  # fmt: skip
        for path in sorted({p for _, p, _ in failed}):
            pts = [(x, size) for x, p, size in failed if p == path]
            axes[1].plot([p[0] for p in pts], [p[1] for p in pts], "x", markersize=9,
                         label=f"{path} (failed){suffix}")  # fmt: skip
        axes[2].plot(
            xs, [r["hooks_peak_rss_mib"] for r in members], marker="o", label=f"praesto-hooks{suffix}"
        )
        axes[2].plot(xs, [r["standin_peak_rss_mib"] for r in members], marker="s", label=f"stand-in{suffix}")
        _more_panels(axes, members, xs, suffix)
    axes[1].axhline(
        16, color="red", linestyle="--", linewidth=1, label="praesto-hooks request limit (16 MiB)"
    )
    axes[1].axhline(1, color="grey", linestyle=":", linewidth=1, label="target (1 MiB)")
    axes[2].axhline(384, color="grey", linestyle=":", linewidth=1, label="hooks target (384 MiB)")
    titles = ("seconds per phase", "hook request MiB", "peak RSS MiB", "hook calls per round",
              "API server requests/s", "admission ms")  # fmt: skip
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("Nodes selected (N)")
        ax.set_title(title, fontsize=10)
        if ax.has_data():
            ax.legend(fontsize=5.5, framealpha=0.6)
    fig.text(0.01, 0.01, f"python -m bench.scale_bench (commands below the figure) — {where}", fontsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)


def scale_section(results: list[Result], figures: Path, where: str) -> list[str]:
    if not results:
        return []
    results = sorted(results, key=_shape)
    where = results[-1].get("machine") or where
    name = "scale-against-n.png"
    _figure(results, figures / name, where)
    commands = sorted({r["command"] for r in results})
    lines = ["## Scale: caches over N GPU-shaped Nodes, chart's Metacontroller settings", "", INTRO, ""]
    lines += [f"`{c}` — {where}" for c in commands] + ["", f"![scale against N](benchmarks/{name})", ""]
    phases = list(results[0]["seconds"])
    lines += ["| shape | Node as returned | " + " | ".join(phases) + " | rounds |"]
    lines += ["|---" * (len(phases) + 3) + "|"]
    for r in results:
        cells = [_cell(r["seconds"].get(p, [])) for p in phases]
        lines.append(
            f"| {r['title']} | {r['node_bytes'] / 1024:.1f} KiB | "
            + " | ".join(cells)
            + f" | {r['rounds']} |"
        )
    lines += [
        "",
        "| shape | hook | calls per round | request MiB median / max | seconds per call median / max |",
    ]
    lines += ["|---|---|---|---|---|"]
    for r in results:
        for path, c in sorted(r["hook_calls"].items()):
            lines.append(
                f"| {r['title']} | `{path}` | {plain(c['calls'] / r['rounds'])} | "
                f"{plain(c['median_bytes'] / MiB)} / {plain(c['max_bytes'] / MiB)} | "
                f"{plain(c['median_seconds'])} / {plain(c['max_seconds'])} |"
            )
    lines += [
        "",
        "| shape | passes per minute, steady state with heartbeats | hooks peak RSS | stand-in peak RSS "
        "| load average at the end |",
    ]
    lines += ["|---|---|---|---|---|"]
    for r in results:
        passes = (
            ", ".join(f"{k}: {plain(v)}" for k, v in sorted(r["passes_per_minute_steady"].items())) or "none"
        )
        lines.append(
            f"| {r['title']} | {passes} | {plain(r['hooks_peak_rss_mib'])} MiB | "
            f"{plain(r['standin_peak_rss_mib'])} MiB | {plain(r.get('load_average', math.nan))} |"
        )
    lines += [
        "",
        "| shape | API server requests/s over the rounds (top) | in steady state (top) |",
        "|---|---|---|",
    ]
    for r in results:
        rounds = ", ".join(f"{k} {plain(v)}" for k, v in r["requests_per_second_rounds"].items())
        steady = ", ".join(f"{k} {plain(v)}" for k, v in r["requests_per_second_steady"].items())
        lines.append(f"| {r['title']} | {rounds} | {steady} |")
    return [*lines, "", *_admission_table(results), *_restart_table(results), *_broken_table(results)]


def _broken_table(results: list[Result]) -> list[str]:
    """Where a shape stopped: copies reached, and each hook path's failed calls with the first reason."""
    broken = [r for r in results if r.get("failed_hook_calls") or "reached" in r or r.get("create_failures")]
    if not broken:
        return []
    lines = [
        "| shape | reached | hook | failed calls | largest failed request | first failure |",
        "|---|---|---|---|---|---|",
    ]
    for r in broken:
        reached = r.get("reached") or {}
        got = f"{plain(reached['copies'])} of {plain(reached['of'])} copies" if reached else "every phase"
        for path, f in sorted((r.get("failed_hook_calls") or {"-": {}}).items()):
            size = f"{plain(f['max_bytes'] / MiB)} MiB" if f else "-"
            why = str(f.get("error", "-")).replace("|", "/").replace("<", "").replace(">", "")
            lines.append(f"| {r['title']} | {got} | `{path}` | {plain(f.get('calls', 0))} | {size} | {why} |")
        if r.get("create_failures"):
            first = str(r["create_failures"][0]).replace("|", "/")
            lines.append(
                f"| {r['title']} | {got} | ModelCache CREATE | {len(r['create_failures'])} | - | {first} |"
            )
    return [*lines, ""]


def _admission_table(results: list[Result]) -> list[str]:
    measured = [r for r in results if "admission" in r]
    if not measured:
        return []
    lines = [
        "| shape | Pods created during the roll | admitted / failed / not mutated | admitted before the roll "
        "ended | Pods/s (peak in one second) | CREATE p50 / p99 / max |",
        "|---|---|---|---|---|---|",
    ]
    for r in measured:
        a = r["admission"]
        lines.append(
            f"| {r['title']} | {plain(a['pods'])} | {plain(a['admitted'])} / {plain(a['failed'])} / "
            f"{plain(a['not_mutated'])} | {plain(a['admitted_while_rolling'])} | {plain(a['per_second'])} "
            f"({plain(a['peak_per_second'])}) | {plain(a['p50_ms'])} / {plain(a['p99_ms'])} / "
            f"{plain(a['max_ms'])} ms |"
        )
    return [*lines, ""]


def _restart_table(results: list[Result]) -> list[str]:
    measured = [r for r in results if "restart" in r]
    if not measured:
        return []
    lines = [
        "| shape | DaemonSet rollout: seconds | API server requests (all, top) | per agent | hook passes / "
        "calls / MiB | errors |",
        "|---|---|---|---|---|---|",
    ]
    for r in measured:
        d = r["restart"]
        agents = max(1, d["agents"])
        total = ", ".join(f"{k} {plain(n)}" for k, n in d["requests"].items())
        per = ", ".join(f"{k} {plain(n / agents)}" for k, n in d["requests"].items() if n >= agents / 2)
        passes = sum(d["passes"].values())
        lines.append(
            f"| {r['title']} | {plain(d['seconds'])} | {total} | {per} | {plain(passes)} / "
            f"{plain(d['hook_calls'])} / {plain(d['hook_bytes'] / MiB)} | {len(d['errors'])} |"
        )
    return [*lines, ""]
