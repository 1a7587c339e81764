"""Steps the control-plane tier's tests share: agents, waiting on phases, reading children."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

from praesto import names
from tests.cluster.agents import AgentProcess
from tests.cluster.installed import Installed
from tests.support.controlplane import wait_for
from tests.support.hub import LocalHub
from tests.support.kube_apply import Kube
from tests.support.metacontroller import HookClient, SyncResult

Obj = dict[str, Any]
MCN_API = names.API_VERSION


def hook_client(installed: Installed) -> HookClient:
    assert installed.hooks.ca_path is not None
    return HookClient(installed.hooks.base_url, installed.hooks.ca_path)


def start_agents(
    stack: ExitStack, installed: Installed, hub: LocalHub, workdir: Path, nodes: list[str]
) -> dict[str, AgentProcess]:
    agents = {}
    for node in nodes:
        agent = AgentProcess(installed, node, hub.endpoint, workdir / node)
        agents[node] = stack.enter_context(agent)
    return agents


def phase_is(*phases: str) -> Any:
    def done(result: SyncResult | None) -> bool:
        status = (result and result.parent and result.parent.get("status")) or {}
        return status.get("phase") in phases

    return done


def modelcachenodes(kube: Kube, namespace: str, cache: str) -> dict[str, Obj]:
    """This cache's ModelCacheNodes by node name."""
    found = kube.list(MCN_API, names.MODELCACHENODE_KIND, namespace, f"{names.LABEL_MODEL_CACHE}={cache}")
    return {o["spec"]["nodeName"]: o for o in found}


def wait_gone(
    kube: Kube, api_version: str, kind: str, name: str, namespace: str | None, deadline: float = 60
) -> None:
    wait_for(
        f"{kind} {namespace}/{name} to be deleted",
        lambda: kube.get(api_version, kind, name, namespace) is None,
        deadline,
    )
