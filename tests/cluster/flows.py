"""Steps the control-plane tier's tests share: agents, waiting on phases, reading children."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes.dynamic.exceptions import ApiException

from praesto import names
from testkit.chart_install import point_webhooks_at
from testkit.controlplane import wait_for
from testkit.hub import LocalHub
from testkit.kube_apply import Kube
from testkit.metacontroller import HookClient
from testkit.ports import free_port
from tests.cluster.agents import AgentProcess
from tests.cluster.installed import Installed
from tests.cluster.tenants import modelcache

Obj = dict[str, Any]
MCN_API = names.API_VERSION


@contextmanager
def validator_down(installed: Installed, probe_namespace: str) -> Iterator[None]:
    """The ModelCache validator failing open: failurePolicy Ignore, and nothing listening at its URL.

    What webhooks.modelCaches.failurePolicy Ignore and a hooks outage together allow; the
    checks that must hold anyway (an admission policy, the sync hook) are then what refuses.
    Entered once the API server admits what only the validator refuses (a StorageClass that
    does not exist) in `probe_namespace`.
    """
    rendered = installed.rendered("ValidatingWebhookConfiguration")
    assert installed.hooks.ca_path is not None
    ca = installed.hooks.ca_path.read_bytes()
    down = point_webhooks_at(rendered, f"https://127.0.0.1:{free_port()}", ca)
    for webhook in down["webhooks"]:
        webhook["failurePolicy"] = "Ignore"
    installed.admin.apply(down)
    try:
        wait_for(
            "the validator outage to reach the API server", lambda: _unchecked(installed, probe_namespace), 30
        )
        yield
    finally:
        installed.admin.apply(point_webhooks_at(rendered, installed.hooks.base_url, ca))


def _unchecked(installed: Installed, namespace: str) -> bool:
    probe = modelcache(
        f"unchecked-{free_port()}", namespace, storage={"size": "1", "storageClassName": "none"}
    )
    try:
        installed.admin.create(probe)
    except ApiException as err:
        if err.status != 403:
            raise
        return False
    installed.admin.delete(names.API_VERSION, names.MODELCACHE_KIND, probe["metadata"]["name"], namespace)
    return True


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


def phase_is(*phases: str) -> Callable[[Obj | None], bool]:
    """For `composite.wait_parent`: the ModelCache's status.phase is one of `phases`."""

    def done(parent: Obj | None) -> bool:
        return ((parent or {}).get("status") or {}).get("phase") in phases

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


def merge_patch(
    kube: Kube,
    api_version: str,
    kind: str,
    name: str,
    body: Obj,
    namespace: str | None = None,
    *,
    status: bool = False,
) -> Obj:
    """A JSON merge patch (of the status subresource with `status`); the object as written, resourceVersion included."""
    resource = kube.resource(api_version, kind)
    target = resource.subresources["status"] if status else resource
    out: Obj = target.patch(
        body=body, name=name, namespace=namespace, content_type="application/merge-patch+json"
    ).to_dict()
    return out


def heartbeat(kube: Kube, node: str) -> Obj:
    """What a kubelet does every few seconds: a status-only write of its Node (a new resourceVersion)."""
    current = kube.get("v1", "Node", node)
    assert current is not None, node
    conditions = [
        {
            **c,
            "lastHeartbeatTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "message": f"beat {time.monotonic_ns()}",
        }
        for c in (current.get("status") or {}).get("conditions") or []
    ]
    return merge_patch(kube, "v1", "Node", node, {"status": {"conditions": conditions}}, status=True)
