"""Chart wiring of peer-to-peer distribution: per-node token grant and policy, flags, ports."""

from __future__ import annotations

import re
from typing import Any

import helm_python as helm
import pytest
from kubernetes import client
from praesto.agent import cli as agent_cli
from praesto.agent.kube import Door
from praesto.agent.peers.auth import Pod
from praesto.agent.peers.config import build_peering
from praesto.agent.peers.limits import Limits
from praesto.agent.settings import AgentSettings, SettingsError

from praesto import names, rbac
from praesto.store import StoreLayout
from testkit.helm_chart import NAMESPACE, RELEASE, find, one, render, render_objects

PEER = f"{RELEASE}-node-agent-peer"
ENV_VALUES = {"NODE_NAME": "w1", "POD_IP": "127.0.0.1", "POD_NAME": "a", "POD_UID": "u"}


def pod_spec(objects: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    return spec


def test_agent_gets_pod_ip_name_uid_and_port_and_no_shared_secret(tmp_path: Any) -> None:
    """Issue 21 item 12: no shared secret any more; the agent mints tokens bound to its own Pod."""
    objects = render_objects({"nodeAgent": {"peers": {"port": 9200, "maxUploads": 3, "uploadRate": "200Mi"}}})
    assert not [o for o in find(objects, "Secret") if "peer" in o["metadata"]["name"]]
    spec = pod_spec(objects)
    containers = {c["name"]: c for c in spec["containers"]}
    agent = containers.pop("agent")
    assert {"name": "peers", "containerPort": 9200, "protocol": "TCP"} in agent["ports"]
    env = {e["name"]: e for e in agent["env"]}
    fields = {
        name: env[name]["valueFrom"]["fieldRef"]["fieldPath"] for name in ("POD_IP", "POD_NAME", "POD_UID")
    }
    assert fields == {"POD_IP": "status.podIP", "POD_NAME": "metadata.name", "POD_UID": "metadata.uid"}
    assert not [v for v in spec["volumes"] if "peer" in v["name"]]
    assert f"--peer-service-account={NAMESPACE}/{spec['serviceAccountName']}" in agent["args"]

    # the real agent parser accepts the flags, and they build a working peer config
    env_values = {"NODE_NAME": "w1", "POD_IP": "127.0.0.1", "POD_NAME": "a", "POD_UID": "u"}
    expanded = [re.sub(r"\$\((\w+)\)", lambda m: env_values[m.group(1)], a) for a in agent["args"]]
    args = agent_cli.build_parser(True, {}).parse_args(expanded)
    settings = AgentSettings.from_args(args, {})  # no refusal
    assert (args.peer_port, args.peer_address, args.peer_max_uploads) == (9200, "127.0.0.1", 3)
    peering = build_peering(
        settings.peers, Door(client.ApiClient()), settings.node_name, StoreLayout(tmp_path)
    )
    assert peering is not None
    try:
        assert peering.address == "127.0.0.1:9200"
        assert peering.config.limits.rate == 200 << 20
        assert peering.config.pod == Pod(NAMESPACE, "a", "u", spec["serviceAccountName"])
    finally:
        peering.server.server_close()
    missing = agent_cli.build_parser(True, {}).parse_args([*expanded, "--pod-name=", "--pod-uid=u"])
    with pytest.raises(SettingsError) as refused:
        AgentSettings.from_args(missing, {})
    problem = str(refused.value)
    assert problem is not None and "--pod-name" in problem and "metadata.name" in problem


def test_the_agent_may_mint_tokens_for_itself_only_bound_to_its_own_pod() -> None:
    objects = render_objects()
    sa = pod_spec(objects)["serviceAccountName"]
    role = one(objects, "Role", PEER)
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["serviceaccounts/token"],
            "resourceNames": [sa],
            "verbs": ["create"],
        }
    ]
    assert {(p.group, p.resource, v) for p in rbac.AGENT_PEERS for v in p.verbs} == {
        ("", "serviceaccounts/token", "create")
    }
    binding = one(objects, "RoleBinding", PEER)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}]
    policy = one(objects, "ValidatingAdmissionPolicy", f"{PEER}-tokens")
    text = str(policy["spec"])
    assert names.TOKEN_EXTRA_POD_NAME in text and names.TOKEN_EXTRA_POD_UID in text
    assert names.peer_audience("") in text
    assert one(objects, "ValidatingAdmissionPolicyBinding", f"{PEER}-tokens")["spec"][
        "validationActions"
    ] == ["Deny"]


def test_network_policy_lets_only_agents_reach_the_peer_port() -> None:
    policy = one(render_objects(), "NetworkPolicy", f"{RELEASE}-node-agent")
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector["app.kubernetes.io/component"] == "node-agent"
    rules = {tuple(p["port"] for p in r["ports"]): r.get("from") for r in policy["spec"]["ingress"]}
    assert rules[("healthz",)] is None  # metrics: tests/chart/test_chart_agent_metrics.py
    assert rules[("peers",)] == [{"podSelector": {"matchLabels": selector}}]
    unrestricted = one(
        render_objects({"nodeAgent": {"peers": {"networkPolicy": {"enabled": False}}}}),
        "NetworkPolicy",
        f"{RELEASE}-node-agent",
    )
    assert {"ports": [{"port": "peers", "protocol": "TCP"}]} in unrestricted["spec"]["ingress"]


def test_connection_limits_and_deadlines_reach_the_peer_server(tmp_path: Any) -> None:
    """Issue 21 item 13: the chart's values become the server's Limits; its defaults are Limits'."""
    values = {
        "maxConnections": 64,
        "maxConnectionsPerClient": 5,
        "idleTimeoutSeconds": 20,
        "requestTimeoutSeconds": 4.5,
        "minSendRate": "1Mi",
    }
    for peers, expected in (
        ({}, Limits()),
        (values, Limits(
            max_connections=64, max_connections_per_client=5, idle_seconds=20, request_seconds=4.5,
            min_send_rate=1 << 20,
        )),
    ):  # fmt: skip
        agent = pod_spec(render_objects({"nodeAgent": {"peers": peers}}))["containers"][0]
        expanded = [re.sub(r"\$\((\w+)\)", lambda m: ENV_VALUES[m.group(1)], a) for a in agent["args"]]
        args = agent_cli.build_parser(True, {}).parse_args(expanded)
        settings = AgentSettings.from_args(args, {})  # no refusal
        peering = build_peering(
            settings.peers, Door(client.ApiClient()), settings.node_name, StoreLayout(tmp_path)
        )
        assert peering is not None
        try:
            assert peering.config.limits == expected
        finally:
            peering.server.server_close()
    args = agent_cli.build_parser(True, {}).parse_args(
        [*expanded, "--peer-max-connections=10", "--peer-max-connections-per-client=11"]
    )
    with pytest.raises(SettingsError) as refused:
        AgentSettings.from_args(args, {})
    problem = str(refused.value)
    assert problem is not None and problem.startswith("--peer-max-connections-per-client: 11")


def test_peers_disabled_renders_no_port_or_peer_flags_but_keeps_the_broker_token_grant() -> None:
    objects = render_objects({"nodeAgent": {"peers": {"enabled": False}}})
    # the credentials broker's tokens are minted the same way (hooks/broker.py): grant and policy stay
    assert find(objects, "Role", PEER) and find(objects, "ValidatingAdmissionPolicy", f"{PEER}-tokens")
    ingress = one(objects, "NetworkPolicy", f"{RELEASE}-node-agent")["spec"]["ingress"]
    assert not [r for r in ingress if r["ports"][0]["port"] == "peers"]
    agent = pod_spec(objects)["containers"][0]
    # only the agent's account, which the broker's tokens need too
    assert [a.partition("=")[0] for a in agent["args"] if "peer" in a] == ["--peer-service-account"]
    assert "POD_IP" not in {e["name"] for e in agent["env"]}
    assert {"POD_NAME", "POD_UID"} <= {e["name"] for e in agent["env"]}
    assert not find(render_objects({"nodeAgent": {"enabled": False}}), "Role", PEER)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"nodeAgent": {"peers": {"prot": 1}}}, "additional properties 'prot' not allowed"),
        ({"nodeAgent": {"peers": {"uploadRate": "fast"}}}, "/nodeAgent/peers/uploadRate"),
        ({"nodeAgent": {"peers": {"port": 0}}}, "/nodeAgent/peers/port"),
        ({"nodeAgent": {"peers": {"maxUploads": 0}}}, "/nodeAgent/peers/maxUploads"),
        (
            {"nodeAgent": {"peers": {"maxConnectionsPerClient": 0}}},
            "/nodeAgent/peers/maxConnectionsPerClient",
        ),
        ({"nodeAgent": {"peers": {"requestTimeoutSeconds": 0}}}, "/nodeAgent/peers/requestTimeoutSeconds"),
        ({"nodeAgent": {"peers": {"minSendRate": "slow"}}}, "/nodeAgent/peers/minSendRate"),
    ],
)
def test_values_schema_checks_peer_values(values: dict[str, Any], expected: str) -> None:
    with pytest.raises(helm.HelmValuesError) as err:
        render(values)
    assert expected in str(err.value)
