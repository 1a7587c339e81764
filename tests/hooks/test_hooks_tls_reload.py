"""praesto-hooks reads its certificate, key and webhook client CA at every TLS handshake.

That is why the chart keeps them out of the Pod template's checksums (chart README, "Upgrades:
what rolls": live): a certificate cert-manager renewed, a self-signed one regenerated, or a new
`webhooks.clientAuth.caBundle` reaches the running process when the kubelet updates the volume,
with no restart. The real `praesto-hooks` serves files laid out as the kubelet lays out a Secret or
ConfigMap volume (`<name> -> ..data/<name>`, `..data -> ..<timestamp>`), and they are swapped the
way the kubelet's atomic writer swaps them: one rename of the `..data` link.
"""

from __future__ import annotations

import os
import socket
import ssl
import urllib.error
import urllib.request
from pathlib import Path

from cryptography import x509

from testkit.pki import CertificateAuthority
from testkit.server import TlsFiles, hooks_server

HOST = "127.0.0.1"


class KubeletVolume:
    """A directory with the kubelet's atomic-writer layout; `write` publishes a new set of files at once."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.generation = 0
        root.mkdir(parents=True)

    def write(self, files: dict[str, bytes]) -> None:
        self.generation += 1
        payload = self.root / f"..gen_{self.generation}"
        payload.mkdir()
        for name, data in files.items():
            (payload / name).write_bytes(data)
            link = self.root / name
            if not link.is_symlink():
                link.symlink_to(Path("..data") / name)
        staged = self.root / "..data_tmp"
        staged.symlink_to(payload.name)
        os.replace(staged, self.root / "..data")

    def path(self, name: str) -> Path:
        return self.root / name


def serving_files(ca: CertificateAuthority, name: str) -> dict[str, bytes]:
    pair = ca.issue(name, common_name=HOST, hosts=(HOST, "localhost"))
    return {"tls.crt": pair.cert_path.read_bytes(), "tls.key": pair.key_path.read_bytes()}


def served_certificate(url: str) -> x509.Certificate:
    """The certificate the server presents on a new connection."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection((HOST, port), timeout=10) as raw, context.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def answers(url: str, server_ca: Path, client: tuple[Path, Path]) -> bool:
    """Whether /healthz answers a client presenting `client` (cert, key): the server checks a presented
    certificate against its --client-ca-file and ends the handshake on one it does not trust."""
    context = ssl.create_default_context(cafile=str(server_ca))
    context.load_cert_chain(str(client[0]), str(client[1]))
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=10, context=context) as response:
            return bool(response.status == 200)
    except (ssl.SSLError, urllib.error.URLError, ConnectionError):
        return False


def test_a_renewed_serving_certificate_is_served_without_a_restart(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path / "pki")
    volume = KubeletVolume(tmp_path / "tls")
    first = serving_files(ca, "first")
    volume.write(first)
    files = TlsFiles(ca.cert_path, volume.path("tls.crt"), volume.path("tls.key"))
    with hooks_server(tmp_path / "run", tls=True, tls_files=files) as server:
        assert served_certificate(server.base_url) == x509.load_pem_x509_certificate(first["tls.crt"])
        renewed = serving_files(ca, "renewed")
        volume.write(renewed)
        assert served_certificate(server.base_url) == x509.load_pem_x509_certificate(renewed["tls.crt"])
        assert server.process.poll() is None


def test_a_new_webhook_client_ca_is_trusted_without_a_restart(tmp_path: Path) -> None:
    serving_ca = CertificateAuthority(tmp_path / "pki", "serving-ca")
    pair = serving_ca.issue("tls", common_name=HOST, hosts=(HOST,))
    old_ca = CertificateAuthority(tmp_path / "old-client-pki", "old-client-ca")
    new_ca = CertificateAuthority(tmp_path / "new-client-pki", "new-client-ca")
    old_client = old_ca.issue("apiserver", common_name="kube-apiserver", client=True)
    new_client = new_ca.issue("apiserver", common_name="kube-apiserver", client=True)
    volume = KubeletVolume(tmp_path / "webhook-client-ca")
    volume.write({"ca.crt": old_ca.pem})
    files = TlsFiles(serving_ca.cert_path, pair.cert_path, pair.key_path)
    args = ("--client-ca-file", str(volume.path("ca.crt")))
    with hooks_server(tmp_path / "run", tls=True, tls_files=files, extra_args=args) as server:
        old = (old_client.cert_path, old_client.key_path)
        new = (new_client.cert_path, new_client.key_path)
        assert answers(server.base_url, serving_ca.cert_path, old)
        assert not answers(server.base_url, serving_ca.cert_path, new)
        volume.write({"ca.crt": new_ca.pem})
        assert answers(server.base_url, serving_ca.cert_path, new)
        assert not answers(server.base_url, serving_ca.cert_path, old)
