"""docs/metrics.md lists every metric the processes register, and nothing else.

The registries are built the way the processes build them (testkit/metrics_doc.py: the agent's
`daemon.build`, the hooks' `create_app`); the doc's tables are generated from them, and the check
fails naming each metric (with its labels) the doc lacks and each one it lists that no process
registers. The CSI plugin registers none: it must not start without the doc saying so."""

from __future__ import annotations

import ast
import subprocess
import sys

from prometheus_client import CollectorRegistry, Counter

from testkit import metrics_doc
from testkit.helm_chart import CHART_DIR, ROOT

PROSE = [
    ROOT / "docs" / "metrics.md",
    CHART_DIR / "README.md",
    ROOT / "docs" / "user-guide.md",
    ROOT / "README.md",
]


def test_the_doc_lists_exactly_what_the_processes_register() -> None:
    """The check the doc prints, run as printed (from the repository root)."""
    done = subprocess.run(
        [sys.executable, "-m", "testkit.metrics_doc", "--check"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "python -m testkit.metrics_doc --check" in (ROOT / "docs" / "metrics.md").read_text()


def test_the_check_names_an_undocumented_metric_and_a_stale_one() -> None:
    found = metrics_doc.tables()
    text = metrics_doc.rewrite((ROOT / "docs" / "metrics.md").read_text(), found)
    assert metrics_doc.differences(text, found) == []
    registry = CollectorRegistry()
    Counter(
        "praesto_agent_new_things", "A metric added in the code", ["namespace", "kind"], registry=registry
    )
    added = {**found, "praesto-agent run": [*found["praesto-agent run"], *metrics_doc.inventory(registry)]}
    stale = text.replace("praesto_agent_cache_hits_total", "praesto_agent_old_hits_total")
    problems = metrics_doc.differences(stale, added)
    assert "undocumented: praesto_agent_new_things_total{namespace,kind} (counter)" in problems
    assert "undocumented: praesto_agent_cache_hits_total{} (counter)" in problems
    assert "documented but registered by no process: praesto_agent_old_hits_total" in problems
    relabelled = text.replace(
        "| `praesto_agent_evictions_total` | counter | `cause` |",
        "| `praesto_agent_evictions_total` | counter | - |",
    )
    assert any(
        p.startswith("out of date: praesto_agent_evictions_total{cause}")
        for p in metrics_doc.differences(relabelled, found)
    )


def test_both_serving_processes_register_metrics() -> None:
    found = metrics_doc.tables()
    assert {m.name for m in found["praesto-agent run"]} >= {
        "praesto_agent_copies",
        "praesto_pod_model_starts",
    }
    assert {m.name for m in found["praesto-hooks"]} == {
        "praesto_hooks_requests",
        "praesto_hooks_request_duration_seconds",
    }


def test_the_csi_plugin_registers_no_metric() -> None:
    """Were it to, its registry would belong in testkit/metrics_doc.py's PROCESSES and the doc."""
    importing = []
    for path in (ROOT / "csi").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            modules += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(m.split(".")[0] == "prometheus_client" for m in modules):
                importing.append(str(path.relative_to(ROOT)))
    assert importing == []


def test_every_metric_name_the_docs_mention_is_registered() -> None:
    known = metrics_doc.sample_names() | metrics_doc.histogram_names()
    wrong: dict[str, list[str]] = {}
    for path in PROSE:
        for name in metrics_doc.names_in(path.read_text()):
            matches = any(k.startswith(name[:-1]) for k in known) if name.endswith("*") else name in known
            if not matches:
                wrong.setdefault(str(path.relative_to(ROOT)), []).append(name)
    assert wrong == {}, f"metric names no process registers: {wrong}"
