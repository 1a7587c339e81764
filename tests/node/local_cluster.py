"""`make run`: Praesto on a local cluster of one real node, a model cache, and a Pod reading it.

Brings up what the node tier runs (tests/node/conftest.py): the upstream control plane
and a real node (kubelet + containerd) built from the Go modules in build/, the chart's
objects, praesto-hooks, the agent and the CSI plugin from the installed wheel, and a local
Hugging Face hub serving a small generated model. Then it creates a ModelCache and a Pod
that reads it at /models, prints what to try next, and waits; Ctrl-C tears everything down
and checks the machine is left as it was.

Ctrl-C is how `make run` is meant to end, so a teardown that leaves nothing behind exits 0,
quietly (make then says nothing of its own; make itself ends by the terminal's SIGINT, so a
shell still sees 130 for `make run`). A terminal sends SIGINT to its whole foreground process
group: only this process must act on it, and tear down in order (tests/node/test_local_cluster_run.py
does exactly that). The kubelet, containerd, the control plane, the agent and the CSI plugin run in
sessions of their own (testkit/controlplane.Component); praesto-hooks (gunicorn) starts in ours
with SIGINT blocked (`sigint_blocked`). SIGTERM stops it the same way; a second Ctrl-C does not
cut the teardown short.

Metacontroller cannot be installed from a registry here: its part is played by the
project's stand-in (testkit/metacontroller.py), which does what Metacontroller
v4.17.2's source does. On a real cluster the chart brings the real Metacontroller.
Needs root (the kubelet, containerd and bind mounts).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import FrameType

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
REPO = "demo/tiny-model"  # on the local hub
CACHE = "tiny-model"  # the ModelCache of REPO, in NAMESPACE
READER_POD = "reader"
WAITING_LINE = "waiting for the Pod to read the model ..."  # the last step of the start
READY_LINE = "Ctrl-C tears it all down."  # printed once everything is up (tests wait for it)
DONE_LINE = "done: nothing left running."
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


class Interrupts:
    """SIGINT and SIGTERM: the first stops the job (while it starts, by unwinding the start:
    KeyboardInterrupt); later ones only say the teardown is under way, so it is never cut short
    (that would leave the node's mounts, processes and cgroups on the machine)."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.starting = True

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.stop.is_set():
            self._say("still tearing down: please wait")
            return
        self.stop.set()
        self._say("tearing down ...")
        if self.starting:
            raise KeyboardInterrupt

    @staticmethod
    def _say(text: str) -> None:
        """Straight to the descriptor: the signal may have come in the middle of a print()."""
        os.write(sys.stdout.fileno(), f"{text}\n".encode())


@contextmanager
def sigint_blocked() -> Iterator[None]:
    """Processes started inside inherit SIGINT blocked (the signal mask survives fork and exec).

    testkit/server.py starts praesto-hooks in our process group, so a terminal's Ctrl-C would
    reach it too: gunicorn quits at once on SIGINT, and the Metacontroller stand-in, still
    running, logged `URLError ... Connection reset by peer` for its hook calls. Blocked, gunicorn
    stops in turn, on the SIGTERM the teardown sends once the stand-in has stopped."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def main() -> int:
    if os.geteuid() != 0:
        say("make run starts a real kubelet and containerd and makes bind mounts: run it as root.")
        return 2
    interrupts = Interrupts()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, interrupts)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C while starting: the start is unwound
        run(interrupts)
    say(DONE_LINE)
    return 0


def run(interrupts: Interrupts) -> None:
    shutil.rmtree(WORKDIR, ignore_errors=True)
    WORKDIR.mkdir(parents=True)
    with ExitStack() as stack:
        say("starting the upstream control plane (etcd, kube-apiserver, controller-manager, scheduler) ...")
        plane = start_control_plane(WORKDIR / "control-plane", with_kubelets=True)
        stack.callback(plane.stop)
        say("starting one real node: containerd and the kubelet ...")
        node = stack.enter_context(real_node(plane, WORKDIR / "node", NODE))
        hub = stack.enter_context(LocalHub(WORKDIR / "hub", host=NODE_IP))
        hub.add_repo(REPO, MODEL)
        values = chart_values(hub)
        say("installing the chart's objects and starting praesto-hooks ...")
        with sigint_blocked():
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
                CACHE, NAMESPACE, node_selector={"kubernetes.io/hostname": NODE},
                source={"huggingface": {"repo": REPO}},
            )
        )  # fmt: skip
        admin.create(busybox_pod(READER_POD, NAMESPACE, READER, cache=CACHE))
        say(WAITING_LINE)
        wait_phase(admin, READER_POD, NAMESPACE, ("Running",), 300)
        wait_for(
            "the copy on the node",
            lambda: (daemons.base / NAMESPACE / CACHE / names.COMPLETE_FILE).exists(),
            60,
        )
        kubectl = f"{node_binaries() / 'kubectl'} --kubeconfig {plane.admin_kubeconfig}"
        say()
        say(f"Praesto is running: one node ({node.versions()}).")
        say(
            f"The ModelCache {CACHE} in namespace {NAMESPACE} (the local hub's {REPO}) is cached on {NODE}"
            f" and mounted read-only at /models in the Pod {READER_POD}."
        )
        say()
        say("Try:")
        say(f"  {kubectl} get modelcaches,modelcachenodes,pods -n {NAMESPACE}")
        say(f"  {kubectl} logs -n {NAMESPACE} {READER_POD}")
        say(f"  {kubectl} describe modelcache -n {NAMESPACE} {CACHE}")
        say(f"  {kubectl} get nodes --show-labels")
        say(f"The node's store: {daemons.base}; logs: {WORKDIR}")
        say()
        say(READY_LINE)
        interrupts.starting = False
        interrupts.stop.wait()


if __name__ == "__main__":
    sys.exit(main())
