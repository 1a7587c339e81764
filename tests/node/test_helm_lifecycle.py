"""Day one and two with the real `helm` CLI: install, a cache read by a Pod, upgrade, rollback, uninstall.

What an operator does with the chart README, run by helm v4.3.2 (built from its Go module,
tests/tools) against the tier's API server and a real kubelet + containerd:

* `helm install` of the working tree's chart (the README's from-source line, plus the tier's
  values file): the hooks Deployment's Pod runs praesto-hooks from the Praesto image (built here,
  testkit/praesto_image.py), and the API server calls its webhooks through their Service (the
  tier routes a Service to a ready endpoint; Pods reach the API server through the `kubernetes`
  Service, testkit/kubernetes_service.py);
* a ModelCache Ready on the node, and a Pod reading it through the CSI volume;
* `helm upgrade --reuse-values` turning `verification.requiredIn` on for a namespace: the hooks'
  Pod rolls, and an unsigned ModelCache there is refused; `helm rollback` to revision 1: accepted
  again;
* the README's "Uninstall" section, line by line as printed: `helm uninstall` with the cache
  Ready and the Pod running is refused by the pre-delete hook (its Job's Pod runs
  `praesto uninstall-check` on the node), naming the cache, with every object of the release still
  there; then the rollback, `--set uninstall.deleteModelCaches=true` and `helm uninstall` again,
  which deletes the cache, waits while the Pod still mounts the copy (the test then deletes the
  Pod, as the message says), and goes. Afterwards no object of the release remains, no
  ModelCache or ModelCacheNode, no node label of ours, the node's store holds no copy, and the
  CRDs are still there.

Stand-ins, as in the rest of the node tier: Metacontroller cannot be installed from a registry
here, so the release has `metacontroller.enabled=false` (what a cluster that already runs
Metacontroller sets), Metacontroller's own CRDs are installed first as such a cluster has them,
and the project's Metacontroller stand-in (testkit/metacontroller.py) plays it with the
CompositeController and DecoratorController the release installed, calling the hooks through
their Service, with a cluster-admin identity (metacontroller-helm's default grant is `*/*/*`).
Helm needs the declared dependency present even when disabled, so the chart is a copy holding
the metacontroller-helm stand-in (testkit/metacontroller_subchart.py). The node DaemonSet's agent
and CSI plugin run as host processes from the installed wheel (tests/node/node_daemons.py) with
the arguments of the DaemonSet Helm applied; the release's DaemonSet itself selects no node.

The session's other node tests install the chart without helm (conftest `installed`): this
module runs first (conftest orders it), since both cannot hold the cluster-scoped CSIDriver.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from praesto import names
from testkit.chart_install import METACONTROLLER_CRDS, ensure_namespace, install_crds
from testkit.controlplane import ControlPlane, wait_for
from testkit.helm_chart import CHART_DIR, CRD_DIR, NAMESPACE, RELEASE, one
from testkit.hub import LocalHub
from testkit.kube_apply import Kube
from testkit.metacontroller import Metacontroller
from testkit.metacontroller_subchart import chart_copy_with_dependency
from testkit.praesto_image import praesto_image
from testkit.real_node import RealNode
from tests.cluster.controllers import WATCH_LAG
from tests.cluster.tenants import modelcache, opted_in_namespace
from tests.node.helm_release import HelmCli, ReleaseOnNode, ServiceHookClient, still_there, wait_rolled_out
from tests.node.node_daemons import NodeDaemons, chart_values
from tests.node.pods import busybox_pod, delete_pod, pod_log, pod_phase, wait_phase

Obj = dict[str, Any]
README = CHART_DIR / "README.md"
TENANT = "helm-tenant"
SIGNED_ONLY = "helm-signed-only"
CACHE = "tiny"
REPO = "helm-demo/tiny-model"
MODEL = {"config.json": b'{"hidden_size": 64}', "model.safetensors": bytes(range(256)) * 4096}
READER = "cat /models/config.json; echo; while true; do sleep 2; cat /models/config.json >/dev/null; done"
HOOKS = f"{RELEASE}-hooks"
FROM_SOURCE = re.compile(r"^helm install praesto charts/praesto .*$", re.M)
DEADLINE = 180.0


def uninstall_section() -> list[str]:
    """The `helm` lines of the README's Uninstall section, in order, as printed."""
    section = README.read_text().split("\n## Uninstall\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    return [line for block in blocks for line in block.splitlines() if line.startswith("helm ")]


def install_line() -> str:
    """The README's install from source (after `helm dependency build`), with the tier's values."""
    (line,) = FROM_SOURCE.findall(README.read_text().split("\n## Install\n", 1)[1].split("\n## ", 1)[0])
    return f"{line} -f tier-values.yaml"


def tier_values(hub: LocalHub) -> Obj:
    values = chart_values(hub)
    values["nodeAgent"]["nodeSelector"] = {"praesto.test/daemonset-pods": "host-processes"}
    return {
        **values,
        "metacontroller": {"enabled": False},
        "webhooks": {"certManager": {"enabled": False}},
        "hooks": {"replicas": 1},
    }


def accepts_unsigned(admin: Kube) -> bool | None:
    """Whether the ModelCache webhook admits an unsigned cache in SIGNED_ONLY (a dry run); None
    while no hooks Pod answers."""
    body = modelcache("unsigned", SIGNED_ONLY, source={"huggingface": {"repo": REPO}})
    try:
        admin.resource(names.API_VERSION, names.MODELCACHE_KIND).create(
            body=body, namespace=SIGNED_ONLY, query_params=[("dryRun", "All")]
        )
    except ApiException as err:
        if "only signed models" in str(err.body):
            return False
        return None
    return True


def wait_admission(admin: Kube, accepted: bool) -> None:
    wait_for(f"unsigned caches {'accepted' if accepted else 'refused'} in {SIGNED_ONLY}",
             lambda: accepts_unsigned(admin) is accepted, DEADLINE, interval=1)  # fmt: skip


def cache_phase(admin: Kube) -> str:
    got = admin.get(names.API_VERSION, names.MODELCACHE_KIND, CACHE, TENANT) or {}
    return str((got.get("status") or {}).get("phase") or ("Gone" if not got else "Pending"))


def ours(admin: Kube) -> dict[str, list[str]]:
    """ModelCaches, ModelCacheNodes and Node labels of Praesto left anywhere."""
    left: dict[str, list[str]] = {}
    for kind in (names.MODELCACHE_KIND, names.MODELCACHENODE_KIND):
        items = admin.list(names.API_VERSION, kind)
        if items:
            left[kind] = [f"{o['metadata']['namespace']}/{o['metadata']['name']}" for o in items]
    for node in client.CoreV1Api(admin.api).list_node().items:
        labels = [k for k in node.metadata.labels or {} if k.startswith("ready.praesto.io/")]
        if labels:
            left[f"Node {node.metadata.name}"] = labels
    return left


# What the README says stays in a store after the uninstall: the agent's lock file (agent/baselock.py).
STAYS = (".praesto/agent.lock",)


def store_files(base: Path) -> list[str]:
    return sorted(str(p.relative_to(base)) for p in base.rglob("*") if not p.is_dir())


def leave_no_release(helm: HelmCli) -> None:
    """After a failure: remove what is left of the release without its hook, so that the node's
    drain ends (the hooks Deployment would put its Pod back) and later tests find no release."""
    if helm.run(f"helm status {RELEASE} --namespace {NAMESPACE}", ok=False).returncode == 0:
        helm.run(f"helm uninstall {RELEASE} --namespace {NAMESPACE} --no-hooks", ok=False)


# The node's start (a cold image build and import included) and its teardown count too.
@pytest.mark.timeout(900)
def test_helm_install_upgrade_rollback_and_uninstall_both_ways(
    control_plane: ControlPlane, node: RealNode, hub: LocalHub, tmp_path: Path
) -> None:
    admin = Kube(control_plane.admin())
    install_crds(admin, [METACONTROLLER_CRDS])  # the cluster's own Metacontroller brought them
    node.containerd.import_image(praesto_image().archive)
    hub.add_repo(REPO, MODEL)
    helm = HelmCli(tmp_path, control_plane.admin_kubeconfig)
    chart_copy_with_dependency(helm.cwd / "charts")
    (helm.cwd / "tier-values.yaml").write_text(yaml.safe_dump(tier_values(hub)))
    lines = uninstall_section()  # uninstall (refused), rollback, upgrade with the force value, uninstall
    assert len(lines) == 4 and lines[0] == lines[3] and "uninstall.deleteModelCaches=true" in lines[2], lines

    # ---- day one: install; a cache Ready on the node, a Pod reading it ----
    helm.run(install_line())
    wait_rolled_out(admin, HOOKS, NAMESPACE, DEADLINE)  # the kubelet runs praesto-hooks from the image
    release = ReleaseOnNode(control_plane, admin, tmp_path / "trust", helm.manifest(RELEASE, NAMESPACE))
    release.trust_dir.mkdir()
    composite = one(release.objects, "CompositeController")
    ca = tmp_path / "hooks-ca.crt"
    ca.write_text(composite["spec"]["hooks"]["sync"]["webhook"]["caBundle"]["inline"])
    hooks = ServiceHookClient("", ca, kube=admin)
    standin = Metacontroller(Kube(control_plane.admin(), field_manager="metacontroller"), hooks, composite,
                             one(release.objects, "DecoratorController"), lag=WATCH_LAG)  # fmt: skip
    with standin, NodeDaemons(release, node, tmp_path / "daemons") as daemons:
        try:
            day_one_and_two(helm, admin, node, daemons)
            uninstall_both_ways(helm, admin, daemons)
        finally:
            leave_no_release(helm)


def day_one_and_two(helm: HelmCli, admin: Kube, node: RealNode, daemons: NodeDaemons) -> None:
    """A cache Ready on the node and a Pod reading it; a value changed with --reuse-values takes
    effect, and a rollback undoes it."""
    opted_in_namespace(admin, TENANT)
    ensure_namespace(admin, SIGNED_ONLY)
    admin.create(modelcache(CACHE, TENANT, node_selector={"kubernetes.io/hostname": node.name},
                            source={"huggingface": {"repo": REPO}}))  # fmt: skip
    admin.create(busybox_pod("reader", TENANT, READER, cache=CACHE))
    wait_phase(admin, "reader", TENANT, ("Running",), DEADLINE)
    wait_for("the cache Ready", lambda: cache_phase(admin) == names.PHASE_READY, DEADLINE)
    assert json.loads(pod_log(admin, "reader", TENANT).splitlines()[0]) == {"hidden_size": 64}
    assert (daemons.base / TENANT / CACHE / names.COMPLETE_FILE).exists()

    # ---- day two: a value changed with --reuse-values takes effect; rollback undoes it ----
    wait_admission(admin, accepted=True)
    helm.run(f"helm upgrade {RELEASE} charts/praesto --namespace {NAMESPACE} --reuse-values "
             f"--set 'verification.requiredIn={{{SIGNED_ONLY}}}'")  # fmt: skip
    wait_rolled_out(admin, HOOKS, NAMESPACE, DEADLINE)
    wait_admission(admin, accepted=False)
    helm.run(f"helm rollback {RELEASE} 1 --namespace {NAMESPACE}")
    wait_rolled_out(admin, HOOKS, NAMESPACE, DEADLINE)
    wait_admission(admin, accepted=True)
    assert helm.status(RELEASE, NAMESPACE)["version"] == 3


def uninstall_both_ways(helm: HelmCli, admin: Kube, daemons: NodeDaemons) -> None:
    """The README's Uninstall section, as printed: refused with the cache Ready and read, then
    with uninstall.deleteModelCaches."""
    uninstall, rollback, force, uninstall_again = uninstall_section()
    # ---- uninstall, refused: the cache is Ready and read; nothing is removed ----
    objects = helm.manifest(RELEASE, NAMESPACE)
    refused = helm.run(uninstall, ok=False)
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0, said
    assert (
        f"refusing to uninstall praesto, nothing was removed: 1 ModelCache still exists ({TENANT}/{CACHE})"
        in said
    )
    assert f"`{rollback}`" in said, said  # the README's rollback line is the one the refusal prints
    assert still_there(admin, objects) == [f"{o['kind']} {o['metadata'].get('namespace', '')}/"
                                           f"{o['metadata']['name']}" for o in objects]  # fmt: skip
    assert cache_phase(admin) == names.PHASE_READY and pod_phase(admin, "reader", TENANT) == "Running"
    hook = f"{RELEASE}-uninstall-check"
    assert admin.get("batch/v1", "Job", hook, NAMESPACE) is None  # deleted once its output was shown
    assert admin.get("rbac.authorization.k8s.io/v1", "ClusterRole", hook) is None
    assert helm.status(RELEASE, NAMESPACE)["info"]["status"] == "uninstalling"  # why the rollback

    # ---- uninstall with uninstall.deleteModelCaches: the cache goes, then the release ----
    helm.run(rollback)
    helm.run(force)
    running = helm.start(uninstall_again)
    try:
        wait_for("the hook deleting the cache while the Pod still mounts it",
                 lambda: any("waiting for 1 Pod mount" in m for m in copy_messages(admin)), DEADLINE)  # fmt: skip
        assert running.poll() is None, running.communicate()
        delete_pod(admin, "reader", TENANT)  # as the hook's wait says: the Pod ends, its copy goes
        out, err = running.communicate(timeout=DEADLINE)
    finally:
        if running.poll() is None:
            running.kill()
    assert running.returncode == 0, out + err
    assert "every ModelCache and copy is gone" in out + err, out + err
    wait_for("every object of the release gone", lambda: not still_there(admin, objects), 60)
    assert ours(admin) == {}
    assert [f for f in store_files(daemons.base) if f not in STAYS] == []
    assert helm.run(f"helm status {RELEASE} --namespace {NAMESPACE}", ok=False).returncode != 0
    for crd in CRD_DIR.glob("*.yaml"):
        name = yaml.safe_load(crd.read_text())["metadata"]["name"]
        assert admin.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", name) is not None


def copy_messages(admin: Kube) -> list[str]:
    """What each ModelCacheNode's agent says (status.message)."""
    return [str((o.get("status") or {}).get("message") or "") for o in admin.list(names.API_VERSION,
            names.MODELCACHENODE_KIND)]  # fmt: skip
