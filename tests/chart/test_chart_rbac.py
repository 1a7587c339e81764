"""RBAC: the chart grants each component exactly the API calls praesto/rbac.py declares, nothing more.

praesto/rbac.py is the list each component's own tests hold its code to (through
the fault proxy's request log, testkit/kube_faults.py); here the rendered ClusterRoles are compared
with it as sets of (apiGroup, resource, verb). Metacontroller's ClusterRole
comes from its own chart's template, fed by our values: rendered through the
test-only stand-in (see testkit/helm_chart.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm

from praesto import rbac
from testkit.helm_chart import (
    chart_with_metacontroller_standin,
    find,
    one,
    parse_manifests,
    render_objects,
)

Grant = tuple[str, str, str]


def declared(permissions: tuple[rbac.Permission, ...]) -> set[Grant]:
    return {(p.group, p.resource, verb) for p in permissions for verb in p.verbs}


def granted(role: dict[str, Any]) -> set[Grant]:
    out: set[Grant] = set()
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs", "resourceNames"}, (
            f"unexpected rule fields in {rule}"
        )
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert "*" not in (group, resource, verb), f"wildcard in {role['metadata']['name']}"
                    out.add((group, resource, verb))
    return out


def bound_roles(objects: list[dict[str, Any]], service_account: str) -> list[dict[str, Any]]:
    """Every ClusterRole/Role bound to the ServiceAccount in the release namespace."""
    roles = []
    for binding in find(objects, "ClusterRoleBinding") + find(objects, "RoleBinding"):
        subjects = binding["subjects"]
        if any(s["kind"] == "ServiceAccount" and s["name"] == service_account for s in subjects):
            assert all(s.get("namespace") == "praesto-system" for s in subjects)
            roles.append(one(objects, binding["roleRef"]["kind"], binding["roleRef"]["name"]))
    return roles


def grants_of(objects: list[dict[str, Any]], service_account: str) -> set[Grant]:
    out: set[Grant] = set()
    for role in bound_roles(objects, service_account):
        out |= granted(role)
    return out


def test_hooks_get_exactly_their_declared_calls() -> None:
    objects = render_objects()
    pod = one(objects, "Deployment", "praesto-hooks")["spec"]["template"]["spec"]
    assert grants_of(objects, pod["serviceAccountName"]) == declared(rbac.HOOKS)


def test_node_agent_gets_exactly_its_declared_calls() -> None:
    objects = render_objects()
    pod = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    # AGENT_PEERS: a Role in the release namespace, its own ServiceAccount only (test_chart_peers)
    assert grants_of(objects, pod["serviceAccountName"]) == declared(rbac.AGENT) | declared(rbac.AGENT_PEERS)


def test_the_agent_lists_modelcaches_only_where_namespaces_may_hold_new_nodes() -> None:
    """#21 item 4: no ClusterRole lets an agent list every tenant's ModelCaches; a Role in each namespace
    of nodeAgent.startupTaint.namespaces lets it read that namespace's, for warm before schedulable."""
    objects = render_objects({"nodeAgent": {"startupTaint": {"namespaces": ["ml-prod", "ml-dev"]}}})
    cluster_wide = [r for r in find(objects, "ClusterRole") if r["metadata"]["name"] == "praesto-node-agent"]
    assert all(rule["resources"] != ["modelcaches"] for role in cluster_wide for rule in role["rules"])
    warm = {r["metadata"]["namespace"]: r for r in find(objects, "Role", "praesto-node-agent-warm")}
    assert sorted(warm) == ["ml-dev", "ml-prod"]
    assert all(granted(role) == declared(rbac.AGENT_WARM) for role in warm.values())
    bindings = find(objects, "RoleBinding", "praesto-node-agent-warm")
    assert {b["metadata"]["namespace"] for b in bindings} == set(warm)
    assert all(b["subjects"] == [{"kind": "ServiceAccount", "name": "praesto-node-agent",
                                  "namespace": "praesto-system"}] for b in bindings)  # fmt: skip
    off = render_objects({"nodeAgent": {"startupTaint": {"key": "", "namespaces": ["ml-prod"]}}})
    assert not find(off, "Role", "praesto-node-agent-warm")  # no taint to lift: nothing to read


def test_csi_plugin_gets_no_api_credentials() -> None:
    """The CSI plugin shares the agent's Pod, so it must not even get the token."""
    assert rbac.CSI == ()
    pod = one(render_objects(), "DaemonSet")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    token_volumes = {
        v["name"]
        for v in pod["volumes"]
        if any("serviceAccountToken" in s for s in v.get("projected", {}).get("sources", []))
    }
    assert token_volumes
    for container in pod["containers"]:
        mounts = {m["name"] for m in container.get("volumeMounts", [])}
        assert bool(mounts & token_volumes) == (container["name"] == "agent"), container["name"]


def test_pvc_only_install_grants_the_agent_nothing() -> None:
    objects = render_objects({"nodeAgent": {"enabled": False}})
    assert grants_of(objects, "praesto-node-agent") == set()


def test_metacontroller_is_restricted_to_exactly_its_declared_calls(tmp_path: Path) -> None:
    chart = chart_with_metacontroller_standin(tmp_path)
    with helm.Chart.load(chart) as loaded:
        objects = parse_manifests(
            loaded.render({}, name="praesto", namespace="praesto-system", is_install=True)
        )
    roles = [r for r in find(objects, "ClusterRole") if "metacontroller" in r["metadata"]["name"]]
    assert len(roles) == 1
    assert roles[0].get("aggregationRule") in (None, {})  # an aggregation would replace the rules
    assert granted(roles[0]) == declared(rbac.METACONTROLLER)


def test_metacontroller_chart_alone_would_grant_everything(tmp_path: Path) -> None:
    """Negative control: without our values the (stand-in of the) subchart grants */*/*."""
    chart = chart_with_metacontroller_standin(tmp_path)
    with helm.Chart.load(chart / "charts" / "metacontroller-helm") as sub:
        objects = parse_manifests(sub.render({}, name="praesto", namespace="praesto-system", is_install=True))
    role = one(objects, "ClusterRole")
    assert role["rules"] == [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]


def test_metacontroller_disabled_renders_no_metacontroller_rbac(tmp_path: Path) -> None:
    chart = chart_with_metacontroller_standin(tmp_path)
    with helm.Chart.load(chart) as loaded:
        objects = parse_manifests(
            loaded.render({"metacontroller": {"enabled": False}}, name="praesto", namespace="praesto-system")
        )
    assert not [r for r in find(objects, "ClusterRole") if "metacontroller" in r["metadata"]["name"]]
