"""Warm before schedulable, on a real kubelet: the node joins tainted, the agent fills it and lifts the taint.

Runs last (the node leaves and re-joins the cluster): the node is drained, its Node object
deleted, and the kubelet started again with `registerWithTaints` holding the chart's
startup taint, as a node pool that warms its nodes would register them.
"""

from __future__ import annotations

import hashlib

from praesto import names
from testkit.controlplane import wait_for
from testkit.hub import LocalHub
from testkit.metacontroller import Metacontroller
from testkit.real_node import RealNode
from tests.cluster.installed import WARM_NAMESPACE, Installed
from tests.cluster.tenants import opted_in_namespace
from tests.node.node_daemons import NodeDaemons
from tests.node.pods import busybox_pod, core, delete_pod, pod_log, wait_phase
from tests.node.test_pods import FILES, WEIGHTS, create_cache

STARTUP_TAINT = "praesto.io/warming"
NS = WARM_NAMESPACE  # a namespace the chart lets hold new nodes (nodeAgent.startupTaint.namespaces)


def taints(node: RealNode) -> set[str]:
    return {t.key for t in (node.node().spec.taints or [])}


def test_node_joins_tainted_and_the_agent_lifts_the_taint_once_warm(
    installed: Installed, hub: LocalHub, node: RealNode, daemons: NodeDaemons, controllers: Metacontroller
) -> None:
    admin = installed.admin
    opted_in_namespace(admin, NS)
    daemons.leave()  # drain, agent stopped, kubelet stopped, Node deleted
    hub.add_repo("org/warm", FILES)
    create_cache(installed, node, NS, "warm", "org/warm", warmNewNodes=True)
    admin.create(
        busybox_pod(
            "waits-for-warm", NS, "sha256sum /models/model.safetensors", cache="warm",
            nodeSelector={"kubernetes.io/hostname": node.name},
        )
    )  # fmt: skip
    daemons.rejoin(register_with_taints=[{"key": STARTUP_TAINT, "effect": "NoSchedule"}])
    # The Node registered with the taint; the Pod cannot land until the agent lifts it.
    wait_for("the Node back", node.ready, 120)
    assert core(admin).read_namespaced_pod("waits-for-warm", NS).spec.node_name is None
    wait_for("the startup taint lifted", lambda: STARTUP_TAINT not in taints(node), 180)
    copy = daemons.base / NS / "warm"
    assert (copy / names.COMPLETE_FILE).exists()  # lifted only once the warm cache was on disk
    assert wait_phase(admin, "waits-for-warm", NS, ("Succeeded", "Failed"), 120) == "Succeeded"
    assert hashlib.sha256(WEIGHTS).hexdigest() in pod_log(admin, "waits-for-warm", NS)
    delete_pod(admin, "waits-for-warm", NS)
