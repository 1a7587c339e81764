"""Issue 21 item 3: only Praesto's own downloader Jobs may use the downloader ServiceAccount.

The downloader ServiceAccount carries the cluster's workload identity and lives
in tenant namespaces, where RBAC lets a namespace's editors run Pods as any of
its ServiceAccounts. The chart (rendered by the real Helm engine with workload
identity on) adds a ValidatingAdmissionPolicy; the real kube-apiserver and
kube-controller-manager enforce it. A tenant with edit-like rights tries each way
to that identity: a Pod (also through the deprecated `serviceAccount` field), a
Deployment (its ReplicaSet controller is refused), a Job, a TokenRequest and a
legacy token Secret. Metacontroller's identity creating the Job the sync hook
renders is admitted, and the real Job controller creates its Pod.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from praesto.hooks.config import HooksConfig
from praesto.hooks.pvc_job import download_job

from praesto import names
from praesto.credscope import CredentialScope
from praesto.spec import parse_spec
from testkit.chart_install import ensure_namespace
from testkit.controlplane import wait_for
from testkit.helm_chart import render_objects
from testkit.kube_apply import Kube
from tests.cluster.installed import METACONTROLLER_SA, Installed

Obj = dict[str, Any]
TENANT = "identity-tenant"
EDITOR = "editor"
DOWNLOADER = "praesto-downloader"
REFUSED = "carries the cluster's workload identity"
IDENTITY = {
    "credentials": {
        "namespaces": [TENANT],
        "identity": {
            "serviceAccountAnnotations": {
                "azure.workload.identity/client-id": "00000000-0000-0000-0000-000000000000"
            },
            "serviceAccountLabels": {"azure.workload.identity/use": "true"},
            "downloaderNamespaces": [TENANT],
        },
    }
}
# What a namespace's editors may do (Kubernetes' aggregated `edit` role grants these and more).
EDIT_RULES = [
    {"apiGroups": [""], "resources": ["pods", "secrets"], "verbs": ["create", "get", "list"]},
    {"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]},
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["create", "get", "delete"]},
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "get"]},
]


def identity_objects() -> list[Obj]:
    """The chart's downloader ServiceAccount and identity policy, with workload identity configured."""
    rendered = render_objects(IDENTITY)
    return [
        o
        for o in rendered
        if (o["kind"] == "ServiceAccount" and o["metadata"]["name"] == DOWNLOADER)
        or (
            o["kind"].startswith("ValidatingAdmissionPolicy")
            and "downloader-identity" in o["metadata"]["name"]
        )
    ]


def pod(name: str, **spec: Any) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": TENANT},
        "spec": {"containers": [{"name": "c", "image": "registry.example/x:1"}], **spec},
    }


@pytest.fixture(scope="module")
def editor(installed: Installed) -> Iterator[Kube]:
    admin = installed.admin
    ensure_namespace(admin, TENANT)
    applied = [admin.apply(obj) for obj in identity_objects()]
    admin.apply(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": EDITOR, "namespace": TENANT}}
    )
    rbac = "rbac.authorization.k8s.io/v1"
    admin.apply({"apiVersion": rbac, "kind": "Role", "metadata": {"name": EDITOR, "namespace": TENANT},
                 "rules": EDIT_RULES})  # fmt: skip
    admin.apply(
        {"apiVersion": rbac, "kind": "RoleBinding", "metadata": {"name": EDITOR, "namespace": TENANT},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": EDITOR},
         "subjects": [{"kind": "ServiceAccount", "name": EDITOR, "namespace": TENANT}]}
    )  # fmt: skip
    kube = installed.kube_as(EDITOR, TENANT)
    wait_for("the tenant's Role and the identity policy to take effect", lambda: _probe(kube), 30)
    yield kube
    for obj in applied:
        if obj["kind"].startswith("ValidatingAdmissionPolicy"):
            admin.delete(obj["apiVersion"], obj["kind"], obj["metadata"]["name"])


def _probe(kube: Kube) -> bool:
    """True once a Pod of the editor's is admitted and one as the downloader is refused by the policy."""
    try:
        _dry_run_pod(kube, pod("probe-own"))
        _dry_run_pod(kube, pod("probe", serviceAccountName=DOWNLOADER))
    except ApiException as err:
        return err.status == 403 and REFUSED in str(err.body)
    return False


def _dry_run_pod(kube: Kube, body: Obj) -> None:
    client.CoreV1Api(kube.api).create_namespaced_pod(TENANT, body, dry_run="All")


def refusal(call: Any) -> str:
    with pytest.raises(ApiException) as refused:
        call()
    assert refused.value.status == 403, refused.value.body
    return str(refused.value.body)


def test_a_tenant_pod_may_not_run_as_the_downloader(editor: Kube) -> None:
    _dry_run_pod(editor, pod("own-account"))  # the policy leaves every other ServiceAccount alone
    body = refusal(lambda: _dry_run_pod(editor, pod("borrow", serviceAccountName=DOWNLOADER)))
    assert f"only Praesto's downloader Jobs may run as the ServiceAccount {DOWNLOADER}" in body
    # the deprecated field is the same field once the API server has read the Pod
    assert REFUSED in refusal(lambda: _dry_run_pod(editor, pod("borrow-old", serviceAccount=DOWNLOADER)))


def test_a_tenant_job_or_deployment_gets_no_pod_as_the_downloader(installed: Installed, editor: Kube) -> None:
    template = {
        "metadata": {"labels": {"app": "borrow"}},
        "spec": {**pod("x")["spec"], "serviceAccountName": DOWNLOADER},
    }
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "borrow", "namespace": TENANT},
           "spec": {"template": {**template, "spec": {**template["spec"], "restartPolicy": "Never"}}}}  # fmt: skip
    assert "only Praesto (Metacontroller, from a ModelCache) may create a Job" in refusal(
        lambda: editor.create(job)
    )
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "borrow", "namespace": TENANT},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "borrow"}}, "template": template},
    }
    editor.create(deployment)  # admitted: it is the ReplicaSet controller's Pod that is refused
    apps = client.AppsV1Api(installed.admin.api)
    failures: list[str] = []

    def replica_failure() -> bool:
        for rs in apps.list_namespaced_replica_set(TENANT, label_selector="app=borrow").items:
            failures.extend(c.message or "" for c in rs.status.conditions or () if c.type == "ReplicaFailure")
        return bool(failures)

    wait_for("the ReplicaSet controller to report its refused Pod", replica_failure, 60)
    assert REFUSED in failures[0]
    assert (
        not client.CoreV1Api(installed.admin.api)
        .list_namespaced_pod(TENANT, label_selector="app=borrow")
        .items
    )
    editor.delete("apps/v1", "Deployment", "borrow", TENANT)


def test_no_token_for_the_downloader_by_token_request_or_secret(editor: Kube) -> None:
    core = client.CoreV1Api(editor.api)
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=["sts.amazonaws.com"])
    )
    body = refusal(lambda: core.create_namespaced_service_account_token(DOWNLOADER, TENANT, request))
    assert "issued only to the kubelet" in body
    core.create_namespaced_service_account_token(EDITOR, TENANT, request)  # its own: still allowed
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "legacy", "namespace": TENANT,
                     "annotations": {"kubernetes.io/service-account.name": DOWNLOADER}},
        "type": "kubernetes.io/service-account-token",
    }  # fmt: skip
    assert "may not name praesto-downloader" in refusal(lambda: editor.create(secret))


def test_praestos_own_job_runs_as_the_downloader(installed: Installed, editor: Kube) -> None:
    """The Job the sync hook renders, created as Metacontroller: the Job controller makes its Pod."""
    config = HooksConfig(downloader_service_account=DOWNLOADER, credential_scope=CredentialScope((TENANT,)))
    spec = {"source": {"uri": "s3://models/llama"}, "storage": {"size": "1Gi", "storageClassName": "rwx"}}
    parent = {"metadata": {"name": "idjob", "namespace": TENANT, "uid": "0"}, "spec": spec}
    job = download_job(parent, parse_spec(spec), config)
    job["metadata"].pop("ownerReferences", None)  # the parent above is not a real object
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == DOWNLOADER
    metacontroller = installed.kube_as(METACONTROLLER_SA)
    metacontroller.create(job)
    core = client.CoreV1Api(installed.admin.api)
    selector = f"batch.kubernetes.io/job-name={names.download_job_name('idjob')}"
    wait_for(
        "the Job controller to create the download Pod",
        lambda: bool(core.list_namespaced_pod(TENANT, label_selector=selector).items),
        60,
    )
    made = core.list_namespaced_pod(TENANT, label_selector=selector).items[0]
    assert made.spec.service_account_name == DOWNLOADER
    installed.admin.delete(
        "batch/v1", "Job", job["metadata"]["name"], TENANT, propagation_policy="Background"
    )
