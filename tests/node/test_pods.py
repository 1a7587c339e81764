"""Real Pods read models at /models: the README's first sentence, on a real kubelet.

The path: the API server calls our webhook, which injects the CSI volume; the real
scheduler binds the Pod to the real node; the kubelet calls our CSI plugin (registered
through its plugin-registration API) with NodePublishVolume; containerd and runc start the
container, which reads the model.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from praesto import names
from testkit.controlplane import wait_for
from testkit.hub import LocalHub
from testkit.metacontroller import Metacontroller
from testkit.real_node import RealNode
from tests.cluster.agents import agent_metric
from tests.cluster.installed import Installed
from tests.cluster.tenants import modelcache, opted_in_namespace
from tests.node.node_daemons import NodeDaemons
from tests.node.pods import (
    busybox_pod,
    core,
    delete_pod,
    event_messages,
    mount_points_of,
    pod_log,
    wait_phase,
)

NS = "team-a"
OTHER_NS = "team-b"
WEIGHTS = bytes(range(256)) * 4096  # 1 MiB
FILES = {"config.json": b'{"model": "tiny"}', "model.safetensors": WEIGHTS}
READ = "sha256sum /models/model.safetensors; touch /models/x 2>&1 || echo write-refused"


def cache_phase(installed: Installed, namespace: str, name: str) -> str:
    cache = installed.admin.get(names.API_VERSION, names.MODELCACHE_KIND, name, namespace)
    return str(((cache or {}).get("status") or {}).get("phase", ""))


def wait_cache(installed: Installed, namespace: str, name: str, phase: str, deadline: float = 120) -> None:
    wait_for(
        f"ModelCache {namespace}/{name} {phase}",
        lambda: cache_phase(installed, namespace, name) == phase,
        deadline,
    )


def create_cache(
    installed: Installed, node: RealNode, namespace: str, name: str, repo: str, **spec: Any
) -> None:
    body = modelcache(
        name,
        namespace,
        node_selector={"kubernetes.io/hostname": node.name},
        source={"huggingface": {"repo": repo}},
        **spec,
    )
    installed.admin.create(body)


@pytest.fixture(scope="module")
def ready_cache(
    installed: Installed, hub: LocalHub, node: RealNode, daemons: NodeDaemons, controllers: Metacontroller
) -> str:
    opted_in_namespace(installed.admin, NS)
    hub.add_repo("org/tiny", FILES)
    create_cache(installed, node, NS, "tiny", "org/tiny")
    wait_cache(installed, NS, "tiny", names.PHASE_READY)
    return "tiny"


def test_annotated_pod_reads_the_model_read_only(
    installed: Installed, node: RealNode, ready_cache: str
) -> None:
    admin = installed.admin
    created = admin.create(busybox_pod("reader", NS, READ, cache=ready_cache))
    assert wait_phase(admin, "reader", NS, ("Succeeded", "Failed")) == "Succeeded", event_messages(
        admin, NS, "reader", "FailedMount"
    )
    pod = core(admin).read_namespaced_pod("reader", NS)
    # The webhook injected the volume; the scheduler bound the Pod to the real node.
    assert pod.spec.node_name == node.name
    assert pod.metadata.labels.get(names.LABEL_USES_MODEL_CACHE) == "true"
    assert any(v.csi and v.csi.driver == names.CSI_DRIVER_NAME for v in pod.spec.volumes)
    output = pod_log(admin, "reader", NS)
    assert f"{hashlib.sha256(WEIGHTS).hexdigest()}  /models/model.safetensors" in output
    assert "Read-only file system" in output and "write-refused" in output
    assert created["metadata"]["uid"] == pod.metadata.uid
    delete_pod(admin, "reader", NS)


def test_pod_waits_in_container_creating_with_progress_then_starts(
    installed: Installed, hub: LocalHub, node: RealNode, daemons: NodeDaemons, controllers: Metacontroller
) -> None:
    admin = installed.admin
    opted_in_namespace(admin, NS)
    big = bytes(range(256)) * (4096 * 6)  # 6 MiB, served at 1 MiB/s per response: a few seconds
    hub.add_repo("org/slow", {"config.json": b"{}", "model.safetensors": big})
    hub.faults.rate = 1 << 20
    try:
        create_cache(admin_installed := installed, node, NS, "slow", "org/slow")
        admin.create(busybox_pod("early", NS, "sha256sum /models/model.safetensors", cache="slow"))
        # ContainerCreating: the kubelet's mount attempts fail with our progress message, in its events.
        wait_for(
            "a FailedMount event with download progress",
            lambda: any(
                "downloading" in m or "waiting" in m
                for m in event_messages(admin, NS, "early", "FailedMount")
            ),
            120,
        )
        assert core(admin).read_namespaced_pod("early", NS).status.phase == "Pending"
        wait_cache(admin_installed, NS, "slow", names.PHASE_READY, 180)
    finally:
        hub.faults.rate = 0
    assert wait_phase(admin, "early", NS, ("Succeeded", "Failed"), 180) == "Succeeded"
    assert hashlib.sha256(big).hexdigest() in pod_log(admin, "early", NS)
    # Cold-start accounting: a miss for the Pod that waited, a hit for the next one.
    wait_for(
        "ModelCacheMiss on early", lambda: bool(event_messages(admin, NS, "early", "ModelCacheMiss")), 60
    )
    labels = {"namespace": NS, "model_cache": "slow"}
    wait_for(
        "praesto_pod_model_wait_seconds recorded",
        lambda: agent_metric(daemons.metrics_port(), "praesto_pod_model_wait_seconds_count", **labels) >= 1,
        60,
    )
    admin.create(busybox_pod("warm", NS, "sha256sum /models/model.safetensors", cache="slow"))
    assert wait_phase(admin, "warm", NS, ("Succeeded", "Failed")) == "Succeeded"
    wait_for("ModelCacheHit on warm", lambda: bool(event_messages(admin, NS, "warm", "ModelCacheHit")), 60)
    for pod in ("early", "warm"):
        delete_pod(admin, pod, NS)


def test_unpublish_eviction_and_rehydration(
    installed: Installed, hub: LocalHub, node: RealNode, daemons: NodeDaemons, controllers: Metacontroller
) -> None:
    admin = installed.admin
    opted_in_namespace(admin, NS)
    hub.add_repo("org/ttl", FILES)
    create_cache(installed, node, NS, "ttl", "org/ttl", eviction={"unusedTTL": "5s"})
    wait_cache(installed, NS, "ttl", names.PHASE_READY)
    created = admin.create(busybox_pod("user", NS, "sha256sum /models/model.safetensors", cache="ttl"))
    assert wait_phase(admin, "user", NS, ("Succeeded", "Failed")) == "Succeeded"
    uid = created["metadata"]["uid"]
    delete_pod(admin, "user", NS)
    # The kubelet unpublished: no mount of the Pod's volume is left on the node.
    wait_for("the Pod's CSI mount gone", lambda: not mount_points_of(uid), 60)
    copy = daemons.base / NS / "ttl"
    wait_for("TTL eviction of the unused copy", lambda: not (copy / names.COMPLETE_FILE).exists(), 120)
    # A new Pod asks for it again: the copy is rehydrated and the Pod starts.
    admin.create(busybox_pod("again", NS, "sha256sum /models/model.safetensors", cache="ttl"))
    assert wait_phase(admin, "again", NS, ("Succeeded", "Failed"), 180) == "Succeeded"
    assert hashlib.sha256(WEIGHTS).hexdigest() in pod_log(admin, "again", NS)
    delete_pod(admin, "again", NS)


def test_another_namespace_is_refused_by_webhook_and_by_csi(
    installed: Installed, node: RealNode, ready_cache: str
) -> None:
    admin = installed.admin
    opted_in_namespace(admin, OTHER_NS)
    with pytest.raises(ApiException) as refused:
        admin.create(busybox_pod("thief", OTHER_NS, READ, cache=ready_cache))
    assert refused.value.status in (400, 403) and ready_cache in str(refused.value.body)
    # Past the webhook: the CSI volume written by hand, naming team-a's cache.
    volume = {
        "name": "model",
        "csi": {
            "driver": names.CSI_DRIVER_NAME,
            "readOnly": True,
            "volumeAttributes": {names.CSI_ATTR_CACHE_NAME: ready_cache, names.CSI_ATTR_LEGACY_NAMESPACE: NS},
        },
    }
    admin.create(
        busybox_pod(
            "by-hand", OTHER_NS, READ, volumes=[volume], mounts=[{"name": "model", "mountPath": "/models"}]
        )
    )
    wait_for(
        "the CSI plugin's refusal in the Pod's events",
        lambda: any(
            NS in m and OTHER_NS in m for m in event_messages(admin, OTHER_NS, "by-hand", "FailedMount")
        ),
        90,
    )
    assert core(admin).read_namespaced_pod("by-hand", OTHER_NS).status.phase == "Pending"
    delete_pod(admin, "by-hand", OTHER_NS)
