"""Install what the chart renders into the real API server, the way `helm install` would, minus kubelets.

Objects are applied as rendered: CRDs, ServiceAccounts, the RBAC of every
component (Metacontroller's ClusterRole from our values, through the stand-in
subchart that templates it as metacontroller-helm does), controllers,
webhook configurations, policies. Two things differ, and only where a test
cluster without kubelets and Services forces it:

* Workloads (Deployments, DaemonSets) are sent with `dryRun=All`: the API
  server validates and admits them, but no Pod is created that nothing could run.
  Their processes are started by the tests themselves, from the rendered args.
* Webhook configurations keep every field but `clientConfig`, which points at
  the test's own praesto-hooks by URL with that server's CA (a Service needs kube-proxy).
"""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from testkit.controlplane import wait_for
from testkit.helm_chart import NAMESPACE, chart_with_metacontroller_standin, render_objects
from testkit.kube_apply import Kube

Obj = dict[str, Any]
METACONTROLLER_CRDS = (
    Path(__file__).resolve().parents[1] / "tests" / "chart" / "data" / "metacontroller-crds.yaml"
)
DRY_RUN_KINDS = frozenset({"Deployment", "DaemonSet"})
WEBHOOK_KINDS = frozenset({"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"})
FIRST = ("Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "Role")


def yaml_documents(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def install_crds(kube: Kube, paths: list[Path]) -> None:
    """Apply CRDs and wait until each is Established (served)."""
    crds = [
        doc for path in paths for doc in yaml_documents(path) if doc["kind"] == "CustomResourceDefinition"
    ]
    for crd in crds:
        kube.apply(crd)

    def established() -> bool:
        for crd in crds:
            got = (
                kube.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", crd["metadata"]["name"]) or {}
            )
            conditions = (got.get("status") or {}).get("conditions") or []
            if not any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                return False
        return True

    wait_for("CRDs to be established", established, 30)
    kube.dynamic.resources.invalidate_cache()


def point_webhooks_at(obj: Obj, url: str, ca_pem: bytes) -> Obj:
    """The same webhook configuration, calling `url` + the path the chart gave each webhook."""
    out = copy.deepcopy(obj)
    for webhook in out["webhooks"]:
        path = webhook["clientConfig"]["service"]["path"]
        webhook["clientConfig"] = {"url": url + path, "caBundle": base64.b64encode(ca_pem).decode()}
    return out


def ordered(objects: list[Obj]) -> list[Obj]:
    """Dependencies first, as Helm's install order does (namespaces, CRDs, identities, then the rest)."""
    rank = {kind: i for i, kind in enumerate(FIRST)}
    return sorted(objects, key=lambda o: rank.get(o["kind"], len(FIRST)))


HOOK_ANNOTATION = "helm.sh/hook"


def is_hook(obj: Obj) -> bool:
    """A Helm hook (e.g. the pre-delete uninstall check): Helm runs it at its event, never installs it."""
    return HOOK_ANNOTATION in ((obj.get("metadata") or {}).get("annotations") or {})


def render_for_cluster(tmp: Path, values: Obj) -> list[Obj]:
    """What `helm install` creates: the rendered objects without hooks."""
    chart = chart_with_metacontroller_standin(tmp)
    return [o for o in render_objects(values, chart_dir=chart) if not is_hook(o)]


def apply_rendered(
    kube: Kube,
    objects: list[Obj],
    *,
    webhook_url: str,
    webhook_ca: bytes,
    skip_kinds: frozenset[str] = frozenset(),
) -> list[Obj]:
    """Apply every rendered object (see module docstring); returns what was applied."""
    applied = []
    for obj in ordered(objects):
        if obj["kind"] in skip_kinds:
            continue
        if obj["kind"] in WEBHOOK_KINDS:
            obj = point_webhooks_at(obj, webhook_url, webhook_ca)
        if obj["kind"] in DRY_RUN_KINDS:
            dry_run_create(kube, obj)
            continue
        applied.append(kube.apply(obj))
    return applied


def dry_run_create(kube: Kube, obj: Obj) -> None:
    """Validate and admit `obj` on the server without persisting it; raises ApiException on refusal."""
    resource = kube.resource(obj["apiVersion"], obj["kind"])
    resource.create(body=obj, namespace=obj["metadata"].get("namespace"), query_params=[("dryRun", "All")])


def ensure_namespace(kube: Kube, name: str, labels: dict[str, str] | None = None) -> None:
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}})

    def has_default_service_account() -> bool:
        try:
            client.CoreV1Api(kube.api).read_namespaced_service_account("default", name)
        except ApiException:
            return False
        return True

    wait_for(f"the default ServiceAccount in {name}", has_default_service_account, 30)


def container_env(deployment: Obj, container: str, namespace: str = NAMESPACE) -> dict[str, str]:
    """A rendered container's environment, with the downward-API namespace resolved."""
    env: dict[str, str] = {}
    for spec in deployment["spec"]["template"]["spec"]["containers"]:
        if spec["name"] != container:
            continue
        for item in spec.get("env") or []:
            if "value" in item:
                env[item["name"]] = str(item["value"])
            elif (item.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
                env[item["name"]] = namespace
    return env
