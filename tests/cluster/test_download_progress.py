"""Issue 36 item 5, PVC mode: a running download Job's live progress, least privilege, on the real API server.

The ModelCache is created for real; the Metacontroller stand-in runs the sync hook and creates the
PVC, the Job and the progress Role and RoleBinding as the chart's Metacontroller ServiceAccount
(so RBAC's escalation check on that Role passes or fails for real), and the real Job controller
makes the Pod. No kubelet runs it, so the test plays its part for the one projected volume that
matters: a token for the Pod's ServiceAccount, bound to that Pod (what the kubelet requests), and
the cluster's CA. The production patcher (agent/job_progress.py) writes the annotation with it;
Metacontroller's re-sync on the Job's change brings it into the ModelCache's status through the
hook. Then every other use of the same identity is tried and refused, by RBAC (another Job, a
delete) or by the chart's ValidatingAdmissionPolicy (spec, labels, another annotation, an
oversized value, a token not bound to the Job's Pod).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from praesto.agent import job_progress

from praesto import jobprogress, names, progress
from praesto.kubeerrors import Forbidden
from testkit.controlplane import wait_for
from testkit.helm_chart import RELEASE
from testkit.metacontroller import CompositeController, gone
from tests.cluster.installed import Installed
from tests.cluster.tenants import modelcache

NS = "live-progress"
CLASS = "live-rwx"
CACHE = "live"
JOB = names.download_job_name(CACHE)
POLICY_REFUSAL = "a download Pod may change only the praesto.io/progress annotation"
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def download_pod(installed: Installed, composite: CompositeController) -> Any:
    admin = installed.admin
    admin.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    admin.apply({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": CLASS},
                 "provisioner": "nfs.example.com"})  # fmt: skip
    core = client.CoreV1Api(admin.api)
    wait_for(  # the ServiceAccount admission plugin refuses the Job's Pod until it exists
        "the namespace's default ServiceAccount",
        lambda: bool(core.list_namespaced_service_account(NS, field_selector="metadata.name=default").items),
        30,
    )
    admin.create(modelcache(CACHE, NS, storage={"size": "1Gi", "storageClassName": CLASS}))
    pods: list[Any] = []

    def created() -> bool:
        pods[:] = core.list_namespaced_pod(NS, label_selector=f"batch.kubernetes.io/job-name={JOB}").items
        return bool(pods)

    wait_for("the Job controller to create the download Pod", created, 60)
    yield pods[0]
    admin.delete(names.API_VERSION, names.MODELCACHE_KIND, CACHE, NS)
    composite.wait_parent(NS, CACHE, gone, deadline=30)


def pod_token(installed: Installed, pod: Any, tmp_path: Path, name: str = "default") -> Path:
    """The projected volume as the kubelet fills it: a token bound to `pod`, and the cluster's CA."""
    folder = tmp_path / f"progress-{pod.metadata.name}-{name}"
    folder.mkdir()
    bound = {"kind": "Pod", "apiVersion": "v1", "name": pod.metadata.name, "uid": pod.metadata.uid}
    (folder / "token").write_text(installed.plane.service_account_token(NS, name, bound_object=bound))
    (folder / "ca.crt").write_bytes(Path(installed.plane.ca_path).read_bytes())
    return folder


def api_env(installed: Installed) -> dict[str, str]:
    """What the kubelet sets in every container (enableServiceLinks: false keeps these)."""
    server = urlsplit(installed.plane.server)
    return {"KUBERNETES_SERVICE_HOST": str(server.hostname), "KUBERNETES_SERVICE_PORT": str(server.port)}


def batch_as(installed: Installed, folder: Path) -> client.BatchV1Api:
    configuration = client.Configuration()
    configuration.host = installed.plane.server
    configuration.ssl_ca_cert = str(folder / "ca.crt")
    configuration.api_key = {"authorization": "Bearer " + (folder / "token").read_text()}
    return client.BatchV1Api(client.ApiClient(configuration))


def refused(call: Callable[[], Any]) -> str:
    with pytest.raises(ApiException) as raised:
        call()
    assert raised.value.status == 403, raised.value.body
    return str(raised.value.body)


def annotate(value: str) -> Obj:
    return {"metadata": {"annotations": {names.ANNOTATION_DOWNLOAD_PROGRESS: value}}}


def test_the_pods_report_reaches_the_modelcache_status(
    installed: Installed, composite: CompositeController, download_pod: Any, tmp_path: Path
) -> None:
    folder = pod_token(installed, download_pod, tmp_path)
    patch = job_progress.job_patcher(NS, JOB, folder, api_env(installed))
    gib = 2**30
    value = jobprogress.encode(gib // 4, gib, 8 * 2**20, datetime.now(UTC))

    def written() -> bool:  # the RoleBinding may trail the Job by a sync: the downloader retries too
        try:
            patch(value)
        except Forbidden:  # the agent's door maps the client's errors (praesto/kubeerrors.py)
            return False
        return True

    wait_for("the progress grant to let the Pod write its annotation", written, 30)

    def shows_rate(parent: Obj | None) -> bool:
        return bool(parent) and progress.BYTES_PER_SECOND in parent["status"].get("progress", {})  # type: ignore[index]

    parent = composite.wait_parent(NS, CACHE, shows_rate, deadline=30)
    assert parent is not None
    assert parent["status"]["phase"] == names.PHASE_DOWNLOADING
    assert parent["status"]["progress"] == {
        progress.BYTES_DONE: gib // 4,
        progress.BYTES_TOTAL: gib,
        progress.BYTES_PER_SECOND: 8 * 2**20,
        progress.ETA_SECONDS: 96,
        progress.SUMMARY: "25% of 1.0 GiB, ~2m left",
    }


def test_the_policy_type_checks_clean(installed: Installed) -> None:
    """The API server type-checks a policy's CEL against the Job schema; a warning is a silent hole."""
    name = f"{RELEASE}-download-progress"
    api = "admissionregistration.k8s.io/v1"
    checked: list[Obj] = []

    def observed() -> bool:
        policy = installed.admin.get(api, "ValidatingAdmissionPolicy", name) or {}
        checked[:] = [policy.get("status") or {}]
        return "typeChecking" in checked[0]

    wait_for("the API server to type-check the progress policy", observed, 30)
    assert not checked[0]["typeChecking"].get("expressionWarnings"), checked[0]


def test_the_identity_may_change_nothing_else(
    installed: Installed, download_pod: Any, tmp_path: Path
) -> None:
    batch = batch_as(installed, pod_token(installed, download_pod, tmp_path))
    wait_for(
        "the progress grant",
        lambda: bool(batch.patch_namespaced_job(JOB, NS, annotate("{}"))),
        30,
    )
    assert POLICY_REFUSAL in refused(
        lambda: batch.patch_namespaced_job(JOB, NS, {"spec": {"activeDeadlineSeconds": 1}})
    )
    assert POLICY_REFUSAL in refused(
        lambda: batch.patch_namespaced_job(JOB, NS, {"metadata": {"labels": {"x": "y"}}})
    )
    assert POLICY_REFUSAL in refused(
        lambda: batch.patch_namespaced_job(JOB, NS, {"metadata": {"annotations": {"other": "x"}}})
    )
    gone_label = {"metadata": {"labels": {names.LABEL_MANAGED_BY: None}}}  # no way out of the policy
    assert POLICY_REFUSAL in refused(lambda: batch.patch_namespaced_job(JOB, NS, gone_label))
    too_long = "x" * (jobprogress.MAX_CHARS + 1)
    assert "at most 512 characters" in refused(
        lambda: batch.patch_namespaced_job(JOB, NS, annotate(too_long))
    )
    # RBAC: the one Job, and only patch
    refused(lambda: batch.delete_namespaced_job(JOB, NS))
    other = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "other", "namespace": NS},
             "spec": {"template": {"spec": {"restartPolicy": "Never",
                                            "containers": [{"name": "c", "image": "registry.example/x:1"}]}}}}  # fmt: skip
    installed.admin.apply(other)
    assert "forbidden" in refused(lambda: batch.patch_namespaced_job("other", NS, annotate("{}")))
    installed.admin.delete("batch/v1", "Job", "other", NS, propagation_policy="Background")
    job = client.BatchV1Api(installed.admin.api).read_namespaced_job(JOB, NS)
    assert job.spec.active_deadline_seconds != 1 and "other" not in (job.metadata.annotations or {})


def test_a_token_not_bound_to_the_jobs_pod_may_not_write(
    installed: Installed, download_pod: Any, tmp_path: Path
) -> None:
    unbound = tmp_path / "unbound"
    unbound.mkdir()
    (unbound / "token").write_text(installed.plane.service_account_token(NS, "default"))
    (unbound / "ca.crt").write_bytes(Path(installed.plane.ca_path).read_bytes())
    body = refused(lambda: batch_as(installed, unbound).patch_namespaced_job(JOB, NS, annotate("{}")))
    assert "only the download Pod of Job" in body
    # a tenant's own Pod, running as the same account, named otherwise
    tenant_pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "tenant", "namespace": NS},
                  "spec": {"automountServiceAccountToken": False,
                           "containers": [{"name": "c", "image": "registry.example/x:1"}]}}  # fmt: skip
    installed.admin.apply(tenant_pod)
    made = client.CoreV1Api(installed.admin.api).read_namespaced_pod("tenant", NS)
    folder = pod_token(installed, made, tmp_path)
    body = refused(lambda: batch_as(installed, folder).patch_namespaced_job(JOB, NS, annotate("{}")))
    assert "only the download Pod of Job" in body
    installed.admin.delete("v1", "Pod", "tenant", NS)
