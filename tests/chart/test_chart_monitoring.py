"""The chart's Prometheus Operator ServiceMonitors and Grafana dashboard (metrics.*), rendered by the
real Helm engine. The monitors must reach what the processes really serve: the agents' plain-HTTP
metrics port, which answers only listed scrapers, and the hooks' HTTPS port, verified with the chart's
own CA under a name its certificate holds. Every dashboard query must parse with Prometheus's own
parser (the real promtool) and name only metrics docs/metrics.md lists."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from cryptography import x509

from testkit import promtool
from testkit.helm_chart import CHART_DIR, RELEASE, find, one, render, render_objects
from testkit.metrics_doc import names_in, sample_names

SCRAPER = {"nodeAgent": {"metrics": {"allowedNamespaces": ["monitoring"]}}}
MONITORS = {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kps"}}}, **SCRAPER}
DASHBOARD = {"metrics": {"grafanaDashboard": {"enabled": True}}}
DASHBOARD_FILE = CHART_DIR / "files" / "dashboard.json"
# Grafana's variables, as a query sees them once substituted
GRAFANA_VARIABLES = {"$__rate_interval": "2m", "$__range": "6h", "$__interval": "1m", "$node": ".*"}
Obj = dict[str, Any]


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def selected_services(objects: list[Obj], monitor: Obj) -> list[Obj]:
    wanted = monitor["spec"]["selector"]["matchLabels"]
    return [s for s in find(objects, "Service") if matches(wanted, s["metadata"].get("labels", {}))]


def test_nothing_is_rendered_by_default() -> None:
    objects = render_objects(SCRAPER)
    assert not [o for o in objects if o["kind"] in ("ServiceMonitor", "PrometheusRule")]
    assert not [o for o in find(objects, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard")]
    assert not find(objects, "Service", f"{RELEASE}-node-agent-metrics")


def test_agent_monitor_without_a_listed_scraper_is_refused() -> None:
    with pytest.raises(helm.HelmError) as err:
        render({"metrics": {"serviceMonitor": {"enabled": True}}})
    assert "the node agents answer /metrics only to listed scrapers" in str(err.value)
    assert "set nodeAgent.metrics.allowedNamespaces to Prometheus's namespace" in str(err.value)


def test_agent_monitor_reaches_every_agent_metrics_port() -> None:
    objects = render_objects(MONITORS)
    monitor = one(objects, "ServiceMonitor", f"{RELEASE}-node-agent")
    assert monitor["metadata"]["labels"]["release"] == "kps"
    [service] = selected_services(objects, monitor)
    assert service["spec"]["clusterIP"] == "None"  # one endpoint per agent Pod
    pods = one(objects, "DaemonSet")["spec"]["template"]
    assert matches(service["spec"]["selector"], pods["metadata"]["labels"])
    [endpoint] = monitor["spec"]["endpoints"]
    [port] = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    agent = next(c for c in pods["spec"]["containers"] if c["name"] == "agent")
    assert {"name": port["targetPort"], "containerPort": 9102, "protocol": "TCP"} in agent["ports"]
    assert "--metrics-from=any" in agent["args"]  # else every scrape is answered 403
    assert (endpoint["scheme"], endpoint["path"], endpoint["honorLabels"]) == ("http", "/metrics", True)
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in endpoint[
        "relabelings"
    ]


def hooks_endpoint(values: Obj) -> tuple[list[Obj], Obj, Obj]:
    objects = render_objects(values)
    monitor = one(objects, "ServiceMonitor", f"{RELEASE}-hooks")
    [service] = selected_services(objects, monitor)
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] in [p["name"] for p in service["spec"]["ports"]]
    assert (endpoint["scheme"], endpoint["path"]) == ("https", "/metrics")
    deployment = one(objects, "Deployment", f"{RELEASE}-hooks")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert endpoint["tlsConfig"]["ca"]["secret"] == {
        "name": volumes["tls"]["secret"]["secretName"],
        "key": "ca.crt",
    }
    return objects, endpoint, service


def test_hooks_monitor_verifies_the_certificate_cert_manager_issues() -> None:
    objects, endpoint, _ = hooks_endpoint(MONITORS)
    certificate = one(objects, "Certificate")
    assert certificate["spec"]["secretName"] == endpoint["tlsConfig"]["ca"]["secret"]["name"]
    assert endpoint["tlsConfig"]["serverName"] in certificate["spec"]["dnsNames"]


def test_hooks_monitor_verifies_the_chart_generated_certificate() -> None:
    values = {**MONITORS, "webhooks": {"certManager": {"enabled": False}}}
    objects, endpoint, _ = hooks_endpoint(values)
    secret = one(objects, "Secret", endpoint["tlsConfig"]["ca"]["secret"]["name"])
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    assert endpoint["tlsConfig"]["serverName"] in cert.extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    ).value.get_values_for_type(x509.DNSName)
    cert.verify_directly_issued_by(ca)


def test_without_the_node_agent_only_the_hooks_are_monitored() -> None:
    objects = render_objects(
        {"metrics": {"serviceMonitor": {"enabled": True}}, "nodeAgent": {"enabled": False}}
    )
    assert [m["metadata"]["name"] for m in find(objects, "ServiceMonitor")] == [f"{RELEASE}-hooks"]


@pytest.mark.parametrize("interval", ["30 seconds", "1.5m", ""])
def test_schema_refuses_an_interval_prometheus_would_not_take(interval: str) -> None:
    with pytest.raises(helm.HelmValuesError) as err:
        render({"metrics": {"serviceMonitor": {"interval": interval}}})
    assert "/metrics/serviceMonitor/interval" in str(err.value)


def test_the_readme_values_file_renders_as_printed() -> None:
    section = (CHART_DIR / "README.md").read_text().partition("\n## Monitoring\n")[2].partition("\n## ")[0]
    [block] = re.findall(r"```yaml\n(.*?)```", section, re.S)
    objects = render_objects(yaml.safe_load(block))
    monitors = find(objects, "ServiceMonitor") + find(objects, "PrometheusRule")
    assert sorted(m["metadata"]["name"] for m in monitors) == [
        RELEASE,
        f"{RELEASE}-hooks",
        f"{RELEASE}-node-agent",
    ]
    assert all(m["metadata"]["labels"]["release"] == "kps" for m in monitors)
    assert one(objects, "ConfigMap", f"{RELEASE}-dashboard")["metadata"]["namespace"] == "monitoring"


# ---- Grafana dashboard ------------------------------------------------------------------------


def dashboard_queries() -> list[tuple[str, str]]:
    board = json.loads(DASHBOARD_FILE.read_text())
    queries = [(p["title"], t["expr"]) for p in board["panels"] for t in p.get("targets", [])]
    queries += [(v["name"], v["definition"]) for v in board["templating"]["list"] if "definition" in v]
    return queries


def test_dashboard_config_map_carries_the_sidecar_label_and_the_file() -> None:
    values = {"metrics": {"grafanaDashboard": {"enabled": True, "namespace": "grafana",
                                               "annotations": {"grafana_folder": "Praesto"}}}}  # fmt: skip
    config_map = one(render_objects(values), "ConfigMap", f"{RELEASE}-dashboard")
    assert config_map["metadata"]["namespace"] == "grafana"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "Praesto"}
    board = json.loads(config_map["data"]["praesto.json"])
    assert board == json.loads(DASHBOARD_FILE.read_text())
    assert (
        one(render_objects(DASHBOARD), "ConfigMap", f"{RELEASE}-dashboard")["metadata"]["namespace"]
        == "praesto-system"
    )


def test_every_panel_queries_documented_metrics_through_the_datasource_variable() -> None:
    board = json.loads(DASHBOARD_FILE.read_text())
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert all(p["datasource"]["uid"] == "${datasource}" and p.get("targets") for p in panels)
    known = sample_names()
    unknown = {
        title: sorted(names_in(expr) - known) for title, expr in dashboard_queries() if names_in(expr) - known
    }
    assert unknown == {}, "metrics docs/metrics.md does not list"
    queried = set().union(*(names_in(expr) for _, expr in dashboard_queries()))
    assert {"praesto_agent_copies", "praesto_agent_copy_bytes_done", "praesto_agent_downloaded_bytes_total",
            "praesto_scrub_mismatches_total", "praesto_hooks_requests_total",
            "praesto_hooks_request_duration_seconds_bucket"} <= queried  # fmt: skip


def test_every_dashboard_query_parses(tmp_path: Path) -> None:
    """Each query as a recording rule, which `promtool check rules` parses with Prometheus's parser."""
    rules = []
    for i, (_title, expr) in enumerate(dashboard_queries()):
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, f"a Grafana variable the test does not know: {expr}"
        if expr.startswith("label_values("):  # Grafana's own function: its metric must exist
            expr = re.sub(r"label_values\((\w+),\s*\w+\)", r"\1", expr)
        rules.append({"record": f"praesto:dashboard_query_{i}", "expr": expr})
    (tmp_path / "dashboard.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]})
    )
    done = promtool.run("check", "rules", "dashboard.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
