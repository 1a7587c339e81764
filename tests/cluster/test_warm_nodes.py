"""Issue 15, item 1: a node that joins with the startup taint takes work only once its models are on disk.

The real kube-scheduler keeps a Pod that does not tolerate the taint Pending;
the real `praesto-agent run` (flags from the chart's DaemonSet, token bound to
its Pod on the node) lifts the taint from its own Node once the warmNewNodes
cache selecting it is Ready there, and the scheduler then binds the Pod. A cache
that never gets Ready holds the node only until the deadline, which the agent
reports with Warning Events on the Node and on the ModelCache.

#21 item 8: only namespaces the platform admin lists may hold new nodes, a cache
that is Failed never holds, and the Node's Events name the caches it waits for.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from praesto.agent.startup_taint import REASON_DEADLINE, REASON_WAITING, REASON_WARM

from praesto import names
from praesto.store import StoreLayout
from testkit.chart_install import ensure_namespace
from testkit.controlplane import wait_for
from testkit.hub import LocalHub
from testkit.metacontroller import CompositeController
from tests.cluster.agents import AgentProcess
from tests.cluster.flows import modelcachenodes, phase_is
from tests.cluster.installed import WARM_NAMESPACE, Installed
from tests.cluster.tenants import modelcache, ready_node, unschedulable_message, wait_scheduled

NS = WARM_NAMESPACE
OTHER = "warm-not-listed"  # a tenant namespace the admin did not list in startupTaint.namespaces
POOL = "test.praesto.io/pool"
KEY = names.DEFAULT_STARTUP_TAINT_KEY


def joining_node(installed: Installed, name: str, pool: str) -> None:
    """A Ready node registered with the startup taint, as --register-with-taints makes it."""
    ready_node(installed.admin, name, {POOL: pool})
    taint = {"key": KEY, "value": "true", "effect": "NoSchedule"}
    client.CoreV1Api(installed.admin.api).patch_node(name, {"spec": {"taints": [taint]}})


def chart_taint_args(installed: Installed) -> tuple[str, ...]:
    """The DaemonSet's startup-taint flags: the tier's chart lists NS in startupTaint.namespaces."""
    agent = next(
        c
        for c in installed.rendered("DaemonSet")["spec"]["template"]["spec"]["containers"]
        if c["name"] == "agent"
    )
    args = tuple(a for a in agent["args"] if a.startswith(("--startup-taint-", "--warm-namespaces")))
    assert f"--startup-taint-key={KEY}" in args, agent["args"]
    # the chart's list, which also gives the agent its only ModelCache read (a Role in NS, #21 item 4)
    assert f"--warm-namespaces={NS}" in args, agent["args"]
    return args


def tainted(installed: Installed, node: str) -> bool:
    taints = client.CoreV1Api(installed.admin.api).read_node(node).spec.taints or []
    return any(t.key == KEY for t in taints)


def events(installed: Installed, namespace: str, kind: str, name: str) -> list[Any]:
    listed = client.CoreV1Api(installed.admin.api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.kind={kind},involvedObject.name={name}"
    )
    return list(listed.items)


def warm_cache(name: str, pool: str, repo: str, namespace: str = NS) -> dict[str, Any]:
    source = {"huggingface": {"repo": repo}}
    return modelcache(name, namespace, node_selector={POOL: pool}, source=source, warmNewNodes=True)


def slow_hub(stack: ExitStack, tmp_path: Path) -> LocalHub:
    """A hub whose repo takes about 60 s to download: its cache stays Downloading past a short deadline."""
    hub = stack.enter_context(LocalHub(tmp_path / "slow-hub"))
    hub.add_repo("org/slow", {"config.json": b"{}", "model.bin": b"s" * 6_000_000})
    hub.faults.rate = 100_000
    return hub


def plain_pod(name: str, pool: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "automountServiceAccountToken": False,
            "nodeSelector": {POOL: pool},
            "containers": [{"name": "server", "image": "registry.example/llm:1"}],
        },
    }


@pytest.fixture(scope="module")
def namespace(installed: Installed) -> str:
    ensure_namespace(installed.admin, NS)
    ensure_namespace(installed.admin, OTHER)
    return NS


def start_agent(
    stack: ExitStack, installed: Installed, hub: LocalHub, workdir: Path, node: str, *extra: str
) -> AgentProcess:
    agent = AgentProcess(installed, node, hub.endpoint, workdir, (*chart_taint_args(installed), *extra))
    return stack.enter_context(agent)


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as s:
        yield s


def test_a_pod_waits_for_the_model_then_lands_on_the_warmed_node(
    installed: Installed,
    hub: LocalHub,
    composite: CompositeController,
    namespace: str,
    stack: ExitStack,
    tmp_path: Path,
) -> None:
    hub.add_repo("org/warm", {"config.json": b"{}", "model.bin": b"w" * 200_000})
    joining_node(installed, "warm-1", "warm")
    installed.admin.create(warm_cache("warm-llm", "warm", "org/warm"))
    installed.admin.create(plain_pod("inference", "warm"))
    assert "untolerated taint" in unschedulable_message(installed.admin, NS, "inference")

    agent = start_agent(stack, installed, hub, tmp_path / "warm-1", "warm-1")
    assert tainted(installed, "warm-1")  # nothing is on disk yet: the agent keeps it
    composite.wait_parent(NS, "warm-llm", phase_is(names.PHASE_READY), deadline=90)
    assert StoreLayout(agent.base).is_complete(NS, "warm-llm")

    assert wait_scheduled(installed.admin, NS, "inference", deadline=60) == "warm-1"
    assert not tainted(installed, "warm-1")
    lifted_as_warm(installed, "warm-1")


def test_the_deadline_lifts_the_taint_with_warnings_naming_the_missing_cache(
    installed: Installed,
    composite: CompositeController,
    namespace: str,
    stack: ExitStack,
    tmp_path: Path,
) -> None:
    hub = slow_hub(stack, tmp_path)
    joining_node(installed, "warm-late", "late")
    installed.admin.create(warm_cache("never-ready", "late", "org/slow"))
    wait_for(
        "the copy on warm-late",
        lambda: "warm-late" in modelcachenodes(installed.admin, NS, "never-ready"),
        30,
    )
    start_agent(stack, installed, hub, tmp_path / "warm-late", "warm-late", "--startup-taint-deadline=20")
    wait_for("the deadline to lift the startup taint", lambda: not tainted(installed, "warm-late"), 60)

    def recorded(namespace: str, kind: str, name: str) -> list[Any]:
        found: list[Any] = []

        def present() -> bool:
            found[:] = [e for e in events(installed, namespace, kind, name) if e.reason == REASON_DEADLINE]
            return bool(found)

        wait_for(f"a {REASON_DEADLINE} Event on {kind} {name}", present, 30)
        return found

    node_events = recorded("default", "Node", "warm-late")
    assert node_events[0].type == "Warning"
    assert f"{NS}/never-ready" in node_events[0].message  # the admin listed NS: its caches are named
    waiting = [e for e in events(installed, "default", "Node", "warm-late") if e.reason == REASON_WAITING]
    assert waiting and f"{NS}/never-ready" in waiting[0].message, "the Event while waiting names it too"
    cache_events = recorded(NS, names.MODELCACHE_KIND, "never-ready")
    assert "node warm-late stopped waiting for this cache" in cache_events[0].message

    def warm_condition(parent: Any) -> bool:
        conditions = ((parent or {}).get("status") or {}).get("conditions") or []
        found = [c for c in conditions if c["type"] == names.CONDITION_WARM_BEFORE_SCHEDULABLE]
        return bool(found) and found[0]["status"] == "False"

    result = composite.wait_parent(NS, "never-ready", warm_condition, deadline=30)
    assert result is not None
    warm = next(
        c for c in result["status"]["conditions"] if c["type"] == names.CONDITION_WARM_BEFORE_SCHEDULABLE
    )
    assert warm["reason"] == REASON_DEADLINE and warm["message"].startswith(
        "warm-late took Pods before this cache"
    )


def lifted_as_warm(installed: Installed, node: str) -> None:
    """The taint goes long before the deadline (600 s), as when every required cache is on disk."""
    wait_for(f"the startup taint of {node} to go", lambda: not tainted(installed, node), 60)

    def reasons() -> set[str]:
        return {e.reason for e in events(installed, "default", "Node", node)}

    # The agent posts the Event right after its patch lifts the taint: wait for it, then read them all.
    wait_for(f"the {REASON_WARM} Event on {node}", lambda: REASON_WARM in reasons(), 30)
    assert REASON_DEADLINE not in reasons(), reasons()


def test_a_cache_in_a_namespace_the_admin_did_not_list_holds_no_node(
    installed: Installed,
    composite: CompositeController,
    namespace: str,
    stack: ExitStack,
    tmp_path: Path,
) -> None:
    """#21 item 8: any tenant's warmNewNodes cache used to hold every new node until the deadline."""
    hub = slow_hub(stack, tmp_path)
    joining_node(installed, "warm-tenant", "tenant")
    installed.admin.create(warm_cache("greedy", "tenant", "org/slow", namespace=OTHER))
    wait_for("its copy", lambda: "warm-tenant" in modelcachenodes(installed.admin, OTHER, "greedy"), 30)
    start_agent(
        stack, installed, hub, tmp_path / "warm-tenant", "warm-tenant", "--startup-taint-deadline=600"
    )
    lifted_as_warm(installed, "warm-tenant")


def test_a_failed_cache_never_holds_a_node(
    installed: Installed,
    hub: LocalHub,
    composite: CompositeController,
    namespace: str,
    stack: ExitStack,
    tmp_path: Path,
) -> None:
    """#21 item 8: a listed namespace's cache that cannot complete (its repo does not exist)."""
    joining_node(installed, "warm-failed", "failed")
    installed.admin.create(warm_cache("absent", "failed", "org/absent"))
    wait_for("its copy", lambda: "warm-failed" in modelcachenodes(installed.admin, NS, "absent"), 30)
    start_agent(
        stack, installed, hub, tmp_path / "warm-failed", "warm-failed", "--startup-taint-deadline=600"
    )
    composite.wait_parent(NS, "absent", phase_is(names.PHASE_FAILED), deadline=90)
    lifted_as_warm(installed, "warm-failed")
