"""End to end on kind: install with Helm, cache a tiny public model, see it inside Pods.

Runs where docker (with a working engine), kind, kubectl and helm exist and
PRAESTO_E2E=1 is set (e2e/run.sh sets it); otherwise the whole module is
skipped with the reason, so `make test` stays green and fast. Needs internet:
Hugging Face, the CSI sidecar, Metacontroller and cert-manager images.
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import Cluster, missing_prerequisite, poll

pytestmark = pytest.mark.e2e

_why = missing_prerequisite()
if _why is not None:
    pytest.skip(f"e2e on kind: {_why}", allow_module_level=True)
if os.environ.get("PRAESTO_E2E") != "1":
    pytest.skip(
        "e2e on kind: set PRAESTO_E2E=1 (e2e/run.sh does) to create a kind cluster", allow_module_level=True
    )

# A few MB, public, with a config.json: fast enough for CI.
MODEL = "hf-internal-testing/tiny-random-gpt2"
CHECK = (
    "import os,sys; p=sys.argv[1]; print(sorted(os.listdir(p)));"
    "assert os.path.isfile(os.path.join(p,'config.json'));"
    "open(os.path.join(p,'x'),'w')"
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    suffix = uuid.uuid4().hex[:6]
    c = Cluster(name=f"praesto-e2e-{suffix}", image=f"praesto:e2e-{suffix}")
    c.create()
    try:
        c.load_image()
        c.install_cert_manager()
        with tempfile.TemporaryDirectory() as tmp:
            c.install_praesto(Path(tmp))
        yield c
    finally:
        if os.environ.get("PRAESTO_E2E_KEEP") != "1":
            c.delete()


def namespace(cluster: Cluster, name: str) -> str:
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": {"praesto.io/model-cache-injection": "enabled"}},
        }
    )
    return name


def model_cache(name: str, ns: str, **spec: Any) -> dict[str, Any]:
    body = {"source": {"huggingface": {"repo": MODEL}}, "storage": {"size": "1Gi"}} | spec
    return {
        "apiVersion": "praesto.praesto.io/v1alpha1",
        "kind": "ModelCache",
        "metadata": {"name": name, "namespace": ns},
        "spec": body,
    }


def consumer(name: str, ns: str, cache: str, image: str) -> dict[str, Any]:
    """A Pod that lists the model, checks a file, and proves the mount is read-only (the write must fail)."""
    script = CHECK + "\n"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "annotations": {
                "praesto.io/model-mounts": json.dumps([{"modelCache": cache, "mountPath": "/models"}])
            },
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "app",
                    "image": image,
                    "command": ["sh", "-c", f'python -c "{script}" /models 2>&1; true'],
                }
            ],
        },
    }


def assert_sees_model_read_only(log: str) -> None:
    assert "config.json" in log, log
    assert "Read-only file system" in log, log


def test_local_mode_pod_sees_the_model(cluster: Cluster) -> None:
    ns = namespace(cluster, "e2e-local")
    cluster.apply(model_cache("tiny", ns, nodeSelector={"praesto.io/cache-node": "true"}))
    status = cluster.wait_phase("tiny", ns, "Ready")["status"]
    assert status["mode"] == "Node" and status["readyNodes"] == status["totalNodes"] == 1
    cluster.apply(consumer("reader", ns, "tiny", cluster.image))
    assert_sees_model_read_only(cluster.pod_output("reader", ns))
    pod = cluster.get("pod", "reader", ns)
    assert pod is not None and pod["metadata"]["labels"]["praesto.io/uses-model-cache"] == "true"
    assert "config.json" in cluster.on_node("ls", f"/var/praesto/{ns}/tiny")


def test_pvc_mode_with_a_hostpath_rwx_class(cluster: Cluster) -> None:
    ns = namespace(cluster, "e2e-pvc")
    cluster.on_node("sh", "-c", "mkdir -p /var/e2e-rwx && chmod 0777 /var/e2e-rwx")
    cluster.apply(
        [
            {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "e2e-rwx"},
             "provisioner": "kubernetes.io/no-provisioner", "volumeBindingMode": "WaitForFirstConsumer"},
            {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "e2e-rwx"},
             "spec": {"capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "e2e-rwx",
                      "hostPath": {"path": "/var/e2e-rwx", "type": "Directory"}}},
        ]
    )  # fmt: skip
    cluster.apply(model_cache("tiny-rwx", ns, storage={"size": "1Gi", "storageClassName": "e2e-rwx"}))
    status = cluster.wait_phase("tiny-rwx", ns, "Ready")["status"]
    assert status["mode"] == "PVC" and status["pvcName"] and status["downloadJobName"]
    cluster.apply(consumer("reader", ns, "tiny-rwx", cluster.image))
    assert_sees_model_read_only(cluster.pod_output("reader", ns))


def test_eviction_then_rehydration(cluster: Cluster) -> None:
    ns = namespace(cluster, "e2e-evict")
    cluster.apply(
        model_cache("tiny", ns, nodeSelector={"praesto.io/cache-node": "true"}, eviction={"unusedTTL": "1m"})
    )
    cluster.wait_phase("tiny", ns, "Ready")
    cluster.apply(consumer("first", ns, "tiny", cluster.image))
    assert_sees_model_read_only(cluster.pod_output("first", ns))
    cluster.kubectl("delete", "pod", "first", "-n", ns, "--wait=true")

    def evicted() -> bool:
        out = cluster.on_node("sh", "-c", f"test -e /var/praesto/{ns}/tiny && echo present || echo gone")
        return out.strip() == "gone"

    poll("the unused node copy to be evicted", evicted, timeout=600, interval=5)
    cluster.apply(consumer("second", ns, "tiny", cluster.image))
    assert_sees_model_read_only(cluster.pod_output("second", ns))
    cluster.wait_phase("tiny", ns, "Ready")
