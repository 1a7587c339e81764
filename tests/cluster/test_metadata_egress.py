"""Issue 21 item 1: the NetworkPolicy the sync hook puts beside an unentitled downloader Job is real.

The hooks read the chart's defaults (rendered by the real Helm engine), so
`downloader.metadataEgress` is on; the sync hook's children for a PVC-mode cache
outside credentials.namespaces include a NetworkPolicy, which Metacontroller's
identity (the chart's ClusterRole) may create and the API server accepts as is.
No CNI runs here to enforce it; what it selects is checked with the API server's
own label selection against the Job's Pod.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from praesto.hooks.config import HooksConfig
from praesto.hooks.pvc import pvc_pass
from praesto.hooks.views import SyncRequest

from praesto.spec import parse_spec
from testkit.chart_install import ensure_namespace
from testkit.helm_chart import one, render_objects
from tests.cluster.installed import METACONTROLLER_SA, Installed

TENANT = "egress-tenant"


def chart_hooks_config() -> HooksConfig:
    container = one(render_objects(), "Deployment", "praesto-hooks")["spec"]["template"]["spec"][
        "containers"
    ][0]
    return HooksConfig.from_env({e["name"]: e["value"] for e in container["env"] if "value" in e})


def test_metacontroller_creates_the_egress_policy_and_it_selects_the_job_pod(installed: Installed) -> None:
    ensure_namespace(installed.admin, TENANT)
    spec = {"source": {"uri": "s3://models/llama"}, "storage": {"size": "1Gi", "storageClassName": "rwx"}}
    parent: dict[str, Any] = {"metadata": {"name": "egress", "namespace": TENANT, "uid": "0"}, "spec": spec}
    request = SyncRequest.parse({"parent": parent})
    children = pvc_pass(request, parse_spec(spec), chart_hooks_config(), datetime.now(UTC))
    made = {c["kind"]: c for c in children["children"]}
    policy = made["NetworkPolicy"]
    policy["metadata"].pop("ownerReferences", None)  # the parent above is not a real object
    created = installed.kube_as(METACONTROLLER_SA).create(policy)
    assert created["spec"]["egress"] == policy["spec"]["egress"]
    template = made["Job"]["spec"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "download", "namespace": TENANT, **template["metadata"]},
           "spec": template["spec"]}  # fmt: skip
    core = client.CoreV1Api(installed.admin.api)
    core.create_namespaced_pod(TENANT, pod)
    selector = ",".join(f"{k}={v}" for k, v in policy["spec"]["podSelector"]["matchLabels"].items())
    assert [p.metadata.name for p in core.list_namespaced_pod(TENANT, label_selector=selector).items] == [
        "download"
    ]
