"""Issue 21 item 1: a PVC-mode Job not entitled to the cluster identity never asks a metadata endpoint.

The Job's environment is the one the sync hook renders (chart settings with
workload identity on); the real `praesto-agent download` runs with it in a
process whose node metadata endpoints (AWS IMDS, GCE metadata, Azure managed
identity) all point at a local listener, which stands in for 169.254.169.254. A
Job that is not entitled must go anonymous: no request to the listener, for every
store. The store itself is reached through a dead proxy (no network needed): the
download fails, and only what was asked of the metadata endpoint matters.
"""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from praesto.hooks.config import HooksConfig
from praesto.hooks.pvc_job import download_job

from praesto.spec import parse_spec
from testkit.hook_objects import modelcache
from testkit.ports import free_port

# What the chart gives the hooks with credentials.identity set (charts/praesto/templates/hooks-deployment.yaml).
CHART_ENV = {
    "PRAESTO_DOWNLOADER_ENV": '{"PRAESTO_WORKLOAD_IDENTITY": "true"}',
    "PRAESTO_DOWNLOADER_SERVICE_ACCOUNT": "praesto-downloader",
    "PRAESTO_DOWNLOADER_POD_LABELS": '{"azure.workload.identity/use": "true"}',
    "PRAESTO_CREDENTIALS_NAMESPACES": "ml-prod",
    "PRAESTO_CREDENTIALS_SOURCES": "s3://models/shared/,gs://models/shared/,az://models/shared/",
}


class _Recorder(http.server.BaseHTTPRequestHandler):
    asked: list[str]

    def _answer(self) -> None:
        self.asked.append(f"{self.command} {self.path}")
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_PUT = do_POST = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def metadata() -> Iterator[tuple[str, list[str]]]:
    """A local stand-in for every cloud's metadata endpoint: (host:port, requests it got)."""
    asked: list[str] = []
    handler = type("Recorder", (_Recorder,), {"asked": asked})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()


def job_pod(namespace: str, uri: str) -> dict[str, Any]:
    """The download Job's Pod spec as the sync hook renders it with the chart's settings."""
    spec = {"source": {"uri": uri}, "storage": {"size": "1Gi", "storageClassName": "rwx"}}
    parent = modelcache("llm", namespace=namespace, spec=spec)
    job = download_job(parent, parse_spec(parent["spec"]), HooksConfig.from_env(CHART_ENV))
    return job["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def run_download(pod: dict[str, Any], uri: str, host: str, dest: Path) -> subprocess.CompletedProcess[str]:
    """`praesto-agent download` with the Job container's env, on a node whose metadata is `host`."""
    job_env = {e["name"]: e["value"] for e in pod["containers"][0]["env"] if "value" in e}
    job_env.pop("PRAESTO_TERMINATION_LOG", None)  # /dev/termination-log exists in a container only
    return subprocess.run(
        [sys.executable, "-m", "praesto.agent.cli", "download", uri, "--dest", str(dest)],
        env={**os.environ, **node_env(host), **job_env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def node_env(host: str) -> dict[str, str]:
    """Where each store's default chain would find the node's identity, and a dead proxy for the rest."""
    return {
        "AWS_METADATA_ENDPOINT": f"http://{host}",
        "GCE_METADATA_HOST": host,
        "GCE_METADATA_IP": host,
        "AZURE_MSI_ENDPOINT": f"http://{host}/msi/token",
        "AZURE_STORAGE_ACCOUNT_NAME": "models",
        "HTTPS_PROXY": f"http://127.0.0.1:{free_port()}",
        "NO_PROXY": "127.0.0.1",
    }


@pytest.mark.parametrize(
    ("namespace", "uri"),
    [
        ("team-x", "s3://models/shared/llama"),  # a namespace the admin never opted in
        ("ml-prod", "s3://models/private/llama"),  # opted in, but outside credentials.sources
        ("team-x", "gs://models/shared/llama"),
        ("ml-prod", "gs://models/private/llama"),
        ("team-x", "az://models/shared/llama"),
    ],
)
def test_an_unentitled_job_asks_no_metadata_endpoint(
    metadata: tuple[str, list[str]], tmp_path: Path, namespace: str, uri: str
) -> None:
    host, asked = metadata
    pod = job_pod(namespace, uri)
    assert "serviceAccountName" not in pod, "an unentitled Job must not run as the identity ServiceAccount"
    ran = run_download(pod, uri, host, tmp_path / "dest")
    assert ran.returncode != 0, ran.stdout  # the store is behind a dead proxy
    assert asked == [], f"{uri} from {namespace} asked the node's metadata endpoint: {asked}"


def test_the_listener_sees_a_default_chain(metadata: tuple[str, list[str]], tmp_path: Path) -> None:
    """The check above can fail: an entitled Job on S3 does use the store's default chain."""
    host, asked = metadata
    pod = job_pod("ml-prod", "s3://models/shared/llama")
    assert pod["serviceAccountName"] == "praesto-downloader"
    run_download(pod, "s3://models/shared/llama", host, tmp_path / "dest")
    assert any("/latest/api/token" in request for request in asked), asked
