"""At-rest scrub and repair end to end (issue #25 part 2) on the real control-plane tier.

The real parts: kube-apiserver with the chart's CRDs, RBAC and agent policy; Metacontroller's
composite and decorator controllers over the hooks; a `praesto-agent run` process with the
chart's scrub flags (a short interval: the real agent's own schedule, no test-only trigger);
the CSI node plugin mounting for real (root). Each copy is mounted by a Pod first, then damaged
on disk: a flipped byte, a truncation, a name hard-linked to another blob.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import grpc
import pytest
from kubernetes import client

from praesto import names
from praesto.store import StoreLayout
from testkit.controlplane import wait_for
from testkit.csi_driver import NEEDS_ROOT, InProcessDriver, publish_request
from testkit.hub import LocalHub
from testkit.metacontroller import CompositeController, DecoratorController
from tests.cluster.agents import AgentProcess, agent_metric
from tests.cluster.flows import modelcachenodes, phase_is
from tests.cluster.installed import Installed
from tests.cluster.node_side import agent_with_csi
from tests.cluster.tenants import modelcache, opted_in_namespace, ready_node

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason=NEEDS_ROOT)

NS = "scrub-tests"
NODE = "scrub-a"
POOL = "test.praesto.io/pool"
INTERVAL = 20  # seconds after Ready (or the last scrub) each copy is re-hashed


@pytest.fixture(scope="module")
def node_side(
    installed: Installed, tmp_path_factory: pytest.TempPathFactory, hub: LocalHub
) -> Iterator[tuple[AgentProcess, InProcessDriver, int]]:
    opted_in_namespace(installed.admin, NS)
    ready_node(installed.admin, NODE, {POOL: "scrub"})
    work = tmp_path_factory.mktemp("scrub")
    with ExitStack() as stack:
        agent, driver, port = agent_with_csi(stack, installed, NODE, hub.endpoint, work,
                                             f"--scrub-interval={INTERVAL}s", "--scrub-bytes-per-second=64Mi")  # fmt: skip
        yield agent, driver, port


def _flip(path: Path, other: Path) -> None:
    with path.open("r+b") as handle:  # in place: its blob shares the inode, so it is corrupt too
        handle.seek(1000)
        byte = handle.read(1)
        handle.seek(1000)
        handle.write(bytes([byte[0] ^ 0xFF]))


def _truncate(path: Path, other: Path) -> None:
    os.truncate(path, 1000)


def _link(path: Path, other: Path) -> None:
    path.unlink()
    os.link(other, path)  # now another blob's inode (its own blob is untouched)


def _node_labels(installed: Installed) -> dict[str, str]:
    found = installed.admin.get("v1", "Node", NODE)
    return dict(((found or {}).get("metadata") or {}).get("labels") or {})


def _events(installed: Installed, reason: str, kind: str, cache: str) -> list[client.CoreV1Event]:
    """This cache's Events of `reason` about its ModelCache or its ModelCacheNode on NODE."""
    name = cache if kind == names.MODELCACHE_KIND else names.modelcachenode_name(cache, NODE)
    core = client.CoreV1Api(installed.admin.api)
    return [
        e
        for e in core.list_namespaced_event(NS).items
        if e.reason == reason and (e.involved_object.kind, e.involved_object.name) == (kind, name)
    ]


@pytest.mark.parametrize(
    ("cache", "damage", "refetched"),
    [("flip", _flip, True), ("trunc", _truncate, True), ("link", _link, False)],
)
def test_scrub_takes_a_bad_copy_out_and_repairs_it(
    installed: Installed,
    hub: LocalHub,
    composite: CompositeController,
    decorator: DecoratorController,
    node_side: tuple[AgentProcess, InProcessDriver, int],
    targets: Path,
    cache: str,
    damage: object,
    refetched: bool,
) -> None:
    agent, driver, port = node_side
    weights, other = os.urandom(300_000), os.urandom(200_000)
    hub.add_repo(f"org/{cache}", {"config.json": b'{"scrub": 1}', "model.bin": weights, "other.bin": other})
    installed.admin.create(
        modelcache(cache, NS, node_selector={POOL: "scrub"}, source={"huggingface": {"repo": f"org/{cache}"}})
    )
    composite.wait_parent(NS, cache, phase_is(names.PHASE_READY), deadline=90)
    key = names.ready_label_key(NS, cache)
    wait_for("the readiness label", lambda: _node_labels(installed).get(key) == "true", 30)
    layout = StoreLayout(agent.base)
    running = publish_request(f"csi-{cache}-1", str(targets / "running"), cache, NS)
    driver.client.publish(running)  # a Pod mounts the copy before the damage
    root = layout.cache_dir(NS, cache)
    bad = root / "model.bin"
    bad.chmod(0o644)
    damage(bad, layout.blobs_dir / hashlib.sha256(other).hexdigest())  # type: ignore[operator]
    hub.reset_counters()
    hub.faults.rate = 100_000  # bytes/s: the repair takes a few seconds, long enough to watch
    try:
        wait_for(
            "the scrub to find the damage",
            lambda: (
                (
                    (modelcachenodes(installed.admin, NS, cache)[NODE].get("status") or {}).get("scrub") or {}
                ).get("result")
                in (names.SCRUB_FAILED, names.SCRUB_REPAIRED)
            ),
            INTERVAL + 40,
        )
        if refetched:  # out of Ready while the bytes move: the label goes, a new mount is refused
            wait_for("the readiness label to go", lambda: key not in _node_labels(installed), 30)
            with pytest.raises(grpc.RpcError) as refused:
                driver.client.publish(publish_request(f"csi-{cache}-2", str(targets / "new"), cache, NS))
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "model.bin" in str(refused.value.details()) and "scrub" in str(refused.value.details())
        composite.wait_parent(NS, cache, phase_is(names.PHASE_READY), deadline=90)
        wait_for("the repaired copy", lambda: layout.is_complete(NS, cache), 60)
    finally:
        hub.faults.rate = 0
    assert bad.read_bytes() == weights
    assert (targets / "running" / "model.bin").read_bytes() == weights  # the running Pod's mount stayed
    assert hub.bytes_served == (len(weights) if refetched else 0)  # only the bad file moved (or none)
    wait_for("the readiness label back", lambda: _node_labels(installed).get(key) == "true", 30)
    driver.client.publish(publish_request(f"csi-{cache}-3", str(targets / "after"), cache, NS))
    assert (targets / "after" / "model.bin").read_bytes() == weights
    warnings = _events(installed, names.REASON_SCRUB_MISMATCH, names.MODELCACHE_KIND, cache)
    assert warnings and warnings[0].type == "Warning" and "model.bin" in warnings[0].message
    assert _events(installed, names.REASON_SCRUB_MISMATCH, names.MODELCACHENODE_KIND, cache)
    wait_for(
        "ScrubRepaired",
        lambda: bool(_events(installed, names.REASON_SCRUB_REPAIRED, names.MODELCACHENODE_KIND, cache)),
        30,
    )
    assert agent_metric(port, "praesto_scrub_mismatches_total", namespace=NS, model_cache=cache) == 1
    scrub = modelcachenodes(installed.admin, NS, cache)[NODE]["status"]["scrub"]
    assert scrub["filesChecked"] == 3
    if scrub["result"] == names.SCRUB_REPAIRED:  # a later clean scrub may have followed already
        assert scrub["mismatched"] == ["model.bin"]
    else:
        assert scrub["result"] == names.SCRUB_CLEAN
