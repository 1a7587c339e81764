"""The scrub through the real agent against the real API server, repaired from the local hub.

A flipped byte (written in place, so its blob is corrupt too), a truncated file and a name
hard-linked to another blob, on a copy a Pod mounts: one scrub (a short interval, the real flag)
takes the copy out of Ready, new mounts are refused naming the files, only the bad files move
from the origin, and the copy is Ready again with the right bytes, an Event and the metric.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from praesto.csi.storefs import CsiStore
from praesto.csi.waiting import waiting_answer

from praesto import names, store
from testkit.agent_harness import Env, env_context, tree
from testkit.kube_real import RealKube

A, B, C = os.urandom(6000), os.urandom(7000), os.urandom(8000)
SMALL = b'{"model_type": "tiny"}'
HOUR = 3600.0


@pytest.fixture
def env(tmp_path: Path, kube: RealKube) -> Iterator[Env]:
    yield from env_context(kube, tmp_path)


def _writable(path: Path) -> None:
    path.chmod(0o644)


def _damage(env: Env, root: Path) -> None:
    _writable(root / "a.bin")
    with (root / "a.bin").open("r+b") as handle:  # in place: the blob shares this inode
        handle.seek(100)
        handle.write(bytes([A[100] ^ 0xFF]))
    _writable(root / "b.bin")
    os.truncate(root / "b.bin", 10)
    (root / "c.bin").unlink()
    os.link(env.layout.blobs_dir / hashlib.sha256(A).hexdigest(), root / "c.bin")  # another blob's inode


def _events(env: Env, reason: str) -> list[dict[str, object]]:
    return [e for e in env.kube.list("events", "team-a") if e.get("reason") == reason]


def test_scrub_finds_damage_takes_the_copy_out_and_repairs_only_the_bad_files(env: Env) -> None:
    env.add_model("tiny", **{"config.json": SMALL, "a.bin": A, "b.bin": B, "c.bin": C})
    env.create_mcn("tiny")
    env.start(scrub_interval=HOUR, scrub_bytes_per_second=1 << 30)
    env.wait_phase("tiny", names.PHASE_READY)
    root = env.layout.cache_dir("team-a", "tiny")
    CsiStore(env.layout).record_mount(
        store.MountRecord("vol-1", "team-a", "tiny", "/pods/x/vol", time.time())
    )
    blob_a = env.layout.blobs_dir / hashlib.sha256(A).hexdigest()
    assert blob_a.exists()
    _damage(env, root)
    env.hub.reset_counters()
    env.hub.faults.rate = 4000  # slow enough to watch the copy out of Ready while it is repaired
    env.skip(HOUR + 60)  # the copy is due: the scrubbing thread finds it on its own

    env.wait(lambda: (env.status("tiny").get("scrub") or {}).get("result") == names.SCRUB_FAILED, "the scrub")
    status = env.status("tiny")
    assert status["phase"] != names.PHASE_READY  # the sync hook drops the Node's readiness label
    assert status["scrub"]["result"] == names.SCRUB_FAILED
    assert sorted(status["scrub"]["mismatched"]) == ["a.bin", "b.bin", "c.bin"]
    assert not env.layout.is_complete("team-a", "tiny")  # the CSI driver refuses new mounts...
    progress = CsiStore(env.layout).read_progress("team-a", "tiny")
    answer = waiting_answer("team-a", "tiny", "node-a", progress, 0.0, 60.0)
    assert answer.code == grpc.StatusCode.UNAVAILABLE and "a.bin" in answer.message, answer.message
    assert store.mounts_for(env.layout, "team-a", "tiny")  # ...and the running Pod's record is untouched

    env.wait(lambda: env.layout.is_complete("team-a", "tiny"), "the repaired copy", timeout=60)
    ready = env.wait_phase("tiny", names.PHASE_READY, timeout=60)
    assert tree(root) == {"config.json": SMALL, "a.bin": A, "b.bin": B, "c.bin": C}
    # only the corrupt bytes move: config.json and c.bin's own blob (intact, checked) are linked again
    assert env.hub.bytes_served == len(A) + len(B)
    assert hashlib.sha256(blob_a.read_bytes()).hexdigest() == hashlib.sha256(A).hexdigest()
    env.wait(lambda: bool(_events(env, names.REASON_SCRUB_REPAIRED)), "the ScrubRepaired Event")
    env.wait(
        lambda: (env.status("tiny").get("scrub") or {}).get("result") == names.SCRUB_REPAIRED, "Repaired"
    )
    warnings = _events(env, names.REASON_SCRUB_MISMATCH)
    assert [(e["involvedObject"]["kind"], e["type"]) for e in warnings] == [  # type: ignore[index]
        (names.MODELCACHENODE_KIND, "Warning")
    ]  # the harness's ModelCacheNode has no owning ModelCache; the tier test sees that Event too
    assert "a.bin" in str(warnings[0]["message"])
    assert env.metric("praesto_scrub_mismatches_total", namespace="team-a", model_cache="tiny") == 3
    assert ready["phase"] == names.PHASE_READY


def test_a_file_that_cannot_be_repaired_leaves_the_copy_failed_naming_it(env: Env) -> None:
    env.add_model("tiny", **{"config.json": SMALL, "a.bin": A})
    env.create_mcn("tiny")
    env.start(scrub_interval=HOUR, scrub_bytes_per_second=1 << 30)
    env.wait_phase("tiny", names.PHASE_READY)
    root = env.layout.cache_dir("team-a", "tiny")
    _writable(root / "a.bin")
    with (root / "a.bin").open("r+b") as handle:
        handle.write(b"\0")
    env.hub.faults.corrupt["a.bin"] = 1000  # the origin now serves other bytes: the checksum stays wrong
    env.skip(HOUR + 60)
    status = env.wait_reason("tiny", names.REASON_SCRUB_REPAIR_FAILED, timeout=60)
    assert status["phase"] == names.PHASE_FAILED
    assert "a.bin" in status["message"]
    assert not env.layout.is_complete("team-a", "tiny")


def test_interval_zero_never_scrubs(env: Env) -> None:
    env.add_model("tiny", **{"a.bin": A})
    env.create_mcn("tiny")
    agent = env.start(scrub_interval=0.0)
    env.wait_phase("tiny", names.PHASE_READY)
    assert agent.scrubber._thread is None
    assert not env.layout.scrub_record("team-a", "tiny").exists()


def test_a_corrupt_inode_shared_by_dedup_takes_every_copy_out(env: Env) -> None:
    env.add_model("tiny", **{"a.bin": A})
    env.add_model("twin", **{"a.bin": A, "b.bin": B})
    env.create_mcn("tiny")
    env.create_mcn("twin")
    env.start(scrub_interval=HOUR, scrub_bytes_per_second=1 << 30)
    env.wait_phase("tiny", names.PHASE_READY)
    env.wait_phase("twin", names.PHASE_READY)
    one, two = (
        env.layout.cache_dir("team-a", "tiny") / "a.bin",
        env.layout.cache_dir("team-a", "twin") / "a.bin",
    )
    assert os.stat(one).st_ino == os.stat(two).st_ino  # deduplicated: one inode, one blob
    _writable(one)
    with one.open("r+b") as handle:
        handle.write(bytes([A[0] ^ 1]))
    env.hub.reset_counters()
    env.skip(HOUR + 60)
    for cache in ("tiny", "twin"):
        env.wait(
            lambda cache=cache: (env.status(cache).get("scrub") or {}).get("result") == names.SCRUB_REPAIRED,  # type: ignore[misc]
            f"{cache} repaired",
            timeout=60,
        )
    env.wait_phase("twin", names.PHASE_READY)
    assert one.read_bytes() == A and two.read_bytes() == A
    assert env.hub.bytes_served == len(A)  # fetched once; the second copy links the repaired blob
