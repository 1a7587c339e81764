"""Issue 15, item 1: a node that joins with the startup taint takes work only once its models are on disk.

The real kube-scheduler keeps a Pod that does not tolerate the taint Pending;
the real `praesto-agent run` (flags from the chart's DaemonSet, token bound to
its Pod on the node) lifts the taint from its own Node once the warmNewNodes
cache selecting it is Ready there, and the scheduler then binds the Pod. A cache
that never gets Ready holds the node only until the deadline, which the agent
reports with Warning Events on the Node and on the ModelCache.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from praesto.agent.warmup import REASON_DEADLINE, REASON_WARM

from praesto import names
from praesto.store import StoreLayout
from tests.cluster.agents import AgentProcess
from tests.cluster.flows import modelcachenodes, phase_is
from tests.cluster.installed import Installed
from tests.cluster.tenants import modelcache, ready_node, unschedulable_message, wait_scheduled
from tests.support.chart_install import ensure_namespace
from tests.support.controlplane import wait_for
from tests.support.hub import LocalHub
from tests.support.metacontroller import CompositeController

NS = "warm-nodes"
POOL = "test.praesto.io/pool"
KEY = names.DEFAULT_STARTUP_TAINT_KEY


def joining_node(installed: Installed, name: str, pool: str) -> None:
    """A Ready node registered with the startup taint, as --register-with-taints makes it."""
    ready_node(installed.admin, name, {POOL: pool})
    taint = {"key": KEY, "value": "true", "effect": "NoSchedule"}
    client.CoreV1Api(installed.admin.api).patch_node(name, {"spec": {"taints": [taint]}})


def chart_taint_args(installed: Installed) -> tuple[str, ...]:
    agent = next(
        c
        for c in installed.rendered("DaemonSet")["spec"]["template"]["spec"]["containers"]
        if c["name"] == "agent"
    )
    args = tuple(a for a in agent["args"] if a.startswith("--startup-taint-"))
    assert f"--startup-taint-key={KEY}" in args, agent["args"]
    return args


def tainted(installed: Installed, node: str) -> bool:
    taints = client.CoreV1Api(installed.admin.api).read_node(node).spec.taints or []
    return any(t.key == KEY for t in taints)


def events(installed: Installed, namespace: str, kind: str, name: str) -> list[Any]:
    listed = client.CoreV1Api(installed.admin.api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.kind={kind},involvedObject.name={name}"
    )
    return list(listed.items)


def warm_cache(name: str, pool: str, repo: str) -> dict[str, Any]:
    source = {"huggingface": {"repo": repo}}
    return modelcache(name, NS, node_selector={POOL: pool}, source=source, warmNewNodes=True)


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
    reasons = {e.reason for e in events(installed, "default", "Node", "warm-1")}
    assert REASON_WARM in reasons


def test_the_deadline_lifts_the_taint_with_warnings_naming_the_missing_cache(
    installed: Installed,
    hub: LocalHub,
    composite: CompositeController,
    namespace: str,
    stack: ExitStack,
    tmp_path: Path,
) -> None:
    joining_node(installed, "warm-late", "late")
    installed.admin.create(warm_cache("never-ready", "late", "org/absent"))
    # Metacontroller creates its copy for warm-late, which fails: the repo is not there.
    wait_for(
        "the copy on warm-late",
        lambda: "warm-late" in modelcachenodes(installed.admin, NS, "never-ready"),
        30,
    )
    start_agent(stack, installed, hub, tmp_path / "warm-late", "warm-late", "--startup-taint-deadline=3")
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
    assert names.ready_label_key(NS, "never-ready") in node_events[0].message
    assert "never-ready" not in node_events[0].message  # tenant names stay off cluster-scoped objects
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
