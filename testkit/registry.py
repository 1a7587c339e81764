"""The CNCF distribution registry (v3.1.2, built from tests/registry) on loopback, and the ORAS CLI
(v1.3.6, built beside it) that pushes to it: the origin and the client of the OCI tests.

Three shapes: plain HTTP and anonymous (`Registry(dir)`); HTTPS with a test CA (`tls=True`:
the downloader trusts `ca_path` through its CA bundle); and token auth (`grants=...`: the
registry's own `token` access controller with testkit/registry_token.py as its realm). What
the registry served is read from its own access log (`blob_bytes`), not counted by us.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from testkit import loopback_process
from testkit.controlplane import build_binaries
from testkit.pki import CertificateAuthority
from testkit.registry_token import ISSUER, SERVICE, Grants, TokenService

MODULE = "tests/registry"


def registry_binaries() -> Path:
    """build/cluster/<key>/ holding `registry` and `oras` (built on first use, cached by content);
    raises ControlPlaneUnavailable without a Go toolchain."""
    return build_binaries(MODULE)


class Registry:
    def __init__(
        self,
        workdir: Path,
        *,
        tls: bool = False,
        grants: Grants | None = None,
        names: tuple[str, ...] = (),
        realm: str | None = None,
    ) -> None:
        """`names`: more DNS names its TLS certificate holds (e.g. "ghcr.io" to stand in for it
        behind a routing CONNECT proxy, testkit/connect_proxy.py). `realm`: the token realm its
        401s name instead of the token service's (a tenant's registry sending clients elsewhere)."""
        self.workdir = workdir
        self.tls = tls
        self.names = names
        self.grants = grants
        self.realm = realm
        workdir.mkdir(parents=True, exist_ok=True)
        self.bin = registry_binaries()
        self.ca: CertificateAuthority | None = (
            CertificateAuthority(workdir / "pki", "registry-ca") if tls else None
        )
        self.token: TokenService | None = (
            TokenService(workdir, grants, tls=self.ca) if grants is not None else None
        )
        self.log_path = workdir / "registry.log"
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}"

    @property
    def ca_path(self) -> Path | None:
        return self.ca.cert_path if self.ca is not None else None

    def reference(self, repository: str, tag: str = "latest") -> str:
        """host/repository:tag, or host/repository@sha256:... for a digest."""
        return f"{self.host}/{repository}{'@' if tag.startswith('sha256:') else ':'}{tag}"

    def _config(self, port: int) -> Path:
        http: dict[str, Any] = {"addr": f"127.0.0.1:{port}", "secret": "praesto-test"}
        if self.ca is not None:
            server = self.ca.issue(
                f"registry-{port}", common_name="127.0.0.1", hosts=("127.0.0.1", "localhost", *self.names)
            )
            http["tls"] = {"certificate": str(server.cert_path), "key": str(server.key_path)}
        config: dict[str, Any] = {
            "version": 0.1,
            "log": {"level": "info", "formatter": "json", "accesslog": {"disabled": True}},
            "storage": {
                "filesystem": {"rootdirectory": str(self.workdir / "storage")},
                "delete": {"enabled": True},
            },
            "http": http,
        }
        if self.token is not None:
            config["auth"] = {
                "token": {"realm": self.realm or self.token.realm, "service": SERVICE, "issuer": ISSUER,
                          "rootcertbundle": str(self.token.ca.cert_path)}
            }  # fmt: skip
        path = self.workdir / f"config-{port}.yml"
        path.write_text(yaml.safe_dump(config))
        return path

    def __enter__(self) -> Registry:
        if self.token is not None:
            self.token.__enter__()
        scheme = "https" if self.tls else "http"
        ca = str(self.ca_path) if self.ca_path else None

        def ready_url(port: int) -> str:
            return f"{scheme}://127.0.0.1:{port}/v2/"

        self._process, self.port = loopback_process.start(
            lambda port: [str(self.bin / "registry"), "serve", str(self._config(port))],
            ready_url,
            self.log_path,
            ca_file=ca,
        )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._process is not None:
            loopback_process.stop(self._process)
        if self.token is not None:
            self.token.__exit__()

    # ---- the client --------------------------------------------------------------
    def oras(self, *args: str, cwd: Path | None = None, user: tuple[str, str] | None = None) -> str:
        """Run the ORAS CLI against this registry; its stdout, or AssertionError with its stderr."""
        flags = ["--plain-http"] if not self.tls else ["--ca-file", str(self.ca_path)]
        if user is not None:
            flags += ["--username", user[0], "--password", user[1]]
        home = self.workdir / "oras-home"  # its own config: never the developer's ~/.docker
        home.mkdir(exist_ok=True)
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "DOCKER_CONFIG": str(home)}
        command = [str(self.bin / "oras"), *args, *flags]
        done = subprocess.run(
            command, cwd=cwd, capture_output=True, text=True, env=env, timeout=120, check=False
        )
        assert done.returncode == 0, f"oras {' '.join(args)}: {done.stderr[-3000:]}"
        return done.stdout

    # ---- what it served --------------------------------------------------------------
    def blob_bytes(self, repository: str | None = None) -> int:
        """Bytes of blob bodies the registry sent (GET .../blobs/...), from its own request log."""
        total = 0
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            uri = str(entry.get("http.request.uri", ""))
            if entry.get("msg") != "response completed" or entry.get("http.request.method") != "GET":
                continue
            if "/blobs/sha256:" in uri and (repository is None or uri.startswith(f"/v2/{repository}/blobs/")):
                total += int(entry.get("http.response.written") or 0)
        return total


def docker_config(registry: Registry, user: str, password: str) -> str:
    """The JSON of a kubernetes.io/dockerconfigjson Secret (what `kubectl create secret docker-registry` writes)."""
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    return json.dumps({"auths": {registry.host: {"username": user, "password": password, "auth": auth}}})
