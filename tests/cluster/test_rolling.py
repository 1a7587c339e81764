"""Rolling revision updates end to end (issue #25 part 1) on the real control-plane tier.

The real parts: kube-apiserver with the chart's CRDs (their CEL rules) and webhook; Metacontroller's
composite and decorator controllers over the hooks; a `praesto-agent run` process; the CSI node
plugin mounting for real (root). Two revisions of one repo share one file and differ in another:
the origin serves only the changed file, a Pod that mounted the first revision keeps reading it
after the switch, a rollback while that Pod runs fetches nothing, and a revision goes from the
node once the last Pod that mounts it ends. An object store's prefix rolls the same way within its
bucket (a real moto S3 server).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from kubernetes.dynamic.exceptions import DynamicApiError

from praesto import names
from praesto.store import StoreLayout
from testkit.controlplane import wait_for
from testkit.csi_driver import NEEDS_ROOT, InProcessDriver, publish_request
from testkit.hub import LocalHub
from testkit.metacontroller import CompositeController, DecoratorController
from testkit.ports import free_port
from testkit.s3server import ADMIN_KEY, S3Server
from tests.cluster.agents import AgentProcess
from tests.cluster.flows import merge_patch, modelcachenodes
from tests.cluster.installed import Installed
from tests.cluster.node_side import agent_with_csi
from tests.cluster.tenants import modelcache, opted_in_namespace, ready_node

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason=NEEDS_ROOT)

NS = "rolling-tests"
NODE = "rolling-a"
POOL = "test.praesto.io/pool"
CACHE = "roll"
SHARED = os.urandom(300_000)
OLD, NEW = os.urandom(200_000), os.urandom(1_000_000)


@pytest.fixture(scope="module")
def node_side(
    installed: Installed, tmp_path_factory: pytest.TempPathFactory, hub: LocalHub
) -> Iterator[tuple[AgentProcess, InProcessDriver]]:
    opted_in_namespace(installed.admin, NS)
    ready_node(installed.admin, NODE, {POOL: "rolling"})
    work = tmp_path_factory.mktemp("rolling")
    with ExitStack() as stack:
        agent, driver, _ = agent_with_csi(stack, installed, NODE, hub.endpoint, work)
        yield agent, driver


def _status_of(installed: Installed, cache: str) -> dict[str, Any]:
    found = installed.admin.get(names.API_VERSION, names.MODELCACHE_KIND, cache, NS) or {}
    return dict(found.get("status") or {})


def _status(installed: Installed) -> dict[str, Any]:
    return _status_of(installed, CACHE)


def _rolling(status: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == names.CONDITION_ROLLING), {})


def _serves(installed: Installed, commit: str) -> bool:
    status = _status(installed)
    return (
        status.get("phase") == names.PHASE_READY
        and status.get("resolvedRevision") == commit
        and "nextRevision" not in status
        and _rolling(status).get("status") == "False"
    )


def _ask(installed: Installed, revision: str) -> None:
    body = {"spec": {"source": {"huggingface": {"revision": revision}}}}
    merge_patch(installed.admin, names.API_VERSION, names.MODELCACHE_KIND, CACHE, body, NS)


def test_a_revision_rolls_beside_the_old_one_and_back_without_a_download(
    installed: Installed,
    hub: LocalHub,
    composite: CompositeController,
    decorator: DecoratorController,
    node_side: tuple[AgentProcess, InProcessDriver],
    tmp_path: Path,
) -> None:
    agent, driver = node_side
    layout = StoreLayout(agent.base)
    first = hub.add_repo(f"org/{CACHE}", {"rolling-shared.bin": SHARED, "rolling-weights.bin": OLD})
    second = hub.commit(
        f"org/{CACHE}", {"rolling-shared.bin": SHARED, "rolling-weights.bin": NEW}, branch="v2"
    )
    source = {"huggingface": {"repo": f"org/{CACHE}"}}
    installed.admin.create(modelcache(CACHE, NS, node_selector={POOL: "rolling"}, source=source))
    wait_for("the first revision Ready", lambda: _status(installed).get("resolvedRevision") == first
             and _status(installed).get("phase") == names.PHASE_READY, 90)  # fmt: skip

    # Anything but the revision stays as created: the CRD's rule and the webhook say so.
    body = {"spec": {"source": {"huggingface": {"repo": "org/other"}}}}
    with pytest.raises(DynamicApiError) as refused:
        merge_patch(installed.admin, names.API_VERSION, names.MODELCACHE_KIND, CACHE, body, NS)
    said = str(refused.value.body)  # the CRD's rule answers first (422), naming the field and the exception
    assert "spec.source" in said and "immutable but for its revision" in said

    old_pod = tmp_path / "old-pod"
    driver.client.publish(publish_request("csi-roll-old", str(old_pod), CACHE, NS))  # a Pod on the first
    hub.reset_counters()
    hub.faults.rate = 200_000  # bytes/s: the changed file takes seconds, long enough to see the roll
    try:
        _ask(installed, "v2")
        wait_for(
            "the Rolling condition while the new revision is fetched beside the old one",
            lambda: (
                _rolling(_status(installed)).get("status") == "True"
                and _status(installed).get("nextRevision") == second
            ),
            60,
        )
        rolling = _status(installed)
        assert rolling["phase"] == names.PHASE_READY and rolling["resolvedRevision"] == first  # still serving
        assert rolling["requestedRevision"] == "v2"
        wait_for("the switch to the new revision", lambda: _serves(installed, second), 90)
    finally:
        hub.faults.rate = 0
    assert _origin_bytes(hub) == len(NEW)  # the shared file was linked from the blob the first revision left
    assert (old_pod / "rolling-weights.bin").read_bytes() == OLD  # the running Pod's mount is untouched
    new_pod = tmp_path / "new-pod"
    driver.client.publish(publish_request("csi-roll-new", str(new_pod), CACHE, NS))
    assert (new_pod / "rolling-weights.bin").read_bytes() == NEW and (
        new_pod / "rolling-shared.bin"
    ).read_bytes() == SHARED
    assert len(list(layout.retired_root(NS, CACHE).iterdir())) == 1  # the first revision, mounted
    assert _status(installed)["revisions"] == [{"revision": second, "readyNodes": 1}]

    # Back to the first revision while its Pod runs: it is still on the node, nothing is fetched.
    hub.reset_counters()
    _ask(installed, first)
    wait_for("the rollback", lambda: _serves(installed, first), 90)
    assert _origin_bytes(hub) == 0
    node_copy = modelcachenodes(installed.admin, NS, CACHE)[NODE]
    assert node_copy["spec"]["source"]["revision"] == first and "next" not in node_copy["status"]
    assert (old_pod / "rolling-weights.bin").read_bytes() == OLD and (
        new_pod / "rolling-weights.bin"
    ).read_bytes() == NEW

    # The second revision's last Pod ends: that revision leaves the node.
    driver.client.unpublish("csi-roll-new", str(new_pod))
    wait_for("the unmounted revision removed", lambda: not layout.retired_root(NS, CACHE).exists(), 30)
    assert (layout.cache_dir(NS, CACHE) / "rolling-weights.bin").read_bytes() == OLD
    driver.client.unpublish("csi-roll-old", str(old_pod))


def test_an_object_store_prefix_rolls_within_its_bucket(
    installed: Installed,
    composite: CompositeController,
    decorator: DecoratorController,
    node_side: tuple[AgentProcess, InProcessDriver],
    tmp_path: Path,
    targets: Path,
) -> None:
    """An s3:// cache's version is its prefix: a new one in the same bucket rolls like a revision (the
    unchanged object is linked, not fetched; the old copy stays for its Pod); another bucket is refused."""
    agent, driver = node_side
    layout = StoreLayout(agent.base)
    cache = "roll-s3"
    shared = os.urandom(300_000)  # not SHARED: bytes another cache put in the blob area are linked from there
    with S3Server(tmp_path / "moto") as s3:
        bucket = s3.client()
        bucket.create_bucket(Bucket="models")
        for prefix, weights in (("v1", OLD), ("v2", NEW)):
            for path, data in {"rolling-shared.bin": shared, "rolling-weights.bin": weights}.items():
                bucket.put_object(Bucket="models", Key=f"roll/{prefix}/{path}", Body=data)
        keys = {"AWS_ACCESS_KEY_ID": ADMIN_KEY[0], "AWS_SECRET_ACCESS_KEY": ADMIN_KEY[1],
                "AWS_ENDPOINT_URL": s3.endpoint}  # fmt: skip
        installed.admin.create(
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3-creds", "namespace": NS},
             "stringData": keys}
        )  # fmt: skip
        source = {"uri": "s3://models/roll/v1", "secretRef": {"name": "s3-creds"}}
        installed.admin.create(modelcache(cache, NS, node_selector={POOL: "rolling"}, source=source))
        wait_for(
            "the first prefix Ready",
            lambda: _status_of(installed, cache).get("phase") == names.PHASE_READY,
            90,
        )
        first = _status_of(installed, cache)["resolvedRevision"]  # the listing's digest

        body = {"spec": {"source": {"uri": "s3://other-bucket/roll/v1"}}}
        with pytest.raises(DynamicApiError) as refused:
            merge_patch(installed.admin, names.API_VERSION, names.MODELCACHE_KIND, cache, body, NS)
        assert "immutable but for its revision" in str(refused.value.body)

        old_pod = targets / "old-pod"
        driver.client.publish(publish_request("csi-s3-old", str(old_pod), cache, NS))
        body = {"spec": {"source": {"uri": "s3://models/roll/v2"}}}
        merge_patch(installed.admin, names.API_VERSION, names.MODELCACHE_KIND, cache, body, NS)

        def rolled() -> bool:
            status = _status_of(installed, cache)
            return (
                status.get("phase") == names.PHASE_READY
                and status.get("revisions") == [{"revision": "models/roll/v2", "readyNodes": 1}]
                and "nextRevision" not in status
                and _rolling(status).get("status") == "False"
            )

        wait_for("the switch to the new prefix", rolled, 90)
    status = _status_of(installed, cache)
    assert status["requestedRevision"] == "models/roll/v2" and status["resolvedRevision"] != first
    assert (old_pod / "rolling-weights.bin").read_bytes() == OLD  # the running Pod's mount is untouched
    new_pod = targets / "new-pod"
    driver.client.publish(publish_request("csi-s3-new", str(new_pod), cache, NS))
    assert (new_pod / "rolling-weights.bin").read_bytes() == NEW
    (retired,) = layout.retired_root(NS, cache).iterdir()  # the first prefix's copy, mounted
    served = layout.cache_dir(NS, cache)
    assert (retired / "rolling-shared.bin").stat().st_ino == (
        served / "rolling-shared.bin"
    ).stat().st_ino  # linked, not fetched
    driver.client.unpublish("csi-s3-old", str(old_pod))
    wait_for("the unmounted prefix removed", lambda: not layout.retired_root(NS, cache).exists(), 30)
    driver.client.unpublish("csi-s3-new", str(new_pod))


PAIR = ("rolling-b", "rolling-c")


def _agents(installed: Installed, hub: LocalHub, work: Path, nodes: tuple[str, ...], pool: str,
            peers: bool) -> Iterator[None]:  # fmt: skip
    """`nodes` in `pool`, each with its agent (serving and fetching from the others with `peers`)."""
    opted_in_namespace(installed.admin, NS)
    for node in nodes:
        ready_node(installed.admin, node, {POOL: pool})
    with ExitStack() as stack:
        for node in nodes:
            port = free_port() if peers else 0
            stack.enter_context(AgentProcess(installed, node, hub.endpoint, work / node, peer_port=port))
        yield


@pytest.fixture(scope="module")
def pair(installed: Installed, tmp_path_factory: pytest.TempPathFactory, hub: LocalHub) -> Iterator[None]:
    yield from _agents(
        installed, hub, tmp_path_factory.mktemp("rolling-all"), PAIR, "rolling-all", peers=False
    )


def test_all_nodes_hold_the_new_revision_before_any_serves_it_one_fetching_at_a_time(
    installed: Installed,
    hub: LocalHub,
    composite: CompositeController,
    decorator: DecoratorController,
    pair: None,
) -> None:
    cache = "roll-all"
    first = hub.add_repo(f"org/{cache}", {"rolling-shared.bin": SHARED, "rolling-weights.bin": OLD})
    second = hub.commit(
        f"org/{cache}", {"rolling-shared.bin": SHARED, "rolling-weights.bin": NEW}, branch="v2"
    )
    source = {"huggingface": {"repo": f"org/{cache}"}}
    strategy = {"switch": names.SWITCH_ALL_NODES, "maxFetching": 1}
    installed.admin.create(
        modelcache(cache, NS, node_selector={POOL: "rolling-all"}, source=source, updateStrategy=strategy)
    )

    def copies() -> list[dict[str, Any]]:
        return [dict(o.get("status") or {}) for o in modelcachenodes(installed.admin, NS, cache).values()]

    wait_for("both nodes Ready on the first revision", lambda: [
        (s.get("phase"), s.get("resolvedRevision")) for s in copies()
    ] == [(names.PHASE_READY, first)] * 2, 90)  # fmt: skip
    hub.reset_counters()
    seen: list[str] = []

    def rolled() -> bool:
        """Checked on every poll: never two fetching; nobody serves it while a node still fetches."""
        statuses = copies()
        fetching = [s for s in statuses if (s.get("next") or {}).get("phase") == names.NEXT_DOWNLOADING]
        serving = [s for s in statuses if s.get("resolvedRevision") == second]
        assert len(fetching) <= 1, statuses
        assert not (serving and fetching), statuses
        if any((s.get("next") or {}).get("phase") == names.NEXT_READY for s in statuses):
            seen.append("held")  # a node holds it beside the old one, and waits
        return len(serving) == 2 and all(s.get("phase") == names.PHASE_READY for s in statuses)

    hub.faults.rate = 200_000
    try:
        merge_patch(installed.admin, names.API_VERSION, names.MODELCACHE_KIND, cache,
                    {"spec": {"source": {"huggingface": {"revision": "v2"}}}}, NS)  # fmt: skip
        try:
            wait_for("both nodes to serve the new revision", rolled, 120)
        except TimeoutError as err:  # say where it stopped: each copy's spec and status, the cache's status
            nodes = {n: {"spec": o.get("spec"), "status": o.get("status")}
                     for n, o in modelcachenodes(installed.admin, NS, cache).items()}  # fmt: skip
            raise AssertionError(f"{err}: nodes {nodes}; cache {_status_of(installed, cache)}") from None
    finally:
        hub.faults.rate = 0
    assert seen, "no node was seen holding the new revision beside the old one"
    assert _origin_bytes(hub) == 2 * len(NEW)  # each node fetched only the changed file
    wait_for(
        "the roll over",
        lambda: _rolling(_status_of(installed, cache)).get("reason") == names.REASON_ROLLED,
        30,
    )
    assert _status_of(installed, cache)["resolvedRevision"] == second


def _origin_bytes(hub: LocalHub) -> int:
    """Bytes the hub served of these tests' files. Not `hub.bytes_served`: the nodes also take the
    caches other tests left selecting every node, and one landing after the counters were reset
    counted its 2-byte file here once (CI)."""
    return sum(hub.bytes_by_path.get(path, 0) for path in ("rolling-shared.bin", "rolling-weights.bin"))


PEERED = ("rolling-d", "rolling-e")


@pytest.fixture(scope="module")
def peered(installed: Installed, tmp_path_factory: pytest.TempPathFactory, hub: LocalHub) -> Iterator[None]:
    """Two agents that serve and fetch from each other (the chart's nodeAgent.peers)."""
    work = tmp_path_factory.mktemp("rolling-peers")
    yield from _agents(installed, hub, work, PEERED, "rolling-peers", peers=True)


def test_each_node_switches_and_the_next_one_fetches_the_change_from_it(
    installed: Installed,
    hub: LocalHub,
    composite: CompositeController,
    decorator: DecoratorController,
    peered: None,
) -> None:
    cache = "roll-peers"
    first = hub.add_repo(f"org/{cache}", {"rolling-shared.bin": SHARED, "rolling-weights.bin": OLD})
    second = hub.commit(
        f"org/{cache}", {"rolling-shared.bin": SHARED, "rolling-weights.bin": NEW}, branch="v2"
    )
    source = {"huggingface": {"repo": f"org/{cache}"}}
    installed.admin.create(
        modelcache(
            cache, NS, node_selector={POOL: "rolling-peers"}, source=source, updateStrategy={"maxFetching": 1}
        )
    )

    def copies() -> list[dict[str, Any]]:
        return [dict(o.get("status") or {}) for o in modelcachenodes(installed.admin, NS, cache).values()]

    wait_for("both nodes Ready on the first revision", lambda: [
        (s.get("phase"), s.get("resolvedRevision")) for s in copies()
    ] == [(names.PHASE_READY, first)] * 2, 90)  # fmt: skip
    hub.reset_counters()
    merge_patch(installed.admin, names.API_VERSION, names.MODELCACHE_KIND, cache,
                {"spec": {"source": {"huggingface": {"revision": "v2"}}}}, NS)  # fmt: skip
    wait_for(
        "the roll over",
        lambda: _rolling(_status_of(installed, cache)).get("reason") == names.REASON_ROLLED,
        120,
    )
    statuses = copies()
    assert [s.get("resolvedRevision") for s in statuses] == [second] * 2
    assert _origin_bytes(hub) == len(NEW)  # the origin once; the second node took it from the first
    assert sorted(s.get("bytesFromPeers") or 0 for s in statuses)[-1] == len(NEW)
