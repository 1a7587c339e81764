"""The agent's one Kubernetes client (agent/daemon.py `api_client`): built from its kubeconfig, pool sized."""

from __future__ import annotations

from pathlib import Path

from praesto.agent.kube import KUBE_CONNECTIONS, api_client

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}
users:
- name: agent
  user: {token: not-a-real-token}
contexts:
- name: agent@c
  context: {cluster: c, user: agent}
current-context: agent@c
"""


def test_the_client_keeps_enough_connections_for_watches_downloads_and_peer_checks(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    api = api_client(str(kubeconfig))
    try:
        assert api.configuration.host == "https://127.0.0.1:6443"
        assert api.configuration.auth_settings()["BearerToken"]["value"] == "Bearer not-a-real-token"
        # urllib3 keeps this many idle connections per host; the library's default is 5 per CPU
        assert api.rest_client.pool_manager.connection_pool_kw["maxsize"] == KUBE_CONNECTIONS
    finally:
        api.close()
