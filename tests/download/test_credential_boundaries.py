"""The cluster's identity never leaves the cluster's hands (multi-tenant finding 1).

Reproduction: a tenant's Secret holding only an endpoint (`GOOGLE_BASE_URL`
pointing at a server of theirs) while the node has a workload identity. Before
the fix the downloader signed its requests to that server with the cluster's
service account. Now an endpoint from a Secret is used with that Secret's own
credential or none, and a cache that names a Secret never uses the identity.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from praesto.agent.download.origins.objstore.creds import ENV_IDENTITY, store_config

from testkit.objstore_checks import run_cli, write_secret_dir
from tests.download.test_objstore_gcs import service_account_key


class Recorder(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.authorizations: list[str] = []
        self.requests = 0


class _Handler(BaseHTTPRequestHandler):
    server: Recorder

    def log_message(self, format: str, *args: object) -> None:  # quiet
        return

    def do_GET(self) -> None:
        self.server.requests += 1
        self.server.authorizations.append(self.headers.get("Authorization", ""))
        body = json.dumps({"kind": "storage#objects", "items": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def attacker() -> Iterator[Recorder]:
    server = Recorder()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_a_tenant_endpoint_never_receives_the_cluster_identity(attacker: Recorder, tmp_path: Path) -> None:
    cluster_key = tmp_path / "cluster-sa.json"
    cluster_key.write_text(service_account_key())
    endpoint = f"http://127.0.0.1:{attacker.server_address[1]}"
    secret = write_secret_dir(tmp_path / "tenant-secret", {"GOOGLE_BASE_URL": endpoint})
    done = run_cli(
        ["download", "gs://any/model", "--dest", str(tmp_path / "dest"), "--credentials-dir", str(secret)],
        {"GOOGLE_APPLICATION_CREDENTIALS": str(cluster_key), ENV_IDENTITY: "true"},
    )
    assert attacker.requests > 0, done.stderr  # the endpoint was used (anonymously) ...
    assert not any(attacker.authorizations), attacker.authorizations  # ... and got no credential


IDENTITY_ENV = {
    "s3": {"AWS_WEB_IDENTITY_TOKEN_FILE": "/var/run/token", "AWS_ROLE_ARN": "arn:aws:iam::1:role/cluster"},
    "gs": {"GOOGLE_APPLICATION_CREDENTIALS": "/var/run/cluster-sa.json", ENV_IDENTITY: "true"},
    "az": {
        "AZURE_FEDERATED_TOKEN_FILE": "/var/run/token",
        "AZURE_CLIENT_ID": "cluster",
        "AZURE_STORAGE_ACCOUNT_NAME": "acct",
    },
}
ENDPOINTS = {
    "s3": {"AWS_ENDPOINT_URL": "https://evil.example"},
    "gs": {"GOOGLE_BASE_URL": "https://evil.example"},
    "az": {"AZURE_STORAGE_ENDPOINT": "https://evil.example"},
}


@pytest.mark.parametrize("scheme", ["s3", "gs", "az"])
def test_an_endpoint_from_a_secret_goes_anonymous_without_that_secrets_credential(scheme: str) -> None:
    cfg = store_config(scheme, "b", ENDPOINTS[scheme], IDENTITY_ENV[scheme], "Secret team-b/endpoint-only")
    assert not cfg.credentialed and cfg.config.get("skip_signature") is True
    assert "role_arn" not in cfg.config and "federated_token_file" not in cfg.config


@pytest.mark.parametrize("scheme", ["s3", "gs", "az"])
def test_a_cache_with_its_own_secret_never_uses_the_cluster_identity(scheme: str) -> None:
    cfg = store_config(scheme, "b", {}, IDENTITY_ENV[scheme], "Secret team-b/empty", identity_allowed=False)
    assert not cfg.credentialed
    assert cfg.described == "no credentials"


@pytest.mark.parametrize("scheme", ["s3", "gs", "az"])
def test_the_cluster_identity_still_serves_caches_without_a_secret(scheme: str) -> None:
    cfg = store_config(scheme, "b", {}, IDENTITY_ENV[scheme], "no credentials")
    assert cfg.credentialed and cfg.described.startswith("the workload identity")
