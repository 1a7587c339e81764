"""`praesto-agent run` processes on the real control plane, each as the chart's agent ServiceAccount.

The agent is the production entry point, unchanged: only its flags point it at
a temp store, the local hub and a kubeconfig holding a TokenRequest token.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.cluster.installed import AGENT_SA, Installed
from tests.support.controlplane import Component
from tests.support.helm_chart import NAMESPACE


def agent_command() -> str:
    found = shutil.which("praesto-agent", path=str(Path(sys.executable).parent)) or shutil.which(
        "praesto-agent"
    )
    assert found, "praesto-agent is not installed (make install)"
    return found


@dataclass
class AgentProcess:
    installed: Installed
    node: str
    hub_endpoint: str
    workdir: Path
    extra_args: tuple[str, ...] = ()
    component: Component = field(init=False)

    def __post_init__(self) -> None:
        self.base = self.workdir / "store"
        self.base.mkdir(parents=True, exist_ok=True)
        kubeconfig = self.installed.plane.token_kubeconfig(NAMESPACE, AGENT_SA)
        argv = [
            agent_command(),
            "run",
            f"--node-name={self.node}",
            f"--base-path={self.base}",
            f"--hf-endpoint={self.hub_endpoint}",
            f"--kubeconfig={kubeconfig}",
            "--reserve=0",
            "--metrics-port=0",
            "--concurrency=4",
            *self.extra_args,
        ]
        self.component = Component(f"praesto-agent/{self.node}", argv, self.workdir / "agent.log")

    def __enter__(self) -> AgentProcess:
        self.component.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.component.stop()

    def log(self) -> str:
        return self.component.log_path.read_text(errors="replace")
