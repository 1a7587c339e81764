"""NodeSummaries on the real API server (issue 38): what a GPU Node's heartbeat and image list cost a cache
(nothing), what a label change does, and how a cache's sync request grows per selected Node.

The Nodes are GPU-shaped as a real cluster writes them: the kubelet's labels and status (50 images),
node-feature-discovery's 80 labels and GPU feature discovery's, each written under its own field
manager, so the managedFields are what the server keeps for several writers. hooks/node_summary.py
says why the caches relate summaries and how the move from Nodes loses no copy.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from praesto.hooks import hook_protocol

from praesto import names
from testkit.controlplane import wait_for
from testkit.metacontroller import CompositeController, DecoratorController
from tests.cluster.flows import heartbeat, merge_patch, modelcachenodes
from tests.cluster.installed import Installed
from tests.cluster.tenants import modelcache, opted_in_namespace, ready_node

NS = "node-summaries"
POOL = "test.praesto.io/summary-pool"
Obj = dict[str, Any]
CPUID = [f"FLAG{i:02d}" for i in range(56)]
NFD_LABEL = "feature.node.kubernetes.io/pci-0000.present"  # summaries do not copy it: naming it relates Nodes
KUBELET = {
    "kubernetes.io/arch": "amd64",
    "kubernetes.io/os": "linux",
    "beta.kubernetes.io/arch": "amd64",
    "beta.kubernetes.io/os": "linux",
    "node.kubernetes.io/instance-type": "p5.48xlarge",
    "beta.kubernetes.io/instance-type": "p5.48xlarge",
    "topology.kubernetes.io/region": "us-east-1",
    "topology.kubernetes.io/zone": "us-east-1a",
    "failure-domain.beta.kubernetes.io/region": "us-east-1",
    "failure-domain.beta.kubernetes.io/zone": "us-east-1a",
}
GPU_PRODUCT = "nvidia.com/gpu.product"  # GFD writes it last of the labels (gpu_node)
GFD = {
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.memory": "81559",
    "nvidia.com/gpu.family": "hopper",
    "nvidia.com/gpu.machine": "p5.48xlarge",
    "nvidia.com/gpu.compute.major": "9",
    "nvidia.com/gpu.compute.minor": "0",
    "nvidia.com/gpu.replicas": "1",
    "nvidia.com/gpu.sharing-strategy": "none",
    "nvidia.com/cuda.driver.major": "550",
    "nvidia.com/cuda.driver.minor": "90",
    "nvidia.com/cuda.runtime.major": "12",
    "nvidia.com/mig.capable": "true",
    "nvidia.com/gfd.timestamp": "1733500000",
}
# Bytes a cache's request grows per selected Node, measured with these shapes: 4,063 in `related` as a
# NodeSummary (labels 954, last-applied annotation 1,146, managedFields 1,266) against 24,839 whole; 6,033
# in the sync body with the copy (26,857 before). The bounds leave ~25 % for longer names and values.
PER_NODE_BOUND = 5120
SYNC_PER_NODE_BOUND = 7680
CACHES = ("size", "size-whole")  # the same Nodes related as summaries, and whole


def gpu_node(installed: Installed, name: str, labels: dict[str, str]) -> None:
    """A Node as the kubelet, the controller-manager, the CNI, NFD and GFD leave it: 105 labels, 50 images,
    each part under its writer's field manager, so managedFields are what the server keeps for them."""
    ready_node(installed.admin, name, labels)
    core = client.CoreV1Api(installed.admin.api)
    kubelet = {"volumes.kubernetes.io/controller-managed-attach-detach": "true"}
    core.patch_node(name, {"metadata": {"labels": KUBELET, "annotations": kubelet}}, field_manager="kubelet")
    ttl = {"node.alpha.kubernetes.io/ttl": "0"}
    core.patch_node(
        name, {"metadata": {"annotations": ttl}, "spec": {"podCIDR": "10.244.3.0/24", "podCIDRs": ["10.244.3.0/24"]}},
        field_manager="kube-controller-manager",
    )  # fmt: skip
    cni = {
        "projectcalico.org/IPv4Address": "10.0.3.17/20",
        "projectcalico.org/IPv4VXLANTunnelAddr": "10.244.3.1",
    }
    core.patch_node(name, {"metadata": {"annotations": cni}}, field_manager="calico-node")
    nfd = {f"feature.node.kubernetes.io/cpu-cpuid.{flag}": "true" for flag in CPUID}
    nfd.update({f"feature.node.kubernetes.io/pci-{i:04x}.present": "true" for i in range(24)})
    core.patch_node(name, {"metadata": {"labels": nfd}}, field_manager="nfd-master")
    core.patch_node(name, {"metadata": {"labels": GFD}}, field_manager="gpu-feature-discovery")
    status = {"images": images(name, 0), "nodeInfo": NODE_INFO, "addresses": addresses(name)}
    core.patch_node_status(name, {"status": status}, field_manager="kubelet")


NODE_INFO = {
    "architecture": "amd64",
    "bootID": "7c0e3f5e-0d5a-4a4f-9d4e-3b1f0a6c2d11",
    "containerRuntimeVersion": "containerd://1.7.22",
    "kernelVersion": "6.1.112-124.190.amzn2023.x86_64",
    "kubeProxyVersion": "v1.31.2",
    "kubeletVersion": "v1.31.2",
    "machineID": "ec2b5f0c3e1d4a7b9c8d7e6f5a4b3c2d",
    "operatingSystem": "linux",
    "osImage": "Amazon Linux 2023.6.20241111",
    "systemUUID": "ec2b5f0c-3e1d-4a7b-9c8d-7e6f5a4b3c2d",
}


def addresses(name: str) -> list[Obj]:
    return [
        {"type": "InternalIP", "address": "10.0.3.17"},
        {"type": "InternalDNS", "address": f"{name}.ec2.internal"},
        {"type": "Hostname", "address": f"{name}.ec2.internal"},
    ]


def images(name: str, generation: int) -> list[Obj]:
    repo = "registry.example.com/ml-platform/serving-image"
    return [
        {
            "names": [f"{repo}-{i}@sha256:{i:064x}", f"{repo}-{i}:v{generation}.{i}"],
            "sizeBytes": 9_000_000 - i,
        }
        for i in range(50)
    ]


def summary(installed: Installed, node: str) -> Obj | None:
    return installed.admin.get(names.API_VERSION, names.NODESUMMARY_KIND, node)


def summarized(installed: Installed, node: str) -> bool:
    got = installed.admin.get("v1", "Node", node) or {}
    return (got.get("metadata", {}).get("labels") or {}).get(names.LABEL_NODE_SUMMARIZED) == "true"


def summary_is_final(installed: Installed, node: str) -> bool:
    """The Node carries the marker and its summary holds GFD's label, the last label gpu_node writes:
    the marker may come from a pass that read the Node before NFD and GFD had labelled it."""
    got = summary(installed, node) or {}
    labels = got.get("metadata", {}).get("labels") or {}
    return summarized(installed, node) and labels.get(GPU_PRODUCT) == GFD[GPU_PRODUCT]


def wait_summarized(installed: Installed, nodes: list[str]) -> None:
    wait_for(f"{nodes} to be summarized", lambda: all(summary_is_final(installed, n) for n in nodes), 60)


@pytest.fixture(scope="module")
def namespace(installed: Installed) -> str:
    return opted_in_namespace(installed.admin, NS)


def test_a_summary_holds_the_labels_selectors_read_and_is_owned_by_its_node(
    installed: Installed, namespace: str, decorator: DecoratorController
) -> None:
    """`decorator` starts the Metacontroller stand-in: nothing else summarizes a Node when this runs first."""
    gpu_node(installed, "sum-shape", {POOL: "shape"})
    wait_summarized(installed, ["sum-shape"])
    got = summary(installed, "sum-shape")
    assert got is not None
    node = installed.admin.get("v1", "Node", "sum-shape")
    assert node is not None
    labels = got["metadata"]["labels"]
    assert labels[POOL] == "shape" and labels[GPU_PRODUCT] == GFD[GPU_PRODUCT]
    assert not [k for k in labels if "feature.node.kubernetes.io" in k or k == "nvidia.com/gfd.timestamp"]
    assert names.LABEL_NODE_SUMMARIZED not in labels
    (ref,) = got["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
        "Node",
        "sum-shape",
        node["metadata"]["uid"],
        True,
    )


def test_heartbeats_and_image_lists_cost_no_pass_and_no_summary_write(
    installed: Installed, namespace: str, composite: CompositeController, decorator: DecoratorController
) -> None:
    gpu_node(installed, "sum-quiet", {POOL: "quiet"})
    wait_summarized(installed, ["sum-quiet"])
    installed.admin.create(modelcache("quiet", NS, node_selector={POOL: "quiet"}))
    wait_for("the copy", lambda: "sum-quiet" in modelcachenodes(installed.admin, NS, "quiet"), 30)
    before = summary(installed, "sum-quiet")
    assert before is not None
    key = f"{NS}/quiet"
    for generation in range(1, 4):
        beat = heartbeat(installed.admin, "sum-quiet")
        listed = merge_patch(
            installed.admin, "v1", "Node", "sum-quiet", {"status": {"images": images("sum-quiet", generation)}},
            status=True,
        )  # fmt: skip
        for event in (beat, listed):
            assert key not in composite.wait_seen("update", event).queued
            assert decorator.wait_seen("update", event).queued == []
    after = summary(installed, "sum-quiet")
    assert after is not None
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


def test_a_label_change_selects_and_deselects_a_node(
    installed: Installed, namespace: str, composite: CompositeController
) -> None:
    gpu_node(installed, "sum-flip", {})
    wait_summarized(installed, ["sum-flip"])
    installed.admin.create(modelcache("flip", NS, node_selector={POOL: "flip"}))

    def copy_on_node() -> bool:
        return "sum-flip" in modelcachenodes(installed.admin, NS, "flip")

    merge_patch(installed.admin, "v1", "Node", "sum-flip", {"metadata": {"labels": {POOL: "flip"}}})
    wait_for("the copy on the Node that joined", copy_on_node, 30)
    merge_patch(installed.admin, "v1", "Node", "sum-flip", {"metadata": {"labels": {POOL: None}}})
    wait_for("the copy removed from the Node that left", lambda: not copy_on_node(), 30)
    merge_patch(installed.admin, "v1", "Node", "sum-flip", {"metadata": {"labels": {POOL: "flip"}}})
    wait_for("the copy back", copy_on_node, 30)


def related_bytes(composite: CompositeController, cache: str) -> tuple[int, int]:
    """(bytes of the request's `related` as Metacontroller would send it now, Nodes in it whole)."""
    parent = composite.parents.get(NS, cache)
    assert parent is not None
    related = composite.customize.related(parent)
    return len(compact(related)), len(related.get(hook_protocol.NODE) or {})


def sync_body_bytes(installed: Installed, composite: CompositeController, cache: str) -> int:
    """The `modelcache/sync` body as Metacontroller would send it now (Go's compact JSON): the parent, its
    copies as the server returns them, its related objects."""
    parent = composite.parents.get(NS, cache)
    assert parent is not None
    copies = {
        f"{NS}/{c['metadata']['name']}": c for c in modelcachenodes(installed.admin, NS, cache).values()
    }
    body = {
        "controller": composite.controller,
        "parent": parent,
        "children": {hook_protocol.MODELCACHENODE: copies},
        "related": composite.customize.related(parent),
        "finalizing": False,
    }
    return len(compact(body))


def compact(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"))


def test_a_caches_request_grows_by_a_small_summary_per_node_not_by_the_node(
    installed: Installed, namespace: str, composite: CompositeController
) -> None:
    """Also the move: the cache exists before its Nodes are summarized, and no copy is ever deleted. A second
    cache, whose selector names an NFD label, relates the same Nodes whole: the cost before summaries."""
    small, large = 2, 8
    nodes = [f"sum-size-{i}" for i in range(large)]
    for node in nodes[:small]:
        gpu_node(installed, node, {POOL: "size"})
    installed.admin.create(modelcache("size", NS, node_selector={POOL: "size"}))
    installed.admin.create(modelcache("size-whole", NS, node_selector={POOL: "size", NFD_LABEL: "true"}))
    for node in nodes[small:]:
        gpu_node(installed, node, {POOL: "size"})
    wait_summarized(installed, nodes)
    wait_for(
        "every copy of both caches",
        lambda: all(set(modelcachenodes(installed.admin, NS, c)) == set(nodes) for c in CACHES),
        60,
    )
    deletes = [w for p in composite.passes(f"{NS}/size") for w in p.writes if w.startswith("delete ")]
    assert deletes == []
    whole = [len(compact(installed.admin.get("v1", "Node", n))) for n in nodes]
    # Metacontroller's Node informer trails the marker label a little (the tier's watch lag).
    wait_for("no Node related whole", lambda: related_bytes(composite, "size")[1] == 0, 30)
    assert related_bytes(composite, "size-whole")[1] == large
    with_all = {c: (related_bytes(composite, c)[0], sync_body_bytes(installed, composite, c)) for c in CACHES}
    for node in nodes[small:]:
        merge_patch(installed.admin, "v1", "Node", node, {"metadata": {"labels": {POOL: None}}})
    wait_for(
        "the deselected Nodes to leave both requests",
        lambda: (
            all(related_count(composite, c) == small for c in CACHES)
            and all(len(modelcachenodes(installed.admin, NS, c)) == small for c in CACHES)
        ),
        60,
    )
    with_few = {c: (related_bytes(composite, c)[0], sync_body_bytes(installed, composite, c)) for c in CACHES}
    per_node = {
        c: [(with_all[c][i] - with_few[c][i]) / (large - small) for i in (0, 1)] for c in CACHES
    }  # fmt: skip
    print(
        f"\nper selected GPU node ({sum(whole) / len(whole):.0f} B as the server returns it):"
        f" related {per_node['size'][0]:.0f} B as a NodeSummary, {per_node['size-whole'][0]:.0f} B whole;"
        f" sync body {per_node['size'][1]:.0f} B vs {per_node['size-whole'][1]:.0f} B (copy included);"
        f" sync body with {large} nodes {with_all['size'][1]} B vs {with_all['size-whole'][1]} B"
    )
    summary_related, whole_related = per_node["size"][0], per_node["size-whole"][0]
    assert summary_related < PER_NODE_BOUND, (summary_related, whole_related)
    assert whole_related > 5 * summary_related, (summary_related, whole_related)
    assert per_node["size"][1] < SYNC_PER_NODE_BOUND, per_node


def related_count(composite: CompositeController, cache: str) -> int:
    """Selected Nodes in the cache's request, as summaries or whole."""
    parent = composite.parents.get(NS, cache)
    assert parent is not None
    related = composite.customize.related(parent)
    return sum(len(related.get(group) or {}) for group in (hook_protocol.NODESUMMARY, hook_protocol.NODE))
