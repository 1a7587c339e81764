"""Drive a kind cluster through the real CLIs (docker, kind, kubectl, helm) for the e2e suite.

Every wait is `kubectl wait` or a poll against a deadline that names what it
waited for when it gives up.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("docker", "kind", "kubectl", "helm")
CERT_MANAGER_VERSION = "v1.18.2"


def missing_prerequisite() -> str | None:
    """Why the suite cannot run here, or None."""
    absent = [t for t in TOOLS if shutil.which(t) is None]
    if absent:
        return f"not installed: {', '.join(absent)}"
    info = subprocess.run(["docker", "info"], capture_output=True, timeout=30)
    if info.returncode != 0:
        return "docker is installed but no engine answers (`docker info` failed)"
    return None


def run(*args: str, stdin: str | None = None, timeout: float = 600, check: bool = True) -> str:
    result = subprocess.run(list(args), input=stdin, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return result.stdout


def poll(what: str, probe: Callable[[], bool], timeout: float, interval: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


@dataclass
class Cluster:
    name: str
    image: str

    @property
    def context(self) -> str:
        return f"kind-{self.name}"

    @property
    def node(self) -> str:
        return f"{self.name}-control-plane"

    def kubectl(self, *args: str, stdin: str | None = None, timeout: float = 300, check: bool = True) -> str:
        return run("kubectl", "--context", self.context, *args, stdin=stdin, timeout=timeout, check=check)

    def apply(self, manifest: dict[str, Any] | list[dict[str, Any]]) -> None:
        items = manifest if isinstance(manifest, list) else [manifest]
        self.kubectl(
            "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
        )

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        out = self.kubectl("get", kind, name, "-n", namespace, "-o", "json", "--ignore-not-found")
        return json.loads(out) if out.strip() else None

    def on_node(self, *command: str) -> str:
        """Run a command inside the kind node (the node's filesystem, where the store lives)."""
        return run("docker", "exec", self.node, *command)

    # --- set-up ---------------------------------------------------------------------

    def create(self) -> None:
        run("kind", "create", "cluster", "--name", self.name, "--config", str(ROOT / "e2e" / "kind-config.yaml"),
            "--wait", "120s", timeout=900)  # fmt: skip
        # The store must exist before the DaemonSet starts (hostPath type Directory).
        self.on_node("sh", "-c", "mkdir -p /var/praesto && chmod 0775 /var/praesto")

    def load_image(self) -> None:
        run("docker", "build", "-t", self.image, str(ROOT), timeout=1800)
        run("kind", "load", "docker-image", self.image, "--name", self.name, timeout=600)

    def install_cert_manager(self) -> None:
        run("helm", "--kube-context", self.context, "upgrade", "--install", "cert-manager", "cert-manager",
            "--repo", "https://charts.jetstack.io", "--version", CERT_MANAGER_VERSION,
            "--namespace", "cert-manager", "--create-namespace", "--set", "crds.enabled=true",
            "--wait", "--timeout", "10m", timeout=900)  # fmt: skip

    def install_praesto(self, workdir: Path) -> None:
        chart = workdir / "praesto"
        shutil.copytree(ROOT / "charts" / "praesto", chart)
        run("helm", "dependency", "update", str(chart), timeout=600)  # fetches metacontroller-helm (OCI)
        repository, tag = self.image.rsplit(":", 1)
        run("helm", "--kube-context", self.context, "upgrade", "--install", "praesto", str(chart),
            "--namespace", "praesto-system", "--create-namespace",
            "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
            "--set", "nodeAgent.nodeSelector.praesto\\.io/cache-node=true",
            "--set", "nodeAgent.reserve=1Gi",
            "--wait", "--timeout", "10m", timeout=900)  # fmt: skip

    def delete(self) -> None:
        run("kind", "delete", "cluster", "--name", self.name, timeout=300, check=False)

    # --- workload helpers -------------------------------------------------------------

    def wait_phase(self, name: str, namespace: str, phase: str, timeout: float = 900) -> dict[str, Any]:
        def reached() -> bool:
            obj = self.get("modelcache", name, namespace)
            status = (obj or {}).get("status", {})
            if status.get("phase") == "Failed" and phase != "Failed":
                raise AssertionError(f"ModelCache {namespace}/{name} failed: {json.dumps(status)}")
            return bool(status.get("phase") == phase)

        poll(f"ModelCache {namespace}/{name} phase {phase}", reached, timeout)
        obj = self.get("modelcache", name, namespace)
        assert obj is not None
        return obj

    def pod_output(self, name: str, namespace: str, timeout: float = 600) -> str:
        """Wait for a run-to-completion Pod to succeed and return its log."""
        self.kubectl("wait", "--for=jsonpath={.status.phase}=Succeeded", f"pod/{name}", "-n", namespace,
                     f"--timeout={int(timeout)}s", timeout=timeout + 30)  # fmt: skip
        return self.kubectl("logs", name, "-n", namespace)
