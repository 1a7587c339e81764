"""Shared PVC mode on the real control plane: the PVC and Job are created for real, the Job controller
makes the Pod, and the garbage collector removes them with the ModelCache.

No kubelet runs the Pod, so the test does its part: it runs the Pod's own
command (from the Pod spec) locally, with the PVC's mount path mapped to a
temp directory and the Hub endpoint pointed at the local hub, then reports the
container's exit the way a kubelet would (the Pod's status).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from kubernetes import client

from praesto import names
from testkit.controlplane import wait_for
from testkit.hub import LocalHub
from testkit.metacontroller import CompositeController, gone
from tests.cluster.agents import agent_command
from tests.cluster.flows import merge_patch, phase_is, wait_gone
from tests.cluster.installed import Installed
from tests.cluster.tenants import modelcache, opted_in_namespace

NS = "pvc-mode"
CLASS = "pvc-rwx"
Obj = dict[str, Any]


def pvc_namespace(installed: Installed) -> None:
    """The opted-in namespace and a ReadWriteMany StorageClass (no provisioner runs: PVCs stay Pending)."""
    opted_in_namespace(installed.admin, NS)
    installed.admin.apply(
        {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": CLASS},
         "provisioner": "nfs.example.com"}
    )  # fmt: skip


def job_pod(core: client.CoreV1Api, job: str) -> Any:
    found: list[Any] = []

    def created() -> bool:
        found[:] = core.list_namespaced_pod(NS, label_selector=f"batch.kubernetes.io/job-name={job}").items
        return bool(found)

    wait_for(f"the Job controller to create the Pod of {job}", created, 30)
    return found[0]


def run_like_the_kubelet(pod: Any, volume_root: Path, hub_endpoint: str) -> subprocess.CompletedProcess[str]:
    """The Pod's container command, its env, and its PVC mount mapped under `volume_root`."""
    container = pod.spec.containers[0]
    mounts = {m.mount_path: volume_root / m.name for m in container.volume_mounts}
    for path in mounts.values():
        path.mkdir(parents=True, exist_ok=True)

    def local(arg: str) -> str:
        for mount_path, target in mounts.items():
            if arg == mount_path or arg.startswith(mount_path + "/"):
                return str(target) + arg[len(mount_path) :]
        return arg

    env = {e.name: local(e.value) for e in container.env or [] if e.value is not None}
    env["HF_ENDPOINT"] = hub_endpoint  # the cluster's route to the Hub is the local hub here
    env["PRAESTO_TERMINATION_LOG"] = str(volume_root / "termination-log")  # the kubelet's file for it
    assert container.command == ["praesto-agent"]
    argv = [agent_command(), *[local(a) for a in container.args]]
    return subprocess.run(
        argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=120, check=False
    )


def test_a_download_pod_that_cannot_start_is_reported_within_one_sync(
    installed: Installed, composite: CompositeController
) -> None:
    """Finding 5: a missing token Secret showed `Downloading` until the Job's 6-hour deadline."""
    pvc_namespace(installed)
    source = {
        "huggingface": {
            "repo": "org/private",
            "token": {"secretRef": {"name": "no-such-secret", "key": "HF_TOKEN"}},
        }
    }
    installed.admin.create(
        modelcache("nosecret", NS, source=source, storage={"size": "1Gi", "storageClassName": CLASS})
    )
    core = client.CoreV1Api(installed.admin.api)
    pod = job_pod(core, names.download_job_name("nosecret"))
    container = pod.spec.containers[0]
    message = 'secret "no-such-secret" not found'  # what the kubelet reports for a missing secretKeyRef
    waiting = {"reason": "CreateContainerConfigError", "message": message}
    reported = merge_patch(installed.admin, "v1", "Pod", pod.metadata.name, {"status": {"containerStatuses": [
        {"name": container.name, "image": container.image, "imageID": "", "ready": False, "restartCount": 0,
         "state": {"waiting": waiting}}]}}, NS, status=True)  # fmt: skip
    # One sync: the pass that the Pod's status change triggers (a related object) reports it.
    result = composite.wait_pass(f"{NS}/nosecret", lambda p: p.triggered_by("update", reported), 30)
    status = result.response["status"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert status["phase"] == names.PHASE_PENDING
    assert ready["reason"] == "CreateContainerConfigError"
    assert message in ready["message"] and "create what it names" in ready["message"]
    installed.admin.delete(names.API_VERSION, names.MODELCACHE_KIND, "nosecret", NS)
    composite.wait_parent(NS, "nosecret", gone, deadline=30)


def test_pvc_job_runs_the_downloader_and_the_cache_becomes_ready_then_is_collected(
    installed: Installed, hub: LocalHub, composite: CompositeController, tmp_path: Path
) -> None:
    pvc_namespace(installed)
    commit = hub.add_repo("org/shared", {"config.json": b'{"a": 1}', "weights.bin": b"x" * 20_000})
    cache = modelcache(
        "shared",
        NS,
        source={"huggingface": {"repo": "org/shared"}},
        storage={"size": "1Gi", "storageClassName": CLASS},
    )
    installed.admin.create(cache)
    result = composite.wait_parent(NS, "shared", phase_is(names.PHASE_PENDING, names.PHASE_DOWNLOADING), 30)
    assert result is not None
    assert result["status"]["phase"] in (names.PHASE_PENDING, names.PHASE_DOWNLOADING)
    core, batch = client.CoreV1Api(installed.admin.api), client.BatchV1Api(installed.admin.api)
    pvc = core.read_namespaced_persistent_volume_claim(names.pvc_name("shared"), NS)
    assert pvc.spec.access_modes == ["ReadWriteMany"] and pvc.spec.storage_class_name == CLASS
    job = batch.read_namespaced_job(names.download_job_name("shared"), NS)
    assert job.metadata.owner_references[0].block_owner_deletion is True

    pod = job_pod(core, job.metadata.name)
    ran = run_like_the_kubelet(pod, tmp_path / "volumes", hub.endpoint)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert (tmp_path / "volumes" / "cache" / names.COMPLETE_FILE).is_file()
    assert pod.spec.containers[0].termination_message_policy == "FallbackToLogsOnError"
    report = (tmp_path / "volumes" / "termination-log").read_text()
    terminated = {"exitCode": 0, "reason": "Completed", "message": report}
    core.patch_namespaced_pod_status(
        pod.metadata.name,
        NS,
        {
            "status": {
                "phase": "Succeeded",
                "containerStatuses": [
                    {
                        "name": pod.spec.containers[0].name,
                        "image": pod.spec.containers[0].image,
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": {"terminated": terminated},
                    }
                ],
            }
        },
    )
    ready = composite.wait_parent(NS, "shared", phase_is(names.PHASE_READY), deadline=60)
    assert ready is not None
    status = ready["status"]
    assert status["pvcName"] == names.pvc_name("shared")
    # What the downloader reported through its termination message, not the request:
    assert status["resolvedRevision"] == commit
    assert status["sizeBytes"] == len(b'{"a": 1}') + 20_000
    assert status["progress"]["summary"].startswith("100% of")

    # Deleting the cache: finalize has nothing to wait for, the finalizer goes, and the real
    # garbage collector removes the PVC and the Job (and the Job its Pod).
    installed.admin.delete(names.API_VERSION, names.MODELCACHE_KIND, "shared", NS)
    composite.wait_parent(NS, "shared", gone, deadline=30)
    wait_gone(installed.admin, "batch/v1", "Job", names.download_job_name("shared"), NS)
    wait_gone(installed.admin, "v1", "PersistentVolumeClaim", names.pvc_name("shared"), NS)
