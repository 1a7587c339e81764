"""ghcr.io on loopback, for running the documented `helm` lines that fetch from it exactly as printed.

The chart's dependency (`oci://ghcr.io/metacontroller`, Chart.yaml) and the published chart
(`oci://ghcr.io/praesto/charts/praesto`, scripts/release.sh) live on ghcr.io, which cannot be
reached here. The stand-in is the real CNCF distribution registry (testkit/registry.py) with a
TLS certificate for `ghcr.io` from a test CA, reached through a CONNECT proxy that routes
`ghcr.io:443` to it (testkit/connect_proxy.py). helm's OCI client dials through HTTPS_PROXY
(helm v4.3.2 pkg/registry/transport.go: `Proxy: http.ProxyFromEnvironment`) and Go's
crypto/x509 on Linux reads its roots from SSL_CERT_FILE, so helm talks TLS to "ghcr.io" and
trusts the test CA. Loopback addresses (the API server) are never proxied by Go.

What it holds is published the way a release does it: the metacontroller-helm stand-in
(testkit/metacontroller_subchart.py) by `helm package` + `helm push`, the praesto chart by
`scripts/release.sh chart push` run in a copy of the repository (dependency build through the
proxy, package, push). `tunnels` lists every host:port helm asked the proxy for.

    with ghcr_standin(tmp) as ghcr:
        ghcr.publish_dependency()
        ghcr.publish_chart()
        ghcr.helm("show", "chart", "oci://ghcr.io/praesto/charts/praesto", "--version", "0.7.0")
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from testkit.connect_proxy import connect_proxy
from testkit.helm_chart import ROOT
from testkit.metacontroller_subchart import dependency, write_standin_subchart
from testkit.registry import Registry
from testkit.tools import tool

HOST = "ghcr.io"


def repo_layout(dest: Path) -> Path:
    """A copy of what the documentation's commands name (charts/, docs/, scripts/release.sh) at
    `dest`, without a fetched dependency: the commands run there with the printed relative paths."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(ROOT / "charts", dest / "charts", ignore=shutil.ignore_patterns("*.tgz", "charts"))
    shutil.copytree(ROOT / "docs", dest / "docs")
    (dest / "scripts").mkdir()
    shutil.copy2(ROOT / "scripts" / "release.sh", dest / "scripts" / "release.sh")
    return dest


@dataclass
class GhcrStandin:
    workdir: Path
    registry: Registry
    env: dict[str, str]
    tunnels: list[str]

    def run_unchecked(
        self, command: list[str], cwd: Path, extra_env: dict[str, str] | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        """Run `command` with helm's environment (and `extra_env`, e.g. KUBECONFIG)."""
        env = {**self.env, **(extra_env or {})}
        return subprocess.run(
            command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def run(self, command: list[str], cwd: Path, extra_env: dict[str, str] | None = None) -> str:
        """Run `command` with helm's environment; its stdout, or AssertionError with its output."""
        done = self.run_unchecked(command, cwd, extra_env)
        assert done.returncode == 0, (
            f"{' '.join(command)} (exit {done.returncode}):\n{done.stdout}{done.stderr}"
        )
        return done.stdout

    def helm(self, *args: str, cwd: Path | None = None) -> str:
        return self.run(["helm", *args], cwd or self.workdir)

    def publish_dependency(self) -> None:
        """The metacontroller-helm stand-in at the repository and version Chart.yaml names."""
        dep = dependency()
        source = write_standin_subchart(self.workdir / "standin")
        packaged = self.workdir / "packaged"
        self.helm("package", str(source), "--destination", str(packaged))
        self.helm("push", str(packaged / f"{dep['name']}-{dep['version']}.tgz"), dep["repository"])

    def publish_chart(self) -> None:
        """The praesto chart as a release publishes it (needs the dependency published first)."""
        layout = repo_layout(self.workdir / "release")
        self.run(["bash", "scripts/release.sh", "chart", "push"], layout)


@contextmanager
def ghcr_standin(workdir: Path) -> Iterator[GhcrStandin]:
    """The registry and the routing proxy running; helm's environment pointing at them (see module)."""
    home = workdir / "home"
    for sub in ("cache", "config", "data"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    with Registry(workdir / "registry", tls=True, names=(HOST,)) as registry:
        assert registry.ca_path is not None
        with connect_proxy({f"{HOST}:443": registry.host}) as (proxy, tunnels):
            env = {
                "PATH": f"{tool('helm').parent}{os.pathsep}{os.environ.get('PATH', '')}",
                "HOME": str(home),  # never the developer's helm config, cache or registry logins
                "HELM_CACHE_HOME": str(home / "cache"),
                "HELM_CONFIG_HOME": str(home / "config"),
                "HELM_DATA_HOME": str(home / "data"),
                "HTTPS_PROXY": proxy,
                "NO_PROXY": "127.0.0.1,localhost",
                "SSL_CERT_FILE": str(registry.ca_path),
            }
            yield GhcrStandin(workdir, registry, env, tunnels)
