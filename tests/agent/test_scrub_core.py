"""The scrub's pure core, pacing, schedule and idle I/O priority, on real files (no API server)."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from praesto.agent.scrub import core, ioprio, schedule
from praesto.agent.scrub.pacing import BytePacer

from praesto import names, store
from praesto.store import StoreLayout


def _publish(layout: StoreLayout, ns: str, cache: str, files: dict[str, bytes]) -> dict[str, Any]:
    """A copy as the downloader leaves it: read-only files hard-linked into the blob area, a manifest, the marker."""
    root = layout.cache_dir(ns, cache)
    layout.blobs_dir.mkdir(parents=True, exist_ok=True)
    entries = []
    for path, data in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256(data).hexdigest()
        blob = layout.blobs_dir / digest
        if not blob.exists():
            blob.write_bytes(data)
            blob.chmod(0o444)
        os.link(blob, target)
        entries.append({"path": path, "size": len(data), "sha256": digest})
    manifest: dict[str, Any] = {"source": "hf://o/m", "resolvedRevision": "c" * 40, "files": entries}
    store.write_json_atomic(layout.manifest_path(ns, cache), manifest)
    layout.complete_marker(ns, cache).write_text("c\n")
    return manifest


def _scrub(layout: StoreLayout, ns: str, cache: str) -> core.Report:
    manifest = store.read_json(layout.manifest_path(ns, cache)) or {}
    return core.scrub(
        layout.cache_dir(ns, cache), core.expected_files(manifest),
        blob_inodes=lambda: core.blob_inode_index(layout.blobs_dir),
    )  # fmt: skip


def _rewrite(path: Path, data: bytes) -> None:
    path.chmod(0o644)
    with path.open("r+b") as handle:
        handle.write(data)
    path.chmod(0o444)


def test_clean_copy_checks_every_byte(tmp_path: Path) -> None:
    layout = StoreLayout(tmp_path)
    _publish(layout, "ns", "m", {"a.bin": b"a" * 3000, "sub/b.json": b"{}"})
    report = _scrub(layout, "ns", "m")
    assert report.clean and report.files_checked == 2 and report.bytes_checked == 3002


def test_each_kind_of_damage_is_found_and_named(tmp_path: Path) -> None:
    layout = StoreLayout(tmp_path)
    files = {
        "flip.bin": b"x" * 100,
        "trunc.bin": b"y" * 100,
        "gone.bin": b"g",
        "dir.bin": b"d",
        "linked.bin": b"l" * 10,
    }
    _publish(layout, "ns", "m", files)
    _publish(layout, "ns", "other", {"o.bin": b"o" * 10})
    root = layout.cache_dir("ns", "m")
    _rewrite(root / "flip.bin", b"X")  # one flipped byte, in place: the blob shares the inode
    (root / "trunc.bin").chmod(0o644)
    os.truncate(root / "trunc.bin", 50)
    (root / "gone.bin").unlink()
    (root / "dir.bin").unlink()
    (root / "dir.bin").mkdir()
    (root / "linked.bin").unlink()
    os.link(layout.blobs_dir / hashlib.sha256(b"o" * 10).hexdigest(), root / "linked.bin")
    report = _scrub(layout, "ns", "m")
    kinds = {f.path: f.kind for f in report.findings}
    assert kinds == {
        "flip.bin": core.CHANGED,
        "trunc.bin": core.SIZE,
        "gone.bin": core.MISSING,
        "dir.bin": core.NOT_REGULAR,
        "linked.bin": core.LINKED,
    }
    flip = next(f for f in report.findings if f.path == "flip.bin")
    assert "sha256" in flip.describe()
    blob = os.stat(layout.blobs_dir / hashlib.sha256(b"x" * 100).hexdigest())
    assert flip.inode == (blob.st_dev, blob.st_ino)  # the corrupt blob is known by its inode


def test_manifest_that_cannot_be_checked_is_refused_naming_the_entry() -> None:
    with pytest.raises(core.ManifestError, match=r"a\.bin has no sha256"):
        core.expected_files({"files": [{"path": "a.bin", "size": 1}]})
    with pytest.raises(core.ManifestError, match="not a relative path"):
        core.expected_files({"files": [{"path": "../x", "size": 1, "sha256": "0" * 64}]})


def test_cancel_stops_the_scrub(tmp_path: Path) -> None:
    layout = StoreLayout(tmp_path)
    _publish(layout, "ns", "m", {"a": b"a", "b": b"b"})
    cancel = threading.Event()
    cancel.set()
    manifest = store.read_json(layout.manifest_path("ns", "m")) or {}
    report = core.scrub(layout.cache_dir("ns", "m"), core.expected_files(manifest), cancel=cancel)
    assert report.files_checked == 0


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_pacer_holds_reads_to_the_budget() -> None:
    clock = FakeClock()
    pacer = BytePacer(1000, clock, clock.sleep)
    start = clock.now
    for _ in range(10):
        pacer(500)  # 5000 bytes at 1000 B/s: one second of burst, then four seconds of waiting
    assert clock.now - start == pytest.approx(4.0)
    assert pacer.delay_for(0) == 0.0


def test_pacer_burst_is_bounded_after_idle() -> None:
    clock = FakeClock()
    pacer = BytePacer(1000, clock, clock.sleep)
    clock.now += 3600  # an hour idle gives no more than one second of budget
    assert pacer.delay_for(1000) == 0.0
    assert pacer.delay_for(1000) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="positive"):
        BytePacer(0, clock, clock.sleep)


def test_schedule_persists_and_spreads(tmp_path: Path) -> None:
    layout = StoreLayout(tmp_path)
    _publish(layout, "ns", "m", {"a": b"a"})
    ready = os.stat(layout.complete_marker("ns", "m")).st_mtime
    assert schedule.due_at(layout, "ns", "m", 60.0) == pytest.approx(ready + 60.0)
    report = core.Report(files_checked=1, bytes_checked=1)
    schedule.write(layout, "ns", "m", schedule.record_of(report, names.SCRUB_CLEAN, ready + 500))
    assert schedule.due_at(layout, "ns", "m", 60.0) == pytest.approx(ready + 560.0)  # a restart reads it back
    schedule.force(layout, "ns", "m")
    assert schedule.due_at(layout, "ns", "m", 60.0) == 0.0
    assert schedule.due_at(layout, "ns", "absent", 60.0) is None
    status = (schedule.read(layout, "ns", "m") or schedule.ScrubRecord()).status()
    assert status["result"] == names.SCRUB_CLEAN and status["filesChecked"] == 1


def test_idle_io_priority_for_the_calling_thread_or_a_reason() -> None:
    out: dict[str, object] = {}

    def run() -> None:
        out["refused"] = ioprio.set_idle()
        out["now"] = ioprio.current()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    if out["refused"] is not None:
        assert "ioprio_set" in str(out["refused"])  # refused: the scrub runs at normal priority
    else:
        assert out["now"] == ioprio.idle_value()
    assert ioprio.current() != ioprio.idle_value()  # this thread kept its priority
