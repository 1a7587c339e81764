"""Chart wiring of peer-to-peer distribution: secret (reused across upgrades), flags, ports, policy."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from typing import Any

import helm_python as helm
import pytest
from kubernetes import client
from praesto.agent import cli as agent_cli
from praesto.agent import daemon
from praesto.agent.peers.config import build_peering

from praesto import names
from praesto.store import StoreLayout
from tests.support.helm_chart import (
    CHART_DIR,
    NAMESPACE,
    RELEASE,
    find,
    one,
    parse_manifests,
    render,
    render_objects,
)
from tests.support.kube import KubeEmulator
from tests.support.kube_discovery import discovery_front

PEER_SECRET = f"{RELEASE}-node-agent-peer"


def pod_spec(objects: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    return spec


def test_agent_gets_pod_ip_port_and_the_secret_no_other_container_does(tmp_path: Any) -> None:
    objects = render_objects({"nodeAgent": {"peers": {"port": 9200, "maxUploads": 3, "uploadRate": "200Mi"}}})
    secret = one(objects, "Secret", PEER_SECRET)
    value = base64.b64decode(secret["data"]["secret"])
    assert len(value) >= 32
    spec = pod_spec(objects)
    containers = {c["name"]: c for c in spec["containers"]}
    agent = containers.pop("agent")
    assert {"name": "peers", "containerPort": 9200, "protocol": "TCP"} in agent["ports"]
    env = {e["name"]: e for e in agent["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    volume = next(v for v in spec["volumes"] if v.get("secret", {}).get("secretName") == PEER_SECRET)
    mount = next(m for m in agent["volumeMounts"] if m["name"] == volume["name"])
    assert mount["readOnly"] is True
    # the node identity: a Pod-bound token for the peer audience only, in the agent container only
    projected = next(v for v in spec["volumes"] if v["name"] == "peer-token")["projected"]["sources"]
    assert projected == [
        {
            "serviceAccountToken": {
                "path": "token",
                "audience": names.PEER_TOKEN_AUDIENCE,
                "expirationSeconds": 3600,
            }
        }
    ]
    token_mount = next(m for m in agent["volumeMounts"] if m["name"] == "peer-token")
    assert token_mount["readOnly"] is True
    for other in containers.values():
        mounted = {m["name"] for m in other.get("volumeMounts", [])}
        assert volume["name"] not in mounted and "peer-token" not in mounted
    assert f"--peer-service-account={NAMESPACE}/{spec['serviceAccountName']}" in agent["args"]

    # the real agent parser accepts the flags, and they build a working peer config
    (tmp_path / "peer").mkdir()
    secret_file = tmp_path / "peer" / "secret"
    secret_file.write_bytes(value)
    token_file = tmp_path / "peer" / "token"
    token_file.write_text("header.payload.signature")
    env = {"NODE_NAME": "w1", "POD_IP": "127.0.0.1"}
    expanded = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in agent["args"]]
    expanded = [a.replace(mount["mountPath"] + "/secret", str(secret_file)) for a in expanded]
    expanded = [a.replace(token_mount["mountPath"] + "/token", str(token_file)) for a in expanded]
    args = agent_cli.build_parser(with_run=True).parse_args(expanded)
    assert daemon.check_arguments(args) is None
    assert (args.peer_port, args.peer_address, args.peer_max_uploads) == (9200, "127.0.0.1", 3)
    peering = build_peering(args, client.ApiClient(), StoreLayout(tmp_path))
    assert peering is not None
    try:
        assert peering.address == "127.0.0.1:9200"
        assert peering.config.limits.rate == 200 << 20 and peering.config.secret == value
        assert peering.credentials.token() == "header.payload.signature"
    finally:
        peering.server.server_close()


def test_network_policy_lets_only_agents_reach_the_peer_port() -> None:
    policy = one(render_objects(), "NetworkPolicy", f"{RELEASE}-node-agent")
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector["app.kubernetes.io/component"] == "node-agent"
    rules = {tuple(p["port"] for p in r["ports"]): r.get("from") for r in policy["spec"]["ingress"]}
    assert rules[("metrics", "healthz")] is None
    assert rules[("peers",)] == [{"podSelector": {"matchLabels": selector}}]
    assert not find(
        render_objects({"nodeAgent": {"peers": {"networkPolicy": {"enabled": False}}}}),
        "NetworkPolicy",
        f"{RELEASE}-node-agent",
    )


def test_peers_disabled_renders_no_secret_port_or_flags() -> None:
    objects = render_objects({"nodeAgent": {"peers": {"enabled": False}}})
    assert not find(objects, "Secret", PEER_SECRET)
    assert not find(objects, "NetworkPolicy", f"{RELEASE}-node-agent")
    agent = pod_spec(objects)["containers"][0]
    assert not [a for a in agent["args"] if "peer" in a]
    assert "POD_IP" not in {e["name"] for e in agent["env"]}
    assert not find(render_objects({"nodeAgent": {"enabled": False}}), "Secret", PEER_SECRET)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"nodeAgent": {"peers": {"prot": 1}}}, "additional properties 'prot' not allowed"),
        ({"nodeAgent": {"peers": {"uploadRate": "fast"}}}, "/nodeAgent/peers/uploadRate"),
        ({"nodeAgent": {"peers": {"port": 0}}}, "/nodeAgent/peers/port"),
        ({"nodeAgent": {"peers": {"maxUploads": 0}}}, "/nodeAgent/peers/maxUploads"),
    ],
)
def test_values_schema_checks_peer_values(values: dict[str, Any], expected: str) -> None:
    with pytest.raises(helm.HelmValuesError) as err:
        render(values)
    assert expected in str(err.value)


@pytest.fixture
def cluster() -> Iterator[tuple[KubeEmulator, str]]:
    with KubeEmulator() as emulator, discovery_front(emulator) as url:
        yield emulator, url


def cluster_render(url: str, *, upgrade: bool) -> list[dict[str, Any]]:
    with helm.Chart.load(CHART_DIR) as chart, helm.Config(kube_apiserver=url, namespace=NAMESPACE) as config:
        rendered = config.render(
            chart, {}, name=RELEASE, namespace=NAMESPACE, is_install=not upgrade, is_upgrade=upgrade
        )
    return parse_manifests(rendered)


def test_the_secret_survives_upgrades(cluster: tuple[KubeEmulator, str]) -> None:
    """A rolling upgrade must not split agents into groups that refuse each other (lookup reuse)."""
    emulator, url = cluster
    first = one(cluster_render(url, upgrade=False), "Secret", PEER_SECRET)
    assert one(cluster_render(url, upgrade=True), "Secret", PEER_SECRET)["data"] != first["data"]  # control
    emulator.create(first)
    for _ in range(2):
        assert one(cluster_render(url, upgrade=True), "Secret", PEER_SECRET)["data"] == first["data"]
