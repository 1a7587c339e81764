"""Shared fixtures of the control-plane tier: the local hub, the Metacontroller drivers, node agents."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from praesto import names
from tests.cluster.agents import AgentProcess
from tests.cluster.conftest import METACONTROLLER_SA, Installed
from tests.support.controlplane import wait_for
from tests.support.hub import LocalHub
from tests.support.metacontroller import CompositeDriver, DecoratorDriver, HookClient, SyncResult
from tests.support.kube_apply import Kube

Obj = dict[str, Any]
MCN_API = names.API_VERSION


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalHub]:
    with LocalHub(tmp_path_factory.mktemp("hub")) as running:
        yield running


def hook_client(installed: Installed) -> HookClient:
    assert installed.hooks.ca_path is not None
    return HookClient(installed.hooks.base_url, installed.hooks.ca_path)


@pytest.fixture(scope="module")
def metacontroller(installed: Installed) -> Kube:
    """The Metacontroller identity: the chart's ServiceAccount and ClusterRole."""
    return installed.kube_as(METACONTROLLER_SA)


@pytest.fixture(scope="module")
def composite(installed: Installed, metacontroller: Kube) -> CompositeDriver:
    return CompositeDriver(metacontroller, installed.rendered("CompositeController"), hook_client(installed))


@pytest.fixture(scope="module")
def decorator(installed: Installed, metacontroller: Kube) -> DecoratorDriver:
    return DecoratorDriver(metacontroller, installed.rendered("DecoratorController"), hook_client(installed))


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
