"""The operator's view of a download on the real control plane: two node agents fetch a paced model,
our sync hook adds their rates up and takes the longest time left, Metacontroller writes that status
through the API server (which prunes any field the CRD does not declare), and the server's own Table
rendering gives the PROGRESS and REASON columns `kubectl get modelcache` prints.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from praesto import names, progress
from testkit.hub import LocalHub
from testkit.metacontroller import CompositeController, gone
from testkit.printer_columns import printed_columns
from testkit.status_watch import StatusLog
from tests.cluster.agents import AgentProcess
from tests.cluster.flows import start_agents
from tests.cluster.installed import Installed
from tests.cluster.tenants import modelcache, opted_in_namespace, ready_node

NS = "progress-view"
POOL = "test.praesto.io/progress-pool"
NODES = ["progress-a", "progress-b"]
MiB = 1 << 20


@pytest.fixture(scope="module")
def agents(
    installed: Installed, hub: LocalHub, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, AgentProcess]]:
    opted_in_namespace(installed.admin, NS)
    for node in NODES:
        ready_node(installed.admin, node, {POOL: "paced"})
    with ExitStack() as stack:
        yield start_agents(stack, installed, hub, tmp_path_factory.mktemp("agents"), NODES)


def test_the_cache_shows_its_copies_rate_and_time_left(
    installed: Installed, hub: LocalHub, agents: dict[str, AgentProcess], composite: CompositeController
) -> None:
    size = 8 * MiB  # one part per copy, so one paced connection each: about eight seconds
    hub.add_repo("org/paced", {"w.bin": os.urandom(size)})
    log = StatusLog(installed.admin.api, names.MODELCACHE_PLURAL, NS, "paced", names.PHASE_READY)
    hub.faults.rate = MiB  # bytes/s per response
    try:
        installed.admin.create(
            modelcache(
                "paced", NS, node_selector={POOL: "paced"}, source={"huggingface": {"repo": "org/paced"}}
            )
        )
        statuses = log.wait(deadline=120)
    finally:
        hub.faults.rate = 0

    timed = [s for s in statuses if progress.ETA_SECONDS in (s.get("progress") or {})]
    assert timed, [s.get("progress") for s in statuses]
    for status in timed:
        counts = status["progress"]
        assert status["phase"] == names.PHASE_DOWNLOADING
        assert MiB // 2 <= counts[progress.BYTES_PER_SECOND] <= 8 * MiB, counts  # two copies at ~1 MiB/s
        assert re.fullmatch(r"\d+% of 8\.0 MiB on 2 nodes, ~\d+s left", counts[progress.SUMMARY]), counts
    ready = statuses[-1]
    assert ready["progress"] == {
        progress.BYTES_DONE: 2 * size,
        progress.BYTES_TOTAL: 2 * size,
        progress.SUMMARY: "100% of 8.0 MiB on 2 nodes",
    }

    columns = printed_columns(installed.admin.api, names.API_VERSION, names.MODELCACHE_PLURAL, NS, "paced")
    condition = next(c for c in ready["conditions"] if c["type"] == "Ready")
    assert (columns["PHASE"], columns["PROGRESS"]) == (names.PHASE_READY, "100% of 8.0 MiB on 2 nodes")
    assert (columns["REASON"], columns["MESSAGE"]) == ("AllNodesReady", condition["message"])

    installed.admin.delete(names.API_VERSION, names.MODELCACHE_KIND, "paced", NS)
    composite.wait_parent(NS, "paced", gone, deadline=90)
