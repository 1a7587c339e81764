"""`praesto-agent run` processes on the real control plane, each as the chart's agent ServiceAccount.

The agent is the production entry point, unchanged: only its flags point it at
a temp store, the local hub and a kubeconfig holding a TokenRequest token.
"""

from __future__ import annotations

import copy
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kubernetes import client
from kubernetes.client.rest import ApiException
from prometheus_client.parser import text_string_to_metric_families

from testkit.controlplane import Component
from testkit.egress import LOOPBACK_FLAG
from testkit.helm_chart import NAMESPACE
from testkit.installed_wheel import installed_wheel
from testkit.kube_apply import Kube
from tests.cluster.installed import AGENT_SA, Installed

Obj = dict[str, Any]


class HasAdmin(Protocol):
    """An installed chart's cluster-admin client (Installed, or a helm release on the node tier)."""

    admin: Kube


def agent_command() -> str:
    """`praesto-agent` as the wheel installs it (testkit/installed_wheel.py), not the editable tree."""
    return installed_wheel().script("praesto-agent")


def agent_pod(installed: Installed, node: str) -> Obj:
    """The Pod the chart's DaemonSet would run on `node`, as its controller makes it.

    There is no kubelet, so it never starts; it exists so that a token bound to it
    carries the node (`authentication.kubernetes.io/node-name`), exactly the token the
    kubelet projects into the real agent, which the chart's ValidatingAdmissionPolicy
    checks.
    """
    template = copy.deepcopy(installed.rendered("DaemonSet")["spec"]["template"])
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{AGENT_SA}-{node}",
            "namespace": NAMESPACE,
            "labels": template["metadata"].get("labels", {}),
        },
        "spec": {**template["spec"], "nodeName": node},
    }
    return installed.admin.apply(pod)


def bound_to(pod: Obj) -> dict[str, str]:
    """A TokenRequest boundObjectRef for `pod`."""
    return {"kind": "Pod", "apiVersion": "v1", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}


def remove_agent_pod(installed: HasAdmin, pod: Obj) -> None:
    """Delete at once (grace 0): without a kubelet a graceful delete would wait forever."""
    meta = pod["metadata"]
    try:
        client.CoreV1Api(installed.admin.api).delete_namespaced_pod(
            meta["name"], meta["namespace"], grace_period_seconds=0
        )
    except ApiException as err:
        if err.status != 404:
            raise


@dataclass
class AgentProcess:
    installed: Installed
    node: str
    hub_endpoint: str
    workdir: Path
    extra_args: tuple[str, ...] = ()
    # Serve and fetch from other agents (the chart's nodeAgent.peers): its peer server on loopback,
    # its peer tokens bound to its Pod, as the DaemonSet's downward API would give them.
    peer_port: int = 0
    component: Component = field(init=False)

    def __post_init__(self) -> None:
        self.base = self.workdir / "store"
        self.base.mkdir(parents=True, exist_ok=True)
        self.pod = agent_pod(self.installed, self.node)
        kubeconfig = self.installed.plane.token_kubeconfig(
            NAMESPACE, AGENT_SA, suffix=self.node, bound_object=bound_to(self.pod)
        )
        argv = [
            agent_command(),
            "run",
            f"--node-name={self.node}",
            f"--base-path={self.base}",
            f"--hf-endpoint={self.hub_endpoint}",
            LOOPBACK_FLAG,  # the hub and stores of the tier listen on loopback
            f"--kubeconfig={kubeconfig}",
            "--reserve=0",
            "--metrics-port=0",
            "--concurrency=4",
            *self.extra_args,
        ]
        # the DaemonSet's credentials broker (praesto-hooks, here the tier's) and this Pod, its tokens' binding
        meta = self.pod["metadata"]
        argv += [
            f"--credentials-broker={self.installed.hooks.base_url}",
            f"--credentials-broker-ca={self.installed.hooks.ca_path}",
            f"--pod-name={meta['name']}",
            f"--pod-uid={meta['uid']}",
            f"--peer-service-account={NAMESPACE}/{AGENT_SA}",
        ]
        if self.peer_port:  # the DaemonSet's own --peer-* flags, with what the kubelet would fill in
            meta = self.pod["metadata"]
            filled = {"--peer-port": str(self.peer_port), "--peer-address": "127.0.0.1",
                      "--pod-name": meta["name"], "--pod-uid": meta["uid"]}  # fmt: skip
            rendered = self.installed.rendered("DaemonSet")["spec"]["template"]["spec"]["containers"][0][
                "args"
            ]
            for arg in rendered:
                flag = arg.partition("=")[0]
                if flag.startswith(("--peer-", "--pod-")) and flag != "--peer-service-account":
                    argv.append(f"{flag}={filled[flag]}" if flag in filled else arg)
        self.component = Component(f"praesto-agent/{self.node}", argv, self.workdir / "agent.log")

    def __enter__(self) -> AgentProcess:
        self.component.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.component.stop()
        remove_agent_pod(self.installed, self.pod)

    def log(self) -> str:
        return self.component.log_path.read_text(errors="replace")


def agent_metric(port: int, name: str, **labels: str) -> float:
    """One sample of an agent's /metrics on this host (0 when absent), read as Prometheus would."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0
