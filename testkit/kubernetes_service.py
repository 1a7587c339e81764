"""The `kubernetes` Service for the node tier's Pods: what kube-proxy does for it on a real node.

A Pod that talks to the API server (praesto-hooks, the chart's uninstall hook Job) uses the
in-cluster configuration: the kubelet gives it KUBERNETES_SERVICE_HOST, the ClusterIP of
`default/kubernetes` (KUBERNETES_SERVICE_IP, the first address of the Service range), port 443.
The tier's API server listens on loopback only, and no kube-proxy runs, so the node does:

* the Pods' one extra route, to KUBERNETES_SERVICE_IP through the bridge (testkit/node_runtime.py);
* a DNAT rule for what arrives on the bridge for KUBERNETES_SERVICE_IP:443, to a port on the
  node's own address (NODE_IP), where a relay copies bytes to the API server on loopback (TLS
  passes through untouched: the serving certificate names KUBERNETES_SERVICE_IP);
* a blackhole route for the whole Service range on the machine, so that nothing addressed to
  a ClusterIP without this rule is ever forwarded out of it (the machine's default route leads
  elsewhere); a DNATed packet is routed to NODE_IP, which is local, before that route applies.

Everything is taken away by `stop()` (and the node's own teardown check finds a leftover rule).
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import subprocess
import threading

from testkit.controlplane import KUBERNETES_SERVICE_IP, SERVICE_CLUSTER_IP_RANGE, ControlPlane
from testkit.node_host import NODE_IP
from testkit.node_runtime import BRIDGE

CHUNK = 1 << 16


def _dnat_rule(port: int) -> list[str]:
    return ["PREROUTING", "-i", BRIDGE, "-d", f"{KUBERNETES_SERVICE_IP}/32", "-p", "tcp", "--dport", "443",
            "-j", "DNAT", "--to-destination", f"{NODE_IP}:{port}"]  # fmt: skip


def _pipe(a: socket.socket, b: socket.socket) -> None:
    """Copy both ways until either side closes."""
    with a, b, selectors.DefaultSelector() as sel:
        sel.register(a, selectors.EVENT_READ, b)
        sel.register(b, selectors.EVENT_READ, a)
        while True:
            for key, _ in sel.select():
                source: socket.socket = key.fileobj  # type: ignore[assignment]
                try:
                    data = source.recv(CHUNK)
                except OSError:
                    return
                if not data:
                    return
                try:
                    key.data.sendall(data)
                except OSError:
                    return


class KubernetesService:
    """Pods reach the API server at KUBERNETES_SERVICE_IP:443 while this runs."""

    def __init__(self, plane: ControlPlane) -> None:
        self.api_port = plane.api_port
        self.listener: socket.socket | None = None
        self.thread: threading.Thread | None = None
        self.stopping = threading.Event()
        self.rule: list[str] = []

    def start(self) -> KubernetesService:
        listener = socket.create_server((NODE_IP, 0))
        listener.settimeout(0.5)
        self.listener = listener
        self.thread = threading.Thread(target=self._serve, name="kubernetes-service", daemon=True)
        self.thread.start()
        subprocess.run(["ip", "route", "replace", "blackhole", SERVICE_CLUSTER_IP_RANGE], check=True)
        self.rule = _dnat_rule(listener.getsockname()[1])
        subprocess.run(["iptables", "-t", "nat", "-A", *self.rule], check=True)
        return self

    def _serve(self) -> None:
        assert self.listener is not None
        while not self.stopping.is_set():
            try:
                pod_side, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                api_side = socket.create_connection(("127.0.0.1", self.api_port), timeout=10)
            except OSError:
                pod_side.close()
                continue
            api_side.settimeout(None)
            pod_side.settimeout(None)
            threading.Thread(target=_pipe, args=(pod_side, api_side), daemon=True).start()

    def stop(self) -> None:
        self.stopping.set()
        if self.rule:
            subprocess.run(["iptables", "-t", "nat", "-D", *self.rule], check=False, capture_output=True)
        subprocess.run(["ip", "route", "del", "blackhole", SERVICE_CLUSTER_IP_RANGE], check=False,
                       capture_output=True)  # fmt: skip
        if self.listener is not None:
            with contextlib.suppress(OSError):
                self.listener.close()
        if self.thread is not None:
            self.thread.join(timeout=5)
