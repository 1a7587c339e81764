"""Shared-PVC mode on a real kubelet: our image's download Job fills a ReadWriteMany volume, Pods read it.

The path: the sync hook creates the PVC and the download Job; the PV controller binds the
PVC to a static PV (a hostPath directory standing in for NFS: what matters is that a real
kubelet mounts it); the Job controller makes the Pod; the kubelet runs our image
(testkit/praesto_image.py, imported into the node's containerd as a pulled image
would be) as uid 65532 on a read-only root, and `praesto-agent download` fetches the model
from the tier's hub over the Pod network; the cache becomes Ready; a Pod annotated for it
gets the PVC from the webhook and reads the model read-only.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from praesto import names
from testkit.controlplane import wait_for
from testkit.hub import LocalHub
from testkit.metacontroller import Metacontroller
from testkit.praesto_image import NONROOT, praesto_image
from testkit.real_node import RealNode
from tests.cluster.installed import Installed
from tests.cluster.tenants import modelcache, opted_in_namespace
from tests.node.node_daemons import NodeDaemons
from tests.node.pods import busybox_pod, core, delete_pod, pod_log, wait_phase
from tests.node.test_pods import FILES, NS, READ, WEIGHTS, wait_cache

CLASS = "praesto-node-rwx"
PV = "praesto-node-shared"


def storage(installed: Installed) -> client.StorageV1Api:
    return client.StorageV1Api(installed.plane.admin())


@pytest.fixture(scope="module")
def shared_volume(
    installed: Installed, node: RealNode, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """The image on the node, a StorageClass without a provisioner and one static RWX PV for it."""
    node.containerd.import_image(praesto_image().archive)
    root = tmp_path_factory.mktemp("shared-volume")
    os.chown(root, NONROOT, NONROOT)  # a hostPath volume gets no fsGroup: the export's owner, as on NFS
    root.chmod(0o755)  # and its mode: readers of any uid may traverse it (mktemp made it 0700)
    admin = installed.admin
    admin.apply(
        {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": CLASS},
         "provisioner": "kubernetes.io/no-provisioner", "volumeBindingMode": "Immediate"}
    )  # fmt: skip
    admin.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": PV},
            "spec": {
                "storageClassName": CLASS,
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": {"path": str(root), "type": "Directory"},
            },
        }
    )
    yield root
    deleted_or_absent(lambda: core(admin).delete_persistent_volume(PV))
    deleted_or_absent(lambda: storage(installed).delete_storage_class(CLASS))


def deleted_or_absent(delete: Callable[[], object]) -> None:
    try:
        delete()
    except ApiException as err:
        if err.status != 404:
            raise


def test_download_job_fills_the_shared_volume_and_a_pod_reads_it(
    installed: Installed,
    hub: LocalHub,
    node: RealNode,
    daemons: NodeDaemons,
    controllers: Metacontroller,
    shared_volume: Path,
) -> None:
    admin = installed.admin
    opted_in_namespace(admin, NS)
    hub.add_repo("org/shared", FILES)
    admin.create(
        modelcache(
            "shared", NS, source={"huggingface": {"repo": "org/shared"}},
            storage={"size": "1Gi", "storageClassName": CLASS},
        )
    )  # fmt: skip
    wait_cache(installed, NS, "shared", names.PHASE_READY, deadline=240)

    # The Job's Pod ran here, on the kubelet, from our image; the volume holds the model, complete.
    job_pods = core(admin).list_namespaced_pod(NS, label_selector="batch.kubernetes.io/job-name").items
    assert [p.spec.node_name for p in job_pods] == [node.name]
    assert job_pods[0].status.phase == "Succeeded"
    assert (shared_volume / "model.safetensors").read_bytes() == WEIGHTS
    assert (shared_volume / names.COMPLETE_FILE).exists()
    assert hub.bytes_by_path, "the model came from the hub over the Pod network"

    admin.create(busybox_pod("shared-reader", NS, READ, cache="shared"))
    assert wait_phase(admin, "shared-reader", NS, ("Succeeded", "Failed")) == "Succeeded"
    log = pod_log(admin, "shared-reader", NS)
    assert hashlib.sha256(WEIGHTS).hexdigest() in log
    assert "write-refused" in log  # the model is read-only to the Pod
    reader = core(admin).read_namespaced_pod("shared-reader", NS)
    claims = [v.persistent_volume_claim for v in reader.spec.volumes if v.persistent_volume_claim]
    assert len(claims) == 1 and claims[0].read_only

    delete_pod(admin, "shared-reader", NS)
    admin.delete(names.API_VERSION, names.MODELCACHE_KIND, "shared", NS)
    wait_for(
        "the cache's PVC and Job collected with it",
        lambda: (
            not core(admin).list_namespaced_persistent_volume_claim(NS).items
            and not core(admin).list_namespaced_pod(NS, label_selector="batch.kubernetes.io/job-name").items
        ),
        60,
    )
