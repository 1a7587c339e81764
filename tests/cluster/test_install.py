"""The chart on the real API server: it installs, its CRDs validate like we document, its RBAC is what we declare."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from praesto import names, rbac
from testkit.chart_install import ensure_namespace
from testkit.controlplane import ControlPlane, wait_for
from testkit.helm_chart import NAMESPACE, ROOT
from testkit.objects import modelcachenode
from tests.cluster.installed import (
    AGENT_SA,
    HOOKS_SA,
    METACONTROLLER_SA,
    ORPHANS_SA,
    WARM_NAMESPACE,
    Installed,
)

MC = names.MODELCACHE_KIND


def readme_modelcaches() -> list[dict[str, Any]]:
    text = (ROOT / "README.md").read_text()
    docs = [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", text, re.S)]
    return [d for d in docs if isinstance(d, dict) and d.get("kind") == MC]


def test_runs_the_pinned_upstream_release(control_plane: ControlPlane) -> None:
    assert control_plane.version() == "v1.37.2"


def test_every_rendered_object_is_accepted(installed: Installed) -> None:
    """The install fixture applied them all; spot-check that they are really there, as rendered."""
    for kind in ("ClusterRole", "CompositeController", "DecoratorController", "MutatingWebhookConfiguration"):
        for obj in [o for o in installed.objects if o["kind"] == kind]:
            got = installed.admin.get(obj["apiVersion"], kind, obj["metadata"]["name"])
            assert got is not None, f"{kind} {obj['metadata']['name']} missing"


def test_seed_modelcaches_apply_unchanged(installed: Installed) -> None:
    seeds = readme_modelcaches()
    assert {s["metadata"]["name"] for s in seeds} >= {"tinyllama", "tinyllama-rwx"}
    ensure_namespace(installed.admin, "seed")
    # The PVC seed names this class; the validating webhook checks it exists.
    installed.admin.apply(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": "rwx-storage-class"},
            "provisioner": "nfs.example.com",
        }
    )
    for seed in seeds:
        body = copy.deepcopy(seed)
        body["metadata"]["namespace"] = "seed"
        created = installed.admin.create(body)
        assert created["spec"] == seed["spec"], "the API server pruned or defaulted a seed field"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s["storage"].update(size="0"), "storage.size must be greater than zero"),
        (lambda s: s["storage"].update(size="five gigs"), "spec.storage.size"),
        (lambda s: s["source"].update(uri="hf://org/name"), "exactly one source form is required"),
        (lambda s: s["source"]["huggingface"].update(repo="nope"), "spec.source.huggingface.repo"),
        (lambda s: s.update(eviction={"unusedTTL": "soon"}), "spec.eviction.unusedTTL"),
    ],
)
def test_invalid_modelcaches_are_refused_by_the_api_server(
    installed: Installed, change: Any, message: str
) -> None:
    ensure_namespace(installed.admin, "invalid")
    body = copy.deepcopy(readme_modelcaches()[0])
    body["metadata"] = {"name": "bad", "namespace": "invalid"}
    change(body["spec"])
    with pytest.raises(ApiException) as err:
        installed.admin.create(body)
    assert err.value.status == 422
    assert message in str(err.value.body)


def test_spec_is_immutable_on_the_api_server(installed: Installed) -> None:
    ensure_namespace(installed.admin, "immutable")
    body = copy.deepcopy(readme_modelcaches()[0])
    body["metadata"] = {"name": "fixed", "namespace": "immutable"}
    created = installed.admin.create(body)
    created["spec"]["storage"]["size"] = "6Gi"
    with pytest.raises(ApiException) as err:
        installed.admin.resource(names.API_VERSION, MC).replace(body=created, namespace="immutable")
    assert "spec is immutable" in str(err.value.body)


def _allowed(
    plane: ControlPlane,
    service_account: str,
    permission: rbac.Permission,
    verb: str,
    namespace: str = "some-tenant",
) -> bool:
    resource, _, subresource = permission.resource.partition("/")
    attributes: dict[str, Any] = {
        "group": permission.group,
        "resource": resource,
        "subresource": subresource or None,
        "verb": verb,
    }
    if permission.namespaced:
        attributes["namespace"] = namespace
    review = client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(
            user=f"system:serviceaccount:{NAMESPACE}:{service_account}",
            groups=["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}", "system:authenticated"],
            resource_attributes=client.V1ResourceAttributes(**attributes),
        )
    )
    result = client.AuthorizationV1Api(plane.admin()).create_subject_access_review(review)
    return bool(result.status.allowed)


IDENTITIES = {
    HOOKS_SA: rbac.HOOKS,
    ORPHANS_SA: rbac.ORPHANS,
    AGENT_SA: rbac.AGENT,
    METACONTROLLER_SA: rbac.METACONTROLLER,
}


def test_the_agent_lists_modelcaches_only_in_namespaces_that_may_hold_new_nodes(installed: Installed) -> None:
    """#21 item 4: the tier's chart lists WARM_NAMESPACE in nodeAgent.startupTaint.namespaces."""
    [listing] = rbac.AGENT_WARM
    assert _allowed(installed.plane, AGENT_SA, listing, "list", WARM_NAMESPACE)
    assert not _allowed(installed.plane, AGENT_SA, listing, "list", "some-tenant")
    cluster_wide = rbac.Permission(listing.group, listing.resource, listing.verbs, namespaced=False)
    assert not _allowed(installed.plane, AGENT_SA, cluster_wide, "list")


@pytest.mark.parametrize("service_account", sorted(IDENTITIES))
def test_each_identity_holds_exactly_its_declared_permissions(
    installed: Installed, service_account: str
) -> None:
    """What praesto/rbac.py declares is granted by the chart's RBAC, as the API server's authorizer decides."""
    declared = IDENTITIES[service_account]
    for permission in declared:
        for verb in permission.verbs:
            assert _allowed(installed.plane, service_account, permission, verb), (
                service_account,
                permission,
                verb,
            )
    # And nothing broad: no Secret listing, no writes to ModelCaches' spec by the agent or the hooks.
    secrets = rbac.Permission("", "secrets", ("list",))
    assert not _allowed(installed.plane, service_account, secrets, "list")
    if service_account != METACONTROLLER_SA:
        mc = rbac.Permission(names.GROUP, names.MODELCACHE_PLURAL, ("update",))
        assert not _allowed(installed.plane, service_account, mc, "update")
        # Only Metacontroller creates node copies (the *-modelcachenode-writers policy relies on it).
        mcn = rbac.Permission(names.GROUP, names.MODELCACHENODE_PLURAL, ("create",))
        assert not _allowed(installed.plane, service_account, mcn, "create")


def test_only_the_orphan_releaser_holds_what_releasing_needs(installed: Installed) -> None:
    """praesto-hooks no longer writes or watches node copies (the releaser is its own Deployment);
    the releaser reads no Secret and no ModelCache, and writes nothing but node copies."""
    copies = rbac.Permission(names.GROUP, names.MODELCACHENODE_PLURAL, ())
    for verb in ("patch", "update", "list", "watch", "delete"):
        assert not _allowed(installed.plane, HOOKS_SA, copies, verb), verb
    assert _allowed(installed.plane, ORPHANS_SA, copies, "patch")
    nodes = rbac.Permission("", "nodes", (), namespaced=False)
    assert not _allowed(installed.plane, HOOKS_SA, nodes, "get")
    for permission, verb in (
        (copies, "update"),
        (copies, "delete"),
        (rbac.Permission(names.GROUP, f"{names.MODELCACHENODE_PLURAL}/status", ()), "patch"),
        (rbac.Permission(names.GROUP, names.MODELCACHE_PLURAL, ()), "get"),
        (rbac.Permission("", "secrets", ()), "get"),
        (nodes, "patch"),
        (rbac.Permission("", "events", ()), "create"),
    ):
        assert not _allowed(installed.plane, ORPHANS_SA, permission, verb), (permission, verb)


RELEASER_NAMESPACE = "orphans-identity"
UPDATE_REFUSED = "are written by Praesto's controller (Metacontroller) and the node agent only"


def test_the_orphan_releaser_may_only_let_a_copy_go(installed: Installed) -> None:
    """Its `patch` on node copies, through the *-modelcachenode-writers policy: a changed spec (what
    would send the agents elsewhere) is refused; dropping the agent's finalizer is all it can do."""
    ensure_namespace(installed.admin, RELEASER_NAMESPACE)
    held = modelcachenode("c", "gone-node", RELEASER_NAMESPACE)
    held["metadata"]["finalizers"] = [names.FINALIZER_NODE_AGENT]
    name = installed.admin.create(held)["metadata"]["name"]
    api = client.CustomObjectsApi(installed.plane.client_as(NAMESPACE, ORPHANS_SA))
    at = (names.GROUP, names.VERSION, RELEASER_NAMESPACE, names.MODELCACHENODE_PLURAL, name)
    try:

        def spec_change_refused() -> bool:  # the API server loads a new policy through an informer
            try:  # dry run: admission decides, nothing is stored
                api.patch_namespaced_custom_object(*at, {"spec": {"size": "2Gi"}}, dry_run="All")
            except ApiException as err:
                if err.status != 403:
                    raise
                return UPDATE_REFUSED in str(err.body)
            return False

        wait_for(
            "the modelcachenode-writers policy to refuse the releaser a spec change", spec_change_refused, 30
        )
        current = installed.admin.get(names.API_VERSION, names.MODELCACHENODE_KIND, name, RELEASER_NAMESPACE)
        assert current is not None
        released = api.patch_namespaced_custom_object(
            *at, {"metadata": {"finalizers": [], "resourceVersion": current["metadata"]["resourceVersion"]}}
        )
        assert not released["metadata"].get("finalizers")
        assert released["spec"] == current["spec"]
    finally:
        installed.admin.delete(names.API_VERSION, names.MODELCACHENODE_KIND, name, RELEASER_NAMESPACE)


def test_the_tier_runs_a_version_the_chart_claims(control_plane: ControlPlane) -> None:
    chart = yaml.safe_load((ROOT / "charts" / "praesto" / "Chart.yaml").read_text())
    minimum = chart["kubeVersion"].removeprefix(">=").removesuffix("-0")
    ran = control_plane.version().removeprefix("v")
    assert _release(ran) >= _release(minimum)


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".")[:3])
