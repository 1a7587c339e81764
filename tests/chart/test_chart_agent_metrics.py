"""Issue 21 item 19: every agent's /metrics (every tenant's namespaces and cache names) was open to
any Pod. By default nobody outside the agent's Pod reads it: the agent answers /metrics only to
loopback clients (`--metrics-from=local`) and the chart's NetworkPolicy admits no Pod to the port.
`nodeAgent.metrics.allowedNamespaces` (or `.from`) opens both to the scrapers named, and only them.

The chart is rendered by the real Helm engine; its flags go through the real agent parser to the
real metrics server, asked over real sockets from a loopback and from a non-loopback address."""

from __future__ import annotations

import http.client
import re
import socket
import urllib.error
import urllib.request
from typing import Any

import helm_python as helm
import pytest
from praesto.agent import cli as agent_cli
from praesto.agent.coldstart_reporter import PodStartMetrics
from praesto.agent.metrics import AgentMetrics, is_local
from praesto.agent.settings import AgentSettings

from testkit.helm_chart import RELEASE, one, render, render_objects

POLICY = f"{RELEASE}-node-agent"
TENANT = {"namespace": "team-secret", "model_cache": "unreleased-model"}


def agent_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    spec = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    found: dict[str, Any] = next(c for c in spec["containers"] if c["name"] == "agent")
    return found


def ingress_by_port(objects: list[dict[str, Any]]) -> dict[tuple[str, ...], Any]:
    policy = one(objects, "NetworkPolicy", POLICY)
    return {tuple(p["port"] for p in r["ports"]): r.get("from", "anyone") for r in policy["spec"]["ingress"]}


def own_address() -> str:
    """This host's address on a non-loopback interface (what another Pod would come from)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.254", 9))  # no packet is sent: only the route is looked up
        except OSError:
            pytest.skip("no non-loopback IPv4 route on this host")
        address = str(probe.getsockname()[0])
    if is_local(address):
        pytest.skip("no non-loopback IPv4 address on this host")
    return address


def served(values: dict[str, Any]) -> int:
    """The agent's metrics server as the chart configures it (on a free port)."""
    args_text = agent_container(render_objects(values))["args"]
    env = {"NODE_NAME": "w1", "POD_IP": "127.0.0.1", "POD_NAME": "a", "POD_UID": "u"}
    expanded = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in args_text]
    args = agent_cli.build_parser(True, {}).parse_args(expanded)
    settings = AgentSettings.from_args(args, {})  # no refusal
    metrics = AgentMetrics.create()
    metrics.evictions.labels("ttl").inc()
    PodStartMetrics(metrics.registry).starts.labels(**TENANT, result="hit").inc()
    return metrics.serve(0, settings.metrics.address, settings.metrics.allowed_from)


def fetch(source: str, port: int, path: str) -> tuple[int, str]:
    """GET `path` from the agent's port, connecting from `source`."""
    target = "127.0.0.1" if source.startswith("127.") else source
    opener = urllib.request.build_opener(_SourceHandler(source))
    try:
        with opener.open(f"http://{target}:{port}{path}", timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


class _SourceHandler(urllib.request.HTTPHandler):
    def __init__(self, source: str) -> None:
        super().__init__()
        self.source = source

    def http_open(self, req: Any) -> Any:
        def connection(host: str, **kw: Any) -> http.client.HTTPConnection:
            return http.client.HTTPConnection(host, source_address=(self.source, 0), **kw)

        return self.do_open(connection, req)


def test_by_default_metrics_answer_only_inside_the_pod() -> None:
    outside = own_address()
    port = served({})
    # another Pod: refused, told which chart value lets a scraper in; nothing of the tenants leaks
    status, body = fetch(outside, port, "/metrics")
    assert status == 403 and "nodeAgent.metrics.allowedNamespaces" in body
    assert "team-secret" not in body and "unreleased-model" not in body
    # the kubelet's readiness probe (from the node's address) still gets its answer
    assert fetch(outside, port, "/healthz") == (200, "ok\n")
    # inside the Pod (kubectl port-forward connects there): everything
    status, body = fetch("127.0.0.1", port, "/metrics")
    assert status == 200 and 'namespace="team-secret"' in body and 'model_cache="unreleased-model"' in body


def test_a_listed_monitoring_namespace_may_scrape() -> None:
    outside = own_address()
    port = served({"nodeAgent": {"metrics": {"allowedNamespaces": ["monitoring"]}}})
    status, body = fetch(outside, port, "/metrics")
    assert status == 200 and 'model_cache="unreleased-model"' in body
    assert fetch(outside, port, "/nothing")[0] == 404


def test_default_policy_admits_no_pod_to_the_metrics_port() -> None:
    objects = render_objects()
    rules = ingress_by_port(objects)
    assert not [ports for ports in rules if "metrics" in ports]  # no rule: no Pod may connect
    assert rules[("healthz",)] == "anyone"
    agent = agent_container(objects)
    assert "--metrics-from=local" in agent["args"]
    probe = agent["readinessProbe"]["httpGet"]
    assert (probe["path"], probe["port"]) == ("/healthz", "metrics")


def test_allowed_namespaces_and_peers_admit_exactly_those() -> None:
    extra = {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "prometheus"}}}
    objects = render_objects(
        {"nodeAgent": {"metrics": {"allowedNamespaces": ["monitoring", "obs"], "from": [extra]}}}
    )
    rules = ingress_by_port(objects)
    selector = {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["monitoring", "obs"]}
        ]
    }
    assert rules[("metrics",)] == [{"namespaceSelector": selector}, extra]
    assert "--metrics-from=any" in agent_container(objects)["args"]
    only_from = render_objects({"nodeAgent": {"metrics": {"from": [extra]}}})
    assert ingress_by_port(only_from)[("metrics",)] == [extra]


def test_without_the_policy_the_port_is_open_but_the_agent_still_refuses() -> None:
    objects = render_objects({"nodeAgent": {"metrics": {"networkPolicy": {"enabled": False}}}})
    assert ingress_by_port(objects)[("metrics",)] == "anyone"
    assert "--metrics-from=local" in agent_container(objects)["args"]


def test_the_policy_stays_for_metrics_when_peers_are_off() -> None:
    rules = ingress_by_port(render_objects({"nodeAgent": {"peers": {"enabled": False}}}))
    assert set(rules) == {("healthz",)}


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (
            {"nodeAgent": {"metrics": {"allowedNamespaces": ["Monitoring"]}}},
            "/nodeAgent/metrics/allowedNamespaces",
        ),
        (
            {"nodeAgent": {"metrics": {"allowed": ["monitoring"]}}},
            "additional properties 'allowed' not allowed",
        ),
        ({"nodeAgent": {"metrics": {"from": ["monitoring"]}}}, "/nodeAgent/metrics/from"),
    ],
)
def test_values_schema_checks_metrics_values(values: dict[str, Any], expected: str) -> None:
    with pytest.raises(helm.HelmValuesError) as err:
        render(values)
    assert expected in str(err.value)


@pytest.mark.parametrize(
    ("host", "local"),
    [("127.0.0.1", True), ("127.3.2.1", True), ("::1", True), ("::ffff:127.0.0.1", True),
     ("10.0.0.7", False), ("::ffff:10.0.0.7", False), ("fd00::1", False), ("", False)],
)  # fmt: skip
def test_only_loopback_is_inside_the_pod(host: str, local: bool) -> None:
    assert is_local(host) is local
