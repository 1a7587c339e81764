"""The node agent on the real API server: the per-cache Secret grant, an API server restart mid-download,
and the watch expiring (410) across it. The agent is `praesto-agent run`, unchanged, as the chart's
agent ServiceAccount.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from kubernetes import client

from praesto import names, rbac
from praesto.store import StoreLayout
from testkit.controlplane import wait_for
from testkit.helm_chart import NAMESPACE
from testkit.hub import LocalHub
from testkit.metacontroller import CompositeController, gone
from tests.cluster.agents import AgentProcess
from tests.cluster.flows import modelcachenodes, phase_is, start_agents, wait_gone
from tests.cluster.installed import AGENT_SA, HOOKS_SA, Installed
from tests.cluster.tenants import modelcache, opted_in_namespace, ready_node

NS = "agent-tests"
NODE = "agent-node"
POOL = "test.praesto.io/pool"


@pytest.fixture(scope="module")
def agent(
    installed: Installed, hub: LocalHub, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AgentProcess]:
    opted_in_namespace(installed.admin, NS)
    ready_node(installed.admin, NODE, {POOL: "agent"})
    with ExitStack() as stack:
        yield start_agents(stack, installed, hub, tmp_path_factory.mktemp("agent"), [NODE])[NODE]


def may_get_secret(installed: Installed, name: str, account: str = AGENT_SA) -> bool:
    review = client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(
            user=f"system:serviceaccount:{NAMESPACE}:{account}",
            groups=["system:serviceaccounts", "system:authenticated"],
            resource_attributes=client.V1ResourceAttributes(
                namespace=NS, verb="get", resource=rbac.AGENT_SECRET_GRANT.resource, name=name
            ),
        )
    )
    return bool(
        client.AuthorizationV1Api(installed.admin.api).create_subject_access_review(review).status.allowed
    )


def test_private_model_through_the_per_cache_secret_grant(  # and the credentials broker
    installed: Installed, hub: LocalHub, agent: AgentProcess, composite: CompositeController
) -> None:
    hub.add_repo("org/private", {"config.json": b"{}", "model.bin": b"p" * 400_000}, private=True)
    hub.tokens.add("hf_tenant_token")
    core = client.CoreV1Api(installed.admin.api)
    for name in ("hf", "unrelated"):
        core.create_namespaced_secret(
            NS,
            {"metadata": {"name": name}, "data": {"HF_TOKEN": base64.b64encode(b"hf_tenant_token").decode()}},
        )
    assert not may_get_secret(installed, "hf", HOOKS_SA)
    source = {
        "huggingface": {"repo": "org/private", "token": {"secretRef": {"name": "hf", "key": "HF_TOKEN"}}}
    }
    hub.faults.rate = 100_000  # bytes/s per response: the download takes a few seconds
    try:
        installed.admin.create(modelcache("private", NS, node_selector={POOL: "agent"}, source=source))
        # While the copy downloads: the grant the sync hook returned, created by Metacontroller's
        # identity, for exactly that one Secret, to praesto-hooks' credentials broker (hooks/broker.py),
        # which hands it to this node's agent; the agents' own account never reads it.
        wait_for("the per-cache grant", lambda: may_get_secret(installed, "hf", HOOKS_SA), 30)
        assert not may_get_secret(installed, "unrelated", HOOKS_SA)
        assert not may_get_secret(installed, "hf")
        composite.wait_parent(NS, "private", phase_is(names.PHASE_READY), deadline=90)
    finally:
        hub.faults.rate = 0
    assert StoreLayout(agent.base).is_complete(NS, "private")
    assert "hf_tenant_token" not in agent.log()
    # Every copy is on disk: no agent needs the Secret any more, so the grant goes (#21 item 4).
    role = names.secret_reader_role_name("private")
    wait_gone(installed.admin, "rbac.authorization.k8s.io/v1", "RoleBinding", role, NS)
    wait_gone(installed.admin, "rbac.authorization.k8s.io/v1", "Role", role, NS)
    assert not may_get_secret(installed, "hf", HOOKS_SA) and not may_get_secret(installed, "hf")

    installed.admin.delete(names.API_VERSION, names.MODELCACHE_KIND, "private", NS)
    composite.wait_parent(NS, "private", gone, deadline=60)


def test_api_server_restart_mid_download_and_an_expired_watch(
    installed: Installed, hub: LocalHub, agent: AgentProcess, composite: CompositeController
) -> None:
    hub.add_repo("org/slow", {"config.json": b"{}", "model.bin": b"s" * 400_000})
    hub.faults.rate = 100_000  # bytes/s per response: the download takes a few seconds
    try:
        installed.admin.create(
            modelcache(
                "slow", NS, node_selector={POOL: "agent"}, source={"huggingface": {"repo": "org/slow"}}
            )
        )
        wait_for(
            "the agent to report the download",
            lambda: (
                (modelcachenodes(installed.admin, NS, "slow").get(NODE, {}).get("status") or {}).get("phase")
                == names.PHASE_DOWNLOADING
            ),
            30,
        )
        relists_before = agent.log().count("watch expired; relisting")
        installed.plane.stop_apiserver()
        # While the API server is away the download goes on and its status writes fail (kept for
        # later). etcd moves on and compacts meanwhile, so the agent's watch position is gone.
        installed.plane.compact_etcd()
        installed.plane.start_apiserver()
        try:
            composite.wait_parent(NS, "slow", phase_is(names.PHASE_READY), deadline=90)
        except TimeoutError as err:
            raise TimeoutError(f"{err}\nagent log:\n{agent.log()[-4000:]}") from None
    finally:
        hub.faults.rate = 0
    assert StoreLayout(agent.base).is_complete(NS, "slow")
    # The resumed watch asked for a resourceVersion etcd no longer has (410 Gone): the agent
    # relists instead of missing events or giving up...
    wait_for(
        "the agent to relist after 410",
        lambda: agent.log().count("watch expired; relisting") > relists_before,
        60,
    )
    # ...and still sees what happens next: deleting the cache removes the node copy.
    installed.admin.delete(names.API_VERSION, names.MODELCACHE_KIND, "slow", NS)
    composite.wait_parent(NS, "slow", gone, deadline=60)
    assert not StoreLayout(agent.base).cache_dir(NS, "slow").exists()


def test_a_failed_copy_retries_at_once_when_its_node_copy_is_deleted(
    installed: Installed, hub: LocalHub, agent: AgentProcess, composite: CompositeController
) -> None:
    """The one-step retry the Degraded condition and the user guide name: delete the node copy."""
    cache = modelcache(
        "later", NS, node_selector={POOL: "agent"}, source={"huggingface": {"repo": "org/later"}}
    )
    installed.admin.create(cache)
    failed = composite.wait_parent(NS, "later", phase_is(names.PHASE_FAILED), deadline=60)
    assert failed is not None
    ready_condition = next(c for c in failed["status"]["conditions"] if c["type"] == "Ready")
    assert "the repo does not exist" in ready_condition["message"]
    hub.add_repo("org/later", {"config.json": b"{}"})  # the cause is fixed; the agent's backoff is long
    (copy,) = modelcachenodes(installed.admin, NS, "later").values()
    installed.admin.delete(names.API_VERSION, names.MODELCACHENODE_KIND, copy["metadata"]["name"], NS)
    started = time.monotonic()
    composite.wait_parent(NS, "later", phase_is(names.PHASE_READY), deadline=30)
    assert time.monotonic() - started < 20  # well inside the first backoff the agent had scheduled


def test_a_disk_too_small_is_explained_on_the_modelcache(
    installed: Installed, hub: LocalHub, composite: CompositeController, tmp_path: Path
) -> None:
    """Finding 9: with the default reserve a small disk never downloads, and only the node copy said why."""
    opted_in_namespace(installed.admin, "small-disk")
    ready_node(installed.admin, "small-disk-node", {POOL: "small"})
    hub.add_repo("org/big", {"model.bin": b"b" * 100_000})
    with ExitStack() as stack:
        small = AgentProcess(
            installed, "small-disk-node", hub.endpoint, tmp_path, extra_args=("--reserve=99%",)
        )
        stack.enter_context(small)
        cache = modelcache(
            "big", "small-disk", node_selector={POOL: "small"}, source={"huggingface": {"repo": "org/big"}}
        )
        installed.admin.create(cache)
        result = composite.wait_parent("small-disk", "big", phase_is(names.PHASE_FAILED), deadline=60)
    assert result is not None
    message = next(c for c in result["status"]["conditions"] if c["type"] == "Ready")["message"]
    assert "InsufficientDiskSpace" in message and "free" in message and "reserve" in message
    assert "nodeAgent.reserve" in message  # the chart key to change, which exists (tests/chart)
