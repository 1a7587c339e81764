"""The downloader's settings: read once from the environment at the process edge, then passed down
(#23 item 3). The extra CA bundle reaches byte fetches through Options, not the environment."""

from __future__ import annotations

import http.server
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from praesto.agent.download.api import EngineSettings
from praesto.agent.download.http import Transient, Transport
from praesto.agent.download.settings import DownloadSettings

from testkit.egress import LOOPBACK
from testkit.pki import CertificateAuthority


def test_settings_read_the_variables_the_job_sets() -> None:
    env = {
        "HF_ENDPOINT": "https://mirror.example",
        "HF_TOKEN": "hf_secret_value",
        "PRAESTO_CA_BUNDLE": "/etc/praesto/ca/ca.crt",
        "PRAESTO_TERMINATION_LOG": "/dev/termination-log",
        "AWS_ROLE_ARN": "arn:aws:iam::1:role/r",
    }
    settings = DownloadSettings.from_env(env)
    assert settings == DownloadSettings(
        hf_endpoint="https://mirror.example",
        tokens={"hf": "hf_secret_value"},
        ca_bundle="/etc/praesto/ca/ca.crt",
        termination_log="/dev/termination-log",
        environment=EngineSettings.from_environment(env),
    )
    assert settings.token_for("hf") == "hf_secret_value" and settings.token_for("ms") is None
    assert "hf_secret_value" not in repr(settings) and "arn:aws" not in repr(settings)
    ms = DownloadSettings.from_env(
        {"MODELSCOPE_API_TOKEN": "ms_secret", "MODELSCOPE_ENDPOINT": "https://ms.example"}
    )
    assert ms.token_for("ms") == "ms_secret" and ms.token_for("hf") is None
    assert ms.modelscope_endpoint == "https://ms.example" and "ms_secret" not in repr(ms)
    assert DownloadSettings.from_env({"HF_ENDPOINT": "", "HF_TOKEN": ""}).hf_endpoint is None


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def private_origin(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An HTTPS origin whose certificate only a private CA vouches for: (url, that CA's file)."""
    ca = CertificateAuthority(tmp_path / "pki", "private-ca")
    pair = ca.issue("origin", common_name="127.0.0.1", hosts=("127.0.0.1",))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pair.cert_path, pair.key_path)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/blob", ca.cert_path
    finally:
        server.shutdown()
        server.server_close()


def test_the_ca_bundle_comes_through_the_transport_not_the_environment(
    private_origin: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, ca_file = private_origin
    monkeypatch.setenv("PRAESTO_CA_BUNDLE", str(ca_file))  # ignored below the edge now
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    trusting = Transport("", None, timeout=10, ca_bundle=str(ca_file), egress=LOOPBACK)
    try:
        assert trusting.request("HEAD", url, authorized=False).status == 200
    finally:
        trusting.close()
    untrusting = Transport("", None, timeout=10, egress=LOOPBACK)
    try:
        with pytest.raises(Transient, match="CERTIFICATE_VERIFY_FAILED"):
            untrusting.request("HEAD", url, authorized=False)
    finally:
        untrusting.close()
