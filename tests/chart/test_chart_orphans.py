"""The orphan releaser in the chart: its own Deployment and ServiceAccount (issue 39 item 4).

praesto-orphans runs outside the hooks Pods, so a releaser that restarts never makes a hooks Pod
NotReady (the admission Service's endpoints are the hooks Pods'). Its ServiceAccount is granted
exactly `praesto.rbac.ORPHANS`, and the hooks' no longer hold what only the releaser used (no write
on ModelCacheNodes). The flags the chart passes, to the process and to its probe, parse with the
real settings; praesto-hooks starts no second releaser beside gunicorn.
"""

from __future__ import annotations

from typing import Any

import pytest
from praesto.hooks.orphans.settings import settings_from
from praesto.hooks.serving import server

from praesto import names, rbac
from testkit.helm_chart import one, render, render_objects
from tests.chart.test_chart_rbac import declared, grants_of

Obj = dict[str, Any]
ORPHANS, HOOKS = "praesto-orphans", "praesto-hooks"


def _deployment(values: Obj | None = None, name: str = ORPHANS) -> Obj:
    return one(render_objects(values or {}), "Deployment", name)


def _container(values: Obj | None = None) -> Obj:
    (container,) = _deployment(values)["spec"]["template"]["spec"]["containers"]
    assert container["name"] == "orphans"
    return dict(container)


def test_the_releaser_is_its_own_deployment_and_the_hooks_pods_do_not_run_it() -> None:
    objects = render_objects()
    orphans = one(objects, "Deployment", ORPHANS)
    hooks = one(objects, "Deployment", HOOKS)
    assert orphans["spec"]["replicas"] == 1
    (container,) = orphans["spec"]["template"]["spec"]["containers"]
    (hooks_container,) = hooks["spec"]["template"]["spec"]["containers"]  # admission's only
    assert container["command"] == ["praesto-orphans"] and container["image"] == hooks_container["image"]
    assert not server.parse_args(hooks_container["args"]).release_orphaned_copies
    # Its own Pods: the hooks' Service and PodDisruptionBudget select none of them.
    labels = orphans["spec"]["template"]["metadata"]["labels"]
    for selector in (
        one(objects, "Service", HOOKS)["spec"]["selector"],
        one(objects, "PodDisruptionBudget", HOOKS)["spec"]["selector"]["matchLabels"],
        hooks["spec"]["selector"]["matchLabels"],
    ):
        assert not set(selector.items()) <= set(labels.items())
    settings = settings_from(container["args"], {})
    assert settings.resync_seconds == 600 and settings.log_level == "INFO" and not settings.probe
    assert "readinessProbe" not in container and "ports" not in container and "env" not in container
    assert orphans["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    hardened = container["securityContext"]
    assert hardened["readOnlyRootFilesystem"] is True and hardened["allowPrivilegeEscalation"] is False
    assert (
        hardened["capabilities"]["drop"] == ["ALL"] and hardened["seccompProfile"]["type"] == "RuntimeDefault"
    )
    assert container["resources"]["requests"]["memory"] and container["resources"]["limits"]["memory"]


def test_its_own_service_account_holds_only_its_calls_and_the_hooks_lose_them() -> None:
    objects = render_objects()
    pod = one(objects, "Deployment", ORPHANS)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == ORPHANS and one(objects, "ServiceAccount", ORPHANS)
    assert grants_of(objects, ORPHANS) == declared(rbac.ORPHANS)
    hooks = grants_of(objects, HOOKS)
    assert hooks == declared(rbac.HOOKS)
    for verb in ("patch", "update", "create", "delete", "list", "watch"):  # the broker's `get` only
        assert (names.GROUP, names.MODELCACHENODE_PLURAL, verb) not in hooks
    assert ("", "nodes", "get") not in hooks  # the admission lookup watches Node labels, gets none


def test_the_liveness_probe_reads_the_heartbeat_the_releaser_writes() -> None:
    pod = _deployment()["spec"]["template"]["spec"]
    (orphans,) = pod["containers"]
    running = settings_from(orphans["args"], {})
    command = orphans["livenessProbe"]["exec"]["command"]
    assert command[0] == "praesto-orphans"
    probing = settings_from(command[1:], {})
    assert probing.probe and probing.heartbeat_file == running.heartbeat_file
    assert probing.stale_after > running.heartbeat_seconds  # several heartbeats missed, never one
    (mount,) = orphans["volumeMounts"]
    assert running.heartbeat_file.startswith(mount["mountPath"] + "/")
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["emptyDir"]["medium"] == "Memory"  # the root filesystem is read-only


def test_values_reach_the_releaser() -> None:
    values: Obj = {
        "hooks": {
            "orphans": {
                "resyncSeconds": 120,
                "logLevel": "debug",
                "resources": {"requests": {"cpu": "5m", "memory": "70Mi"}, "limits": {"memory": "100Mi"}},
                "livenessProbe": {"staleAfterSeconds": 90, "periodSeconds": 15, "failureThreshold": 5},
            },
            "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
            "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
            "priorityClassName": "system-cluster-critical",
        },
        "imagePullSecrets": [{"name": "regcred"}],
    }
    pod = _deployment(values)["spec"]["template"]["spec"]
    (orphans,) = pod["containers"]
    settings = settings_from(orphans["args"], {})
    assert settings.resync_seconds == 120 and settings.log_level == "DEBUG"
    assert orphans["resources"]["limits"]["memory"] == "100Mi"
    probe = orphans["livenessProbe"]
    assert settings_from(probe["exec"]["command"][1:], {}).stale_after == 90
    assert (probe["periodSeconds"], probe["failureThreshold"]) == (15, 5)
    hooks: Obj = values["hooks"]
    assert pod["nodeSelector"] == hooks["nodeSelector"] and pod["tolerations"] == hooks["tolerations"]
    assert pod["priorityClassName"] == hooks["priorityClassName"]
    assert pod["imagePullSecrets"] == values["imagePullSecrets"]


@pytest.mark.parametrize(
    ("orphans", "named"),
    [
        ({"resyncSeconds": 5}, "resyncSeconds"),  # a relist of every copy and Node every few seconds
        ({"logLevel": "loud"}, "logLevel"),
        ({"livenessProbe": {"staleAfterSeconds": 10}}, "staleAfterSeconds"),  # one missed heartbeat
        ({"replicas": 2}, "replicas"),  # one is enough; two would only race each other to 409s
    ],
)
def test_bad_values_are_refused_by_the_schema(orphans: Obj, named: str) -> None:
    with pytest.raises(Exception, match=named):
        render({"hooks": {"orphans": orphans}})


def test_no_pod_may_connect_to_the_releaser_it_listens_on_nothing() -> None:
    """A NetworkPolicy selecting exactly the releaser's Pods, with Ingress and no rule: deny all."""
    objects = render_objects()
    policy = one(objects, "NetworkPolicy", ORPHANS)
    pod_labels = _deployment()["spec"]["template"]["metadata"]["labels"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert set(selector.items()) <= set(pod_labels.items())
    assert policy["spec"]["policyTypes"] == ["Ingress"] and "ingress" not in policy["spec"]
    hooks_labels = one(objects, "Deployment", HOOKS)["spec"]["template"]["metadata"]["labels"]
    assert not set(selector.items()) <= set(hooks_labels.items())
    disabled = render_objects({"hooks": {"networkPolicy": {"enabled": False}}})
    assert not [o for o in disabled if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == ORPHANS]
