"""The chart's alerts, checked by the real promtool (prometheus v0.316.0) on exactly what the chart
renders: `promtool check rules` on the PrometheusRule's groups, and `promtool test rules` running,
for each alert, series that fire it and series that must not (tests/chart/data/alerts_test.yaml).
Each alert's expression names only metrics and labels the processes really register
(testkit/metrics_doc.py reads them from the registries), and docs/metrics.md describes each."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit import promtool
from testkit.helm_chart import CHART_DIR, ROOT, one, render_objects
from testkit.metrics_doc import labels_by_sample, sample_names

ALERTS_FILE = CHART_DIR / "files" / "alerts.yaml"
UNIT_TESTS = Path(__file__).parent / "data" / "alerts_test.yaml"
ENABLED = {"metrics": {"prometheusRule": {"enabled": True}}}
# Labels Prometheus adds to every scraped series (the Prometheus Operator's target labels), and the
# ServiceMonitor's relabelings (test_chart_monitoring.py checks `node` is one).
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "endpoint", "container", "node"}
SELECTOR = re.compile(r"\b(praesto_[a-z0-9_]+)(?:\{([^}]*)\})?")
MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|on|without|ignoring)\s*\(([^)]*)\)")


@cache
def rendered_groups() -> dict[str, Any]:
    """The spec of the PrometheusRule the chart renders: a rule file's content."""
    spec: dict[str, Any] = one(render_objects(ENABLED), "PrometheusRule")["spec"]
    return spec


def shipped_rules() -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = yaml.safe_load(ALERTS_FILE.read_text())["groups"][0]["rules"]
    return rules


ALERTS = [rule["alert"] for rule in shipped_rules()]


@pytest.fixture(scope="module")
def rules_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The rendered rules and the unit tests, which read them instead of the chart's file."""
    folder = tmp_path_factory.mktemp("alerts")
    (folder / "alerts.yaml").write_text(yaml.safe_dump(rendered_groups(), sort_keys=False))
    tests = yaml.safe_load(UNIT_TESTS.read_text())
    tests["rule_files"] = ["alerts.yaml"]
    (folder / "alerts_test.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    return folder


def test_the_rule_is_off_by_default_and_renders_the_file_unchanged() -> None:
    assert not [o for o in render_objects() if o["kind"] == "PrometheusRule"]
    assert rendered_groups() == yaml.safe_load(ALERTS_FILE.read_text())
    labelled = one(render_objects({"metrics": {"prometheusRule": {"enabled": True, "labels": {"release": "kps"}}}}),
                   "PrometheusRule")  # fmt: skip
    assert labelled["metadata"]["labels"]["release"] == "kps"  # what kube-prometheus-stack selects rules by


def test_promtool_check_rules_accepts_the_rendered_rules(rules_dir: Path) -> None:
    done = promtool.run("check", "rules", "--lint=all", "--lint-fatal", "alerts.yaml", cwd=rules_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in done.stdout, done.stdout


@pytest.mark.parametrize("alert", ALERTS)
def test_promtool_unit_tests_of_each_alert(alert: str, rules_dir: Path) -> None:
    done = promtool.run("test", "rules", "--run", f"^{alert}: ", "alerts_test.yaml", cwd=rules_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout, done.stdout


def test_each_alert_has_a_case_that_fires_and_one_that_stays_quiet() -> None:
    cases: dict[str, dict[str, bool]] = {}
    for group in yaml.safe_load(UNIT_TESTS.read_text())["tests"]:
        alert, _, kind = group["name"].partition(": ")
        tested = {case["alertname"] for case in group["alert_rule_test"]}
        assert tested == {alert}, f"group {group['name']!r} tests {tested}, not only {alert}"
        fired = any(case["exp_alerts"] for case in group["alert_rule_test"])
        assert fired == kind.startswith("fires"), f"group {group['name']!r}: its name says {kind.split()[0]}"
        cases.setdefault(alert, {})[kind.split()[0]] = True
    assert {a: sorted(kinds) for a, kinds in cases.items()} == {a: ["fires", "quiet"] for a in ALERTS}


@pytest.mark.parametrize("rule", shipped_rules(), ids=ALERTS)
def test_each_expression_names_registered_metrics_and_their_labels(rule: dict[str, Any]) -> None:
    expr = rule["expr"]
    known = labels_by_sample()
    used = SELECTOR.findall(expr)
    assert used, f"{rule['alert']} reads no praesto metric"
    allowed = set(TARGET_LABELS)
    for name, matchers in used:
        assert name in sample_names(), (
            f"{rule['alert']}: {name} is registered by no process (docs/metrics.md)"
        )
        allowed |= known[name]
        unknown = set(MATCHER.findall(matchers)) - known[name] - TARGET_LABELS
        assert not unknown, f"{rule['alert']}: {name} has no label {unknown}"
    for grouping in GROUPING.findall(expr):
        labels = {label.strip() for label in grouping.split(",") if label.strip()}
        assert labels <= allowed | {"le"}, (
            f"{rule['alert']}: groups by {labels - allowed}, which no series has"
        )


def test_every_alert_is_documented() -> None:
    doc = (ROOT / "docs" / "metrics.md").read_text()
    assert [a for a in ALERTS if f"`{a}`" not in doc] == []
