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
    "bound for a real control plane; the rate limit's share is N/qps at most."
)


def _shape(result: Result) -> tuple[int, int]:
    """(caches, nodes) from a title like `1 cache x 1000 nodes`."""
    caches = re.search(r"(\d+) caches?", result["title"])
    nodes = re.search(r"(\d+) nodes", result["title"])
    return (int(caches.group(1)) if caches else 1, int(nodes.group(1)) if nodes else 0)


def _cell(values: list[float], unit: str = "s") -> str:
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return "not reached"
    missed = len(values) - len(finite)
    text = f"{plain(statistics.median(finite))} {unit} [{plain(min(finite))}-{plain(max(finite))}]"
    return text + (f" ({missed} not reached)" if missed else "")


def _figure(results: list[Result], out: Path, where: str) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    groups: dict[int, list[Result]] = {}
    for result in results:
        groups.setdefault(_shape(result)[0], []).append(result)
    for caches, members in sorted(groups.items()):
        members.sort(key=lambda r: _shape(r)[1])
        xs = [_shape(r)[1] for r in members]
        suffix = "" if len(groups) == 1 else f", {caches} cache(s)"
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
        axes[2].plot(
            xs, [r["hooks_peak_rss_mib"] for r in members], marker="o", label=f"praesto-hooks{suffix}"
        )
        axes[2].plot(xs, [r["standin_peak_rss_mib"] for r in members], marker="s", label=f"stand-in{suffix}")
    titles = ("seconds per phase", "hook request MiB", "peak RSS MiB")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("Nodes selected (N)")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
    fig.text(0.01, 0.01, f"{results[0]['command']} — {where}", fontsize=7)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
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
    return [*lines, ""]
