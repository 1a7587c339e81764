"""A node store written by today's agent and driver is read by the new ones: a guard against layout drift.

The store outlives the agent: an upgrade rolls the DaemonSet over a base path full of copies,
blobs, mount records and requests written by the release before. So this test spells the layout
out literally, as the shipped releases write it (praesto/store.py's docstring), builds a store by
hand with those names, and reads it back only through the owner of the layout (praesto/store.py)
and the code that asks it (the CSI driver's storefs, eviction, the scrub schedule, the base lock,
rolling's retiring marker, the driver's pod-start records and its tracing of a mount to its cache).
A rename in praesto/store.py that would strand an existing store fails here, not on a node.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from praesto.agent import baselock, eviction
from praesto.agent.download import publish
from praesto.agent.scrub import schedule
from praesto.csi import storefs
from praesto.csi.storefs import CsiStore

from praesto import coldstart_record, names, store

NS, CACHE = "team-a", "llm"
KEY = "team-a_llm"  # <ns>_<name>
VOLUME = "csi-0123abcd"
MOUNT_FILE = "cb26b3af67cf1cf06163f974d9def718.json"  # first 32 hex of sha256("csi-0123abcd")
COMMIT = "a" * 40
BLOB = "0f" * 32
POD_UID = "0b6a2d4e-1111-2222-3333-444455556666"
POD_FILE = "f47ece33737b4bd8f0344d0e12d10610.json"  # first 32 hex of sha256("<pod uid>/team-a/llm")


def _json(path: Path, payload: dict[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload))


def _written_by_today(base: Path) -> None:
    """Every kind of file a running node holds for one cache, under its literal name."""
    cache = base / NS / CACHE
    cache.mkdir(parents=True)
    (cache / "config.json").write_text("{}")
    _json(cache / ".praesto-manifest.json", {"source": "hf://org/llm", "totalBytes": 2, "files": []})
    (cache / ".praesto-owner").write_text("{}")
    (cache / ".praesto-complete").write_text(f"{COMMIT}\n")
    internal = base / ".praesto"
    (internal / "staging" / KEY).mkdir(parents=True)
    (internal / "staging" / f"{KEY}.next").mkdir()
    (internal / "next" / KEY).mkdir(parents=True)
    (internal / "retired" / KEY / COMMIT).mkdir(parents=True)
    (internal / "retired" / KEY / COMMIT / ".praesto-retiring").write_text("")  # a collect a crash cut short
    blobs = internal / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    os.link(cache / "config.json", blobs / BLOB)
    (blobs / f".sharing-{BLOB}.1.2").write_text("{}")  # a share a crash interrupted
    mount = {"volume_id": VOLUME, "namespace": NS, "name": CACHE, "target_path": "/pods/x/vol",
             "mounted_at": 100.0, "revision": COMMIT}  # fmt: skip
    _json(internal / "mounts" / MOUNT_FILE, mount)
    (internal / "used").mkdir()
    (internal / "used" / KEY).write_text("")
    os.utime(internal / "used" / KEY, (200.0, 200.0))
    _json(internal / "requests" / f"{KEY}.json", {"namespace": NS, "name": CACHE, "requestedAt": 1.0})
    _json(internal / "requests" / "team-b_gone.json", {"namespace": "team-b", "name": "gone"})
    progress = {"phase": "Downloading", "bytes_done": 1, "bytes_total": 2, "message": "m",
                "updated_at": 3.0, "eta_seconds": 4}  # fmt: skip
    _json(internal / "progress" / f"{KEY}.json", progress)
    _json(internal / "copies" / f"{KEY}.json", {"origin": 2})
    _json(
        internal / "scrub" / f"{KEY}.json", {"lastTime": 5.0, "result": names.SCRUB_CLEAN, "filesChecked": 1}
    )
    pod = {"pod_uid": POD_UID, "pod_name": "app-0", "namespace": NS, "name": CACHE,
           "first_attempt_at": 10.0, "hit": False, "mounted_at": 12.5}  # fmt: skip
    _json(internal / "pods" / POD_FILE, pod)
    (internal / "agent.lock").write_text("")


def test_the_owner_names_every_path_as_today(tmp_path: Path) -> None:
    _written_by_today(tmp_path)
    layout, internal = store.StoreLayout(tmp_path), tmp_path / ".praesto"
    retired, pod_start = internal / "retired" / KEY / COMMIT, internal / "pods" / POD_FILE
    wanted = {  # the owner's answer -> the path today's store has
        layout.cache_dir(NS, CACHE): tmp_path / NS / CACHE,
        layout.complete_marker(NS, CACHE): tmp_path / NS / CACHE / ".praesto-complete",
        layout.manifest_path(NS, CACHE): tmp_path / NS / CACHE / ".praesto-manifest.json",
        layout.staging_dir(NS, CACHE): internal / "staging" / KEY,
        layout.next_staging_dir(NS, CACHE): internal / "staging" / f"{KEY}.next",
        layout.next_dir(NS, CACHE): internal / "next" / KEY,
        layout.retired_dir(NS, CACHE, COMMIT): internal / "retired" / KEY / COMMIT,
        layout.retired_dir(NS, CACHE, COMMIT) / store.RETIRING: retired / ".praesto-retiring",
        layout.blobs_dir: internal / "blobs" / "sha256",
        layout.blob_origin_index: internal / "blobs" / "sha256" / "by-origin",
        layout.mounts_dir / store.mount_record_name(VOLUME): internal / "mounts" / MOUNT_FILE,
        layout.used_stamp(NS, CACHE): internal / "used" / KEY,
        layout.request_file(NS, CACHE): internal / "requests" / f"{KEY}.json",
        layout.progress_file(NS, CACHE): internal / "progress" / f"{KEY}.json",
        layout.copy_record(NS, CACHE): internal / "copies" / f"{KEY}.json",
        layout.scrub_record(NS, CACHE): internal / "scrub" / f"{KEY}.json",
        layout.pod_starts_dir: internal / "pods",
        layout.pod_starts_dir / coldstart_record.record_name(POD_UID, NS, CACHE): pod_start,
        baselock.lock_path(layout): internal / "agent.lock",
    }
    assert [(str(got), str(want)) for got, want in wanted.items() if got != want] == []
    assert [p for p in wanted.values() if p.name != "by-origin" and not p.exists()] == []
    # the download's blob names (agent/download/publish.py) are the ones garbage collection knows
    assert (publish.ORIGIN_INDEX, publish.SHARING) == (store.BLOB_ORIGIN_INDEX, store.BLOB_SHARING_PREFIX)


def test_the_agent_and_the_driver_read_a_store_written_by_today(tmp_path: Path) -> None:
    _written_by_today(tmp_path)
    layout = store.StoreLayout(tmp_path)
    record = store.MountRecord(VOLUME, NS, CACHE, "/pods/x/vol", 100.0, COMMIT)
    assert store.mounts_for(layout, NS, CACHE) == [record]
    assert CsiStore(layout).all_mounts() == [record]
    assert CsiStore(layout).find_mount(VOLUME) == record
    assert store.last_used(layout, NS, CACHE) == 200.0
    assert store.pending_hydration_requests(layout) == [(NS, CACHE), ("team-b", "gone")]  # by file name
    progress = store.Progress("Downloading", 1, 2, "m", 3.0, 4)
    assert store.read_progress(layout, NS, CACHE) == progress
    assert CsiStore(layout).read_progress(NS, CACHE) == progress
    assert layout.is_complete(NS, CACHE)
    assert eviction.cache_size(layout, NS, CACHE) == 2
    scrubbed = schedule.read(layout, NS, CACHE)
    assert scrubbed is not None and (scrubbed.last_time, scrubbed.result) == (5.0, names.SCRUB_CLEAN)
    pod = coldstart_record.PodStart(POD_UID, "app-0", NS, CACHE, 10.0, False, 12.5)
    assert coldstart_record.from_json(CsiStore(layout).read_pod_start(POD_FILE)) == pod  # the driver
    with storefs.store_dir(tmp_path, (store.INTERNAL_DIR, store.PODS)) as pods:  # the agent's reporter
        assert pods is not None and storefs.record_names(pods) == [POD_FILE]
        assert coldstart_record.from_json(storefs.read_json_at(pods, POD_FILE)) == pod


def test_a_mount_is_traced_to_its_cache_by_today_s_paths() -> None:
    """The CSI driver traces a bind mount back by its path inside the filesystem (csi/recovery.py)."""
    assert store.copy_owner([NS, CACHE]) == (NS, CACHE)
    assert store.copy_owner([".praesto", "retired", KEY, COMMIT]) == (NS, CACHE)  # a switch retired it
    others = ([".praesto", "next", KEY], [".praesto", "staging", KEY], [".praesto", "retired", KEY],
              [".praesto", "retired", "team_a_llm", COMMIT], [NS], [NS, CACHE, "sub"], ["..", CACHE])  # fmt: skip
    assert [p for p in others if store.copy_owner(p) is not None] == []


def test_eviction_removes_what_today_wrote_for_a_cache(tmp_path: Path) -> None:
    _written_by_today(tmp_path)
    layout, internal = store.StoreLayout(tmp_path), tmp_path / ".praesto"
    assert eviction.drop_unowned_requests(layout, {(NS, CACHE)}) == 1  # team-b's goes, ours stays
    assert sorted(p.name for p in (internal / "requests").iterdir()) == [f"{KEY}.json"]
    (internal / "mounts" / MOUNT_FILE).unlink()  # the Pod went
    eviction.remove_all(layout, NS, CACHE)
    gone = [tmp_path / NS, internal / "staging" / KEY, internal / "staging" / f"{KEY}.next",
            internal / "next" / KEY, internal / "retired" / KEY, internal / "used" / KEY,
            internal / "requests" / f"{KEY}.json", internal / "progress" / f"{KEY}.json",
            internal / "copies" / f"{KEY}.json", internal / "scrub" / f"{KEY}.json"]  # fmt: skip
    assert [p for p in gone if p.exists()] == []
    assert (
        eviction.gc_blobs(layout) == 2
    )  # bytes of the blob only the removed copy linked; the stray share goes too
    assert sorted(p.name for p in layout.blobs_dir.iterdir()) == []
