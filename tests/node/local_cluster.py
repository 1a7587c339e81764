"""`make run`: Praesto on a local cluster of one real node, a model cache, and a Pod reading it.

Brings up what the node tier runs (tests/node/conftest.py): the upstream control plane
and a real node (kubelet + containerd) built from the Go modules in build/, the chart's
objects, praesto-hooks, the agent and the CSI plugin from the installed wheel, and a local
Hugging Face hub serving a small generated model. Then it creates a ModelCache and a Pod
that reads it at /models, prints what to try next, and waits; Ctrl-C tears everything down
and checks the machine is left as it was.

Metacontroller cannot be installed from a registry here: its part is played by the
project's stand-in (testkit/metacontroller.py), which does what Metacontroller
v4.17.2's source does. On a real cluster the chart brings the real Metacontroller.
Needs root (the kubelet, containerd and bind mounts).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
from contextlib import ExitStack
from pathlib import Path

from praesto import names
from testkit.controlplane import start_control_plane, wait_for
from testkit.hub import LocalHub
from testkit.metacontroller import Metacontroller
from testkit.node_host import NODE_IP
from testkit.real_node import node_binaries, real_node
from tests.cluster.controllers import WATCH_LAG
from tests.cluster.flows import hook_client
from tests.cluster.installed import METACONTROLLER_SA, install_chart
from tests.cluster.tenants import modelcache, opted_in_namespace
from tests.node.node_daemons import NodeDaemons, chart_values
from tests.node.pods import busybox_pod, wait_phase

ROOT = Path(__file__).resolve().parents[2]
WORKDIR = ROOT / "build" / "run"
NAMESPACE = "demo"
NODE = "praesto-node-1"
MODEL = {
    "config.json": json.dumps({"architectures": ["TinyDemo"], "hidden_size": 64}).encode(),
    "model.safetensors": bytes(range(256)) * (4096 * 8),  # 8 MiB
    "tokenizer.json": json.dumps({"version": "1.0", "model": {"type": "BPE"}}).encode(),
}
READER = "ls -l /models; sha256sum /models/*; echo; echo 'reading /models every minute'; " + (
    "while true; do sleep 60; sha256sum /models/model.safetensors; done"
)


def say(text: str = "") -> None:
    print(text, flush=True)


def main() -> int:
    if os.geteuid() != 0:
        say("make run starts a real kubelet and containerd and makes bind mounts: run it as root.")
        return 2
    shutil.rmtree(WORKDIR, ignore_errors=True)
    WORKDIR.mkdir(parents=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with ExitStack() as stack:
        say("starting the upstream control plane (etcd, kube-apiserver, controller-manager, scheduler) ...")
        plane = start_control_plane(WORKDIR / "control-plane", with_kubelets=True)
        stack.callback(plane.stop)
        say("starting one real node: containerd and the kubelet ...")
        node = stack.enter_context(real_node(plane, WORKDIR / "node", NODE))
        hub = stack.enter_context(LocalHub(WORKDIR / "hub", host=NODE_IP))
        hub.add_repo("demo/tiny-model", MODEL)
        values = chart_values(hub)
        say("installing the chart's objects and starting praesto-hooks ...")
        installed = stack.enter_context(install_chart(plane, WORKDIR / "installed", extra_values=values))
        say("starting the Metacontroller stand-in (the chart installs the real one on a cluster) ...")
        controller = Metacontroller(
            installed.kube_as(METACONTROLLER_SA),
            hook_client(installed),
            installed.rendered("CompositeController"),
            installed.rendered("DecoratorController"),
            lag=WATCH_LAG,
        )
        stack.enter_context(controller)
        say("starting the node agent and the CSI plugin from the installed wheel ...")
        daemons = stack.enter_context(NodeDaemons(installed, node, WORKDIR / "daemons"))
        admin = installed.admin
        opted_in_namespace(admin, NAMESPACE)
        admin.create(
            modelcache(
                "tiny", NAMESPACE, node_selector={"kubernetes.io/hostname": NODE},
                source={"huggingface": {"repo": "demo/tiny-model"}},
            )
        )  # fmt: skip
        admin.create(busybox_pod("reader", NAMESPACE, READER, cache="tiny"))
        say("waiting for the Pod to read the model ...")
        wait_phase(admin, "reader", NAMESPACE, ("Running",), 300)
        wait_for(
            "the copy on the node",
            lambda: (daemons.base / NAMESPACE / "tiny" / names.COMPLETE_FILE).exists(),
            60,
        )
        kubectl = f"{node_binaries() / 'kubectl'} --kubeconfig {plane.admin_kubeconfig}"
        say()
        say(f"Praesto is running: one node ({node.versions()}).")
        say(
            f"The model demo/tiny-model is cached on {NODE} and mounted read-only at /models in {NAMESPACE}/reader."
        )
        say()
        say("Try:")
        say(f"  {kubectl} get modelcaches,modelcachenodes,pods -n {NAMESPACE}")
        say(f"  {kubectl} logs -n {NAMESPACE} reader")
        say(f"  {kubectl} describe modelcache -n {NAMESPACE} tiny")
        say(f"  {kubectl} get nodes --show-labels")
        say(f"The node's store: {daemons.base}; logs: {WORKDIR}")
        say()
        say("Ctrl-C tears it all down.")
        signal.signal(signal.SIGINT, lambda *_: stop.set())  # before this, Ctrl-C unwinds the start
        stop.wait()
        # A second Ctrl-C must not cut the teardown short: that would leave the node's mounts,
        # processes and cgroups on the machine.
        signal.signal(signal.SIGINT, lambda *_: say("still tearing down: please wait"))
        say("tearing down ...")
    say("done: nothing left running.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
