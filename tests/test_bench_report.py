"""`make bench`'s page (#24 item 4): tables recorded by the benchmarks' own `print_table` become
docs/benchmarks.md with one PNG per table and the swarm curves with measured points over them.
No benchmark runs here (nothing is timed in tests): the results are recorded by the real
recorder from fixed samples, in a child process as bench/all.py runs each benchmark, and the page
is drawn by `python -m bench.report` as `make bench` draws it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = """
from bench.common import print_table, record
print_table("seconds incl. sync, 3 interleaved rounds", {"praesto": [4.1, 4.0, 4.4], "aria2c": [6.2, 6.0, 6.9]})
print_table("seconds to all Ready (incl. sync)", {"1 node": [26.0, 27.0, 26.5], "8 nodes": [28.0, 29.0, 28.5]})
record("series", "seconds until every node holds a 2 GiB model (simulated)",
       {"x": [16, 1024], "alone": 5.4, "series": {"swarm": [6.0, 6.8], "star": [30.0, 1757.8]}})
record("field", "field shape: 140 GB", {"columns": ["N", "swarm"], "rows": [["64", "6.0 min"]],
       "note": "What others publish: ..."})
"""


def _python(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, env={"PATH": "/usr/bin:/bin", **env},
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_recorded_tables_become_a_page_with_plots(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    recorded = _python(["-c", RECORD], {"PRAESTO_BENCH_RESULTS": str(results)})
    assert recorded.returncode == 0, recorded.stderr
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    assert [r["kind"] for r in lines] == ["table", "table", "series", "field"]
    assert lines[0]["samples"]["aria2c"] == [6.2, 6.0, 6.9] and lines[0]["unit"] == "s"

    drawn = _python(["-m", "bench.report", "--results", str(results), "--out", str(tmp_path / "docs")], {})
    assert drawn.returncode == 0, drawn.stderr
    text = (tmp_path / "docs" / "benchmarks.md").read_text()
    pngs = sorted((tmp_path / "docs" / "benchmarks").glob("*.png"))
    assert len(pngs) == 3 and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    for png in pngs:
        assert f"(benchmarks/{png.name})" in text
    assert "| praesto | 4.1 s [4-4.4] | 3 |" in text  # median [min-max], n
    assert "| aria2c | 6.2 s [6-6.9] | 3 |" in text
    assert "`python -c` — " in text and " CPUs" in text  # the command, the date, the machine
    assert "| 1024 | 6.8 s (1.26x) | 1757.8 s (325.52x) |" in text
    assert (
        "| N | swarm |\n|---|---|\n| 64 | 6.0 min |\n\nWhat others publish: ..." in text
    )  # a table, no plot


def test_without_a_results_file_nothing_is_recorded_and_the_report_says_why(tmp_path: Path) -> None:
    recorded = _python(["-c", RECORD], {})
    assert recorded.returncode == 0 and "praesto" in recorded.stdout, recorded.stderr
    assert list(tmp_path.iterdir()) == []
    missing = _python(["-m", "bench.report", "--results", str(tmp_path / "none.jsonl")], {})
    assert missing.returncode == 2 and "run `make bench` first" in missing.stderr


SCALE = {
    "seconds": {"create → all copies": [2.0, 2.5, 2.2], "delete → gone": [1.0, float("nan"), 1.1]},
    "node_bytes": 26_500, "rounds": 3,
    "hook_calls": {"/hooks/modelcache/sync": {"calls": 12, "max_bytes": 3 << 20, "median_bytes": 1 << 20,
                                              "median_seconds": 0.04, "max_seconds": 0.2}},
    "passes_per_minute_steady": {"composite sync": 0.0, "decorator sync": 120.0},
    "requests_per_second_rounds": {"PATCH modelcachenodes/status": 12.5},
    "requests_per_second_steady": {"PATCH nodes/status": 2.0},
    "hooks_peak_rss_mib": 90.0, "standin_peak_rss_mib": 120.0,
}  # fmt: skip


EXTRAS = {
    **SCALE,
    "admission": {"pods": 1000, "admitted": 1000, "failed": 0, "not_mutated": 0, "seconds": 32.5,
                  "per_second": 30.8, "peak_per_second": 47, "p50_ms": 231.8, "p99_ms": 728.1, "max_ms": 974.3,
                  "admitted_while_rolling": 1000},
    "restart": {"agents": 1000, "seconds": 16.9, "copies_listed": 1000, "errors": [],
                "requests": {"WATCH modelcachenodes": 1002, "GET nodes": 1000, "PUT leases": 2},
                "requests_per_second": {"WATCH modelcachenodes": 59.3, "GET nodes": 59.2, "PUT leases": 0.1},
                "passes": {}, "hook_calls": 0, "hook_bytes": 0},
}  # fmt: skip
BROKEN = {
    **SCALE, "hook_calls": {}, "reached": {"copies": 0, "of": 2000, "readyNodes": 0},
    "failed_hook_calls": {"/hooks/modelcache/sync": {"calls": 140, "max_bytes": 45148491,
                                                     "error": "URLError: <urlopen error EOF>"}},
}  # fmt: skip


def test_numbers_read_plainly_repeated_titles_are_told_apart_and_scale_is_its_own_section(
    tmp_path: Path,
) -> None:
    """Issue 38 item 5: no `8.53e-08 x`, no two headings alike, the p2p note, and the Scale section."""
    results = tmp_path / "results.jsonl"
    script = f"""
import sys
from bench.common import print_table, record
print_table("p2p: seconds to all Ready (incl. sync)", {{"dedup": [8.53e-08, 8.53e-08, 8.53e-08], "disk": [1024.0, 1024.0, 1024.0]}},
            unit="x")
sys.argv = ["bench.download_bench", "--cold"]
print_table("p2p: seconds to all Ready (incl. sync)", {{"dedup": [1.0, 1.0, 1.0]}}, unit="x")
record("scale", "1 cache x 100 nodes", {SCALE!r})
record("scale", "1 cache x 1000 nodes", {SCALE!r})
record("scale", "1 cache x 1000 nodes, 1000 Pods admitted during the roll, node DaemonSet rolled", {EXTRAS!r})
record("scale", "1 cache x 2000 nodes", {BROKEN!r})
"""
    recorded = _python(["-c", script.replace("nan", "float('nan')")], {"PRAESTO_BENCH_RESULTS": str(results)})
    assert recorded.returncode == 0, recorded.stderr
    p2p = json.loads(results.read_text().splitlines()[0])
    p2p["command"] = "python -m bench.p2p_bench"
    results.write_text("\n".join([json.dumps(p2p), *results.read_text().splitlines()[1:]]) + "\n")
    drawn = _python(["-m", "bench.report", "--results", str(results), "--out", str(tmp_path / "docs")], {})
    assert drawn.returncode == 0, drawn.stderr
    text = (tmp_path / "docs" / "benchmarks.md").read_text()
    assert "e-0" not in text and "e+0" not in text
    assert "| dedup | 0.0000000853 x [0.0000000853-0.0000000853] | 3 |" in text
    assert "| disk | 1,024 x [1,024-1,024] | 3 |" in text
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert len(headings) == len(set(headings)), headings
    assert 'N "nodes" here are N `praesto-agent run` processes on this one machine' in text
    assert "## Scale: caches over N GPU-shaped Nodes" in text
    assert "| 1 cache x 100 nodes | 25.9 KiB | 2.2 s [2-2.5] | 1.05 s [1-1.1] (1 not reached) | 3 |" in text
    assert "| 1 cache x 1000 nodes | `/hooks/modelcache/sync` | 4 | 1 / 3 | 0.04 / 0.2 |" in text
    assert (tmp_path / "docs" / "benchmarks" / "scale-against-n.png").read_bytes()[:4] == b"\x89PNG"
    rolled = "| 1 cache x 1000 nodes, 1000 Pods admitted during the roll, node DaemonSet rolled |"
    assert f"{rolled} 1,000 | 1,000 / 0 / 0 | 1,000 | 30.8 (47) | 232 / 728 / 974 ms |" in text  # admission
    assert f"{rolled} 16.9 |" in text and "| WATCH modelcachenodes 1, GET nodes 1 | 0 / 0 / 0 | 0 |" in text
    assert "| 1 cache x 2000 nodes | 0 of 2,000 copies | `/hooks/modelcache/sync` | 140 | 43.1 MiB |" in text
