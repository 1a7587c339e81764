"""Per-Pod cold-start accounting and prewarm end to end (issue #15 items 2 and 4).

The real parts: kube-apiserver with the chart's CRDs, RBAC and agent policy; a
`praesto-agent run` process with a token bound to its DaemonSet Pod; the CSI
node plugin on a real gRPC unix socket over the same base path, mounting for
real (root); the hooks over HTTPS driven by Metacontroller's sync algorithm.
There is no kubelet, so the test plays it: it sends NodePublishVolume with the
pod info the kubelet sets for a real Pod created in the API server.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes import client
from praesto.agent.coldstart_reporter import REASON_HIT, REASON_MISS

from praesto import names
from testkit.controlplane import wait_for
from testkit.csi_driver import NEEDS_ROOT, InProcessDriver, publish_request
from testkit.hub import LocalHub
from testkit.metacontroller import CompositeController
from tests.cluster.agents import AgentProcess, agent_metric
from tests.cluster.flows import modelcachenodes, phase_is
from tests.cluster.installed import Installed
from tests.cluster.node_side import agent_with_csi
from tests.cluster.tenants import modelcache, opted_in_namespace, ready_node

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason=NEEDS_ROOT)

NS = "pod-starts"
NODE = "starts-a"
POOL = "test.praesto.io/starts"
FILES = {"config.json": b'{"model": "starts"}', "model-00001.safetensors": b"a" * 300_000}
SIZE = sum(len(v) for v in FILES.values())


@pytest.fixture(scope="module")
def node_side(
    installed: Installed, hub: LocalHub, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[AgentProcess, InProcessDriver, int]]:
    opted_in_namespace(installed.admin, NS)
    ready_node(installed.admin, NODE, {POOL: "yes"})
    work = tmp_path_factory.mktemp("pod-starts")
    with ExitStack() as stack:
        agent, driver, port = agent_with_csi(stack, installed, NODE, hub.endpoint, work)
        yield agent, driver, port


def real_pod(installed: Installed, name: str) -> dict[str, str]:
    """A Pod bound to the node in the API server; the pod info the kubelet would pass the driver."""
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": False,
            "containers": [{"name": "server", "image": "registry.example/llm:1"}],
        },
    }
    created = installed.admin.create(body)
    return {
        names.CSI_ATTR_POD_NAME: name,
        names.CSI_ATTR_POD_UID: created["metadata"]["uid"],
    }


def pod_events(installed: Installed, uid: str) -> list[client.CoreV1Event]:
    core = client.CoreV1Api(installed.admin.api)
    return list(core.list_namespaced_event(NS, field_selector=f"involvedObject.uid={uid}").items)


def test_miss_then_hit_reported_on_pods_metrics_and_status(
    installed: Installed,
    hub: LocalHub,
    composite: CompositeController,
    node_side: tuple[AgentProcess, InProcessDriver, int],
    targets: Path,
) -> None:
    agent, driver, port = node_side
    hub.add_repo("org/starts", FILES)
    installed.admin.create(
        modelcache(
            "starts", NS, node_selector={POOL: "yes"}, prewarm=True,
            source={"huggingface": {"repo": "org/starts"}},
        )
    )  # fmt: skip
    first = real_pod(installed, "server-0")
    # The kubelet's first attempt comes before the copy exists (the ModelCacheNode is not even
    # created yet): a miss. It retries until mounted.
    request = publish_request("csi-first", str(targets / "first"), "starts", NS, extra=first)
    refusals: list[grpc.StatusCode] = []

    def mounted() -> bool:
        try:
            driver.client.publish(request)
        except grpc.RpcError as err:
            refusals.append(err.code())
            return False
        return True

    assert not mounted()
    # Metacontroller creates the ModelCacheNode; the agent downloads the copy.
    wait_for("the ModelCacheNode", lambda: NODE in modelcachenodes(installed.admin, NS, "starts"), 30)
    mcn = modelcachenodes(installed.admin, NS, "starts")[NODE]
    assert mcn["spec"]["prewarm"] is True
    wait_for("the first Pod's mount", mounted, 60)
    assert set(refusals) == {grpc.StatusCode.UNAVAILABLE}
    assert (targets / "first" / "model-00001.safetensors").read_bytes() == FILES["model-00001.safetensors"]

    wait_for(
        "the miss Event on server-0", lambda: bool(pod_events(installed, first[names.CSI_ATTR_POD_UID])), 30
    )
    (event,) = pod_events(installed, first[names.CSI_ATTR_POD_UID])
    assert (event.reason, event.type) == (REASON_MISS, "Normal")
    assert event.involved_object.kind == "Pod" and event.involved_object.name == "server-0"
    assert f"model cache {NS}/starts was not on node {NODE} at the Pod's first mount attempt" in event.message
    assert "from the origin" in event.message and event.source.component == "praesto-agent"

    # A second Pod finds the copy Ready: a hit.
    second = real_pod(installed, "server-1")
    driver.client.publish(publish_request("csi-second", str(targets / "second"), "starts", NS, extra=second))
    wait_for(
        "the hit Event on server-1", lambda: bool(pod_events(installed, second[names.CSI_ATTR_POD_UID])), 30
    )
    (hit,) = pod_events(installed, second[names.CSI_ATTR_POD_UID])
    assert hit.reason == REASON_HIT and "was Ready on node" in hit.message

    # The copy's status, then the cache's summary through the sync hook.
    starts = modelcachenodes(installed.admin, NS, "starts")[NODE]["status"]["podStarts"]
    assert (starts["hits"], starts["misses"], len(starts["recentWaitSeconds"])) == (1, 1, 2)
    miss_wait, hit_wait = starts["recentWaitSeconds"]
    assert miss_wait > 0 and 0 <= hit_wait < miss_wait

    def summarised(parent: Any) -> bool:
        summary = (((parent or {}).get("status") or {}).get("podStarts")) or {}
        return bool(summary.get("waitSeconds", {}).get("samples") == len(starts["recentWaitSeconds"]))

    # The copy's status change is an event: a pass brings its two starts into the cache's summary.
    synced = composite.wait_parent(NS, "starts", summarised, 30)
    assert synced is not None
    summary = synced["status"]["podStarts"]
    assert summary == {
        "hits": 1,
        "misses": 1,
        "waitSeconds": {"p50": hit_wait, "p95": miss_wait, "samples": 2},
    }
    assert phase_is(names.PHASE_READY)(synced)

    # Prometheus, per cache.
    labels = {"namespace": NS, "model_cache": "starts"}
    assert agent_metric(port, "praesto_pod_model_wait_seconds_count", **labels) == 2
    assert agent_metric(port, "praesto_pod_model_starts_total", **labels, result="hit") == 1
    assert agent_metric(port, "praesto_pod_model_starts_total", **labels, result="miss") == 1
    assert agent_metric(port, "praesto_pod_model_bytes_total", **labels, origin="source") == SIZE
    # spec.prewarm: each mount read the copy into the page cache (the bytes, not their speed, are tested)
    wait_for(
        "prewarm of both mounts",
        lambda: agent_metric(port, "praesto_pod_model_prewarmed_bytes_total", **labels) >= SIZE,
        30,
    )
    assert agent.base.joinpath(".praesto", "pods").is_dir()
    assert list(agent.base.joinpath(".praesto", "pods").glob("*.json")) == []  # reported and removed
