"""The sync hook adds the copies' rates up and takes the longest time left (local mode), into fields
the CRD declares (a field it does not declare is pruned, and Metacontroller loops on the difference)."""

from __future__ import annotations

from typing import Any

from praesto.hooks import hook_protocol
from praesto.hooks.modelcache import HOOKS

from praesto import names, progress
from testkit.helm_chart import CRD_DIR, crd_documents, crd_schemas
from testkit.hook_objects import NOW, cache_node, mcn, modelcache, node_status, sync_request
from tests.hooks import golden

CACHE = "tinyllama"
NODES = ["node-a", "node-b", "node-c"]
GiB = 1 << 30
SIZE = 4 * GiB


def sync(*statuses: dict[str, Any]) -> dict[str, Any]:
    """The sync hook's status for one copy per node, with these statuses."""
    children = [mcn(CACHE, n, s) for n, s in zip(NODES, statuses, strict=False)]
    request = sync_request(
        modelcache(CACHE), nodes=[cache_node(n) for n in NODES[: len(statuses)]], children=children
    )
    response = HOOKS["sync"](request, golden.CONFIG, NOW)
    assert hook_protocol.check_response("sync", response) == []
    return response["status"]  # type: ignore[no-any-return]


def downloading(done: int, rate: int | None = None, eta: int | None = None) -> dict[str, Any]:
    timing = {
        k: v for k, v in ((progress.BYTES_PER_SECOND, rate), (progress.ETA_SECONDS, eta)) if v is not None
    }
    status = node_status(names.PHASE_DOWNLOADING, done, SIZE)
    status["progress"].update(timing)
    return status


def test_rates_add_up_and_the_longest_time_left_wins() -> None:
    status = sync(
        downloading(GiB, rate=50 << 20, eta=60),
        downloading(2 * GiB, rate=20 << 20, eta=100),
        node_status(names.PHASE_READY, SIZE, SIZE, sizeBytes=SIZE),
    )
    assert status["phase"] == names.PHASE_DOWNLOADING
    assert status["progress"] == {
        "bytesDone": 7 * GiB,
        "bytesTotal": 12 * GiB,
        "bytesPerSecond": 70 << 20,
        "etaSeconds": 100,
        "summary": "58% of 4.0 GiB on 3 nodes, ~2m left",
    }
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "Downloading" and ready["message"].endswith(
        "(58% of 4.0 GiB on 3 nodes, ~2m left)"
    )


def test_no_time_left_while_a_downloading_copy_has_no_estimate() -> None:
    """A copy that just started has no rate yet: the cache's time left would be the other copy's, too short."""
    status = sync(downloading(3 * GiB, rate=50 << 20, eta=20), downloading(0))
    assert status["progress"]["bytesPerSecond"] == 50 << 20
    assert "etaSeconds" not in status["progress"]
    assert status["progress"]["summary"] == "37% of 4.0 GiB on 2 nodes"


def test_copies_not_downloading_bring_no_rate() -> None:
    """A failed copy's last report and a Ready cache show no rate or time left."""
    failed = downloading(GiB, rate=1, eta=5)
    failed["phase"] = names.PHASE_FAILED
    status = sync(downloading(GiB, rate=10, eta=9), failed)
    assert (status["progress"]["bytesPerSecond"], status["progress"]["etaSeconds"]) == (10, 9)
    ready = sync(node_status(names.PHASE_READY, SIZE, SIZE, sizeBytes=SIZE))
    assert ready["progress"] == {"bytesDone": SIZE, "bytesTotal": SIZE, "summary": "100% of 4.0 GiB"}


def test_the_crds_declare_the_new_progress_fields() -> None:
    schemas = crd_schemas(list(crd_documents(CRD_DIR)))
    for kind in (names.MODELCACHE_KIND, names.MODELCACHENODE_KIND):
        fields = schemas[(names.API_VERSION, kind)]["properties"]["status"]["properties"]["progress"][
            "properties"
        ]
        for key in progress.RATE_FIELDS:
            assert fields[key]["type"] == "integer" and fields[key]["description"], (kind, key)
        window = f"{int(progress.RATE_WINDOW_SECONDS)} seconds"  # the description states the window
        assert window in fields[progress.BYTES_PER_SECOND]["description"], kind
