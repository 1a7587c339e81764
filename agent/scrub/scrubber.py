"""The scrubbing thread: one due Ready copy at a time, paced, at idle I/O priority; on a mismatch the
copy leaves Ready at once and the agent's own download path repairs it.

Taking a copy out: under the store lock (so no download, eviction or removal runs meanwhile) the
completion marker goes. That one file is what the CSI driver checks before a NEW bind mount
(csi/publisher.py) and what the peer server checks before serving (agent/peers/server.py), so
neither hands the copy out, while running Pods' read-only bind mounts stay untouched. The copy's
phase leaves Ready, so the sync hook drops the Node's readiness label. Every blob holding a bad
inode is dropped from the blob area, so dedup never links corrupt bytes again, and every other copy
is marked to scrub next (it may link the same inode). The reconciler then sees an incomplete copy
and downloads it again in place (publish.py's PVC shape: staged beside, verified, renamed over the
bad names, never written in place): the good files come back from the blob area by hard link,
only the bad ones move from peers or the origin.

What it needs of the agent (its copies, status writes, Events) comes in as `AgentSide`, built by
agent/node_agent.py: the scrub package imports nothing of `praesto.agent`, which imports it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from praesto.agent.scrub import core, ioprio, schedule
from praesto.agent.scrub.pacing import BytePacer

from praesto import names, store
from praesto.store import StoreLayout

Obj = dict[str, Any]
CopyKey = tuple[str, str]  # (namespace, ModelCacheNode name), as agent/copies.py keys copies


class CopyState(Protocol):
    """What the scrubber reads and sets of the agent's memory of one copy (agent/copies.py CacheState)."""

    @property
    def job(self) -> object: ...

    @property
    def evicted(self) -> bool: ...

    scrub_findings: list[str] | None


class CopyBook(Protocol):
    """The agent's copies as the scrubber sees them (agent/copies.py Copies); `lock` guards the store."""

    @property
    def lock(self) -> AbstractContextManager[Any]: ...

    @property
    def objects(self) -> Mapping[CopyKey, Obj]: ...

    @property
    def states(self) -> Mapping[CopyKey, CopyState]: ...

    def state(self, key: CopyKey) -> CopyState: ...

    def get(self, key: CopyKey) -> Obj | None: ...


@dataclass(frozen=True)
class AgentSide:
    """The agent's side of a scrub, handed in whole so the scrub package never imports the agent."""

    copies: CopyBook
    cache_of: Callable[[Obj], str]  # spec.modelCacheName: the copy's store directory
    servable: Callable[[Obj], bool]  # Ready and not being deleted: a copy worth scrubbing
    set_status: Callable[[Obj, str, str, str, dict[str, object]], None]
    merge_status: Callable[[CopyKey, dict[str, object]], None]
    emit_event: Callable[[Obj, str, str, str], None]
    count_mismatches: Callable[[str, str, int], None]
    short_error: Callable[[Exception], str]  # one line, never an API response body


# The Xet chunk store's scrub (xetstore.verify_all, given by the agent: this package imports none of
# it): (pace, cancel) -> chunks dropped.
ChunkScrub = Callable[[Callable[[int], None], threading.Event], int]


class Scrubber:
    def __init__(
        self,
        layout: StoreLayout,
        agent: AgentSide,
        interval: float,
        bytes_per_second: int,
        clock: Callable[[], float],
        log: logging.LoggerAdapter[logging.Logger],
        poll_seconds: float = 10.0,
        chunk_store: ChunkScrub | None = None,
    ) -> None:
        self.layout, self.agent, self.copies = layout, agent, agent.copies
        self.poll_seconds, self.interval, self.clock = poll_seconds, interval, clock
        self.chunk_store = chunk_store
        self.chunks_due = clock() + interval  # like a copy's record: a restart does not rescrub at once
        self.pacer = BytePacer(bytes_per_second)
        self.cancel = threading.Event()
        self.log = log
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.interval <= 0:
            return  # nodeAgent.scrub.interval 0: off
        self._thread = threading.Thread(target=self._run, name="praesto-scrub", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self.cancel.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        refused = ioprio.set_idle()
        if refused:
            self.log.info(
                "scrub runs at normal I/O priority (still within its budget)", extra={"why": refused}
            )
        while not self.cancel.is_set():
            try:
                worked = self.scrub_next()
            except Exception as err:  # the thread must outlive any one copy
                self.log.warning("scrub failed", extra={"error": self.agent.short_error(err)})
                worked = False
            if not worked:
                self.scrub_chunk_store()
                self.cancel.wait(min(self.poll_seconds, self.interval))

    def scrub_chunk_store(self) -> int:
        """Once an interval, when no copy is due: the Xet chunk store, paced by the same budget. Its
        bad chunks are dropped (a download reading one drops it too, and fetches it again)."""
        if self.chunk_store is None or self.clock() < self.chunks_due:
            return 0
        try:
            dropped = self.chunk_store(self.pacer, self.cancel)
        except Exception as err:  # the thread must outlive the store
            self.log.warning("chunk store scrub failed", extra={"error": self.agent.short_error(err)})
            dropped = 0
        self.chunks_due = self.clock() + self.interval
        if dropped:
            self.log.warning("scrub dropped bad Xet chunks", extra={"count": dropped})
        return dropped

    def next_due(self) -> tuple[CopyKey, Obj] | None:
        """The most overdue Ready copy that no download or removal holds."""
        now, best = self.clock(), None
        with self.copies.lock:
            items = list(self.copies.objects.items())
            for key, obj in items:
                state = self.copies.states.get(key)
                if not self.agent.servable(obj) or (
                    state is not None and (state.job is not None or state.evicted)
                ):
                    continue
                due = schedule.due_at(self.layout, key[0], self.agent.cache_of(obj), self.interval)
                if due is not None and due <= now and (best is None or due < best[0]):
                    best = (due, key, obj)
        return None if best is None else (best[1], best[2])

    def scrub_next(self) -> bool:
        """Scrub the most overdue copy, if any; True when one was scrubbed."""
        found = self.next_due()
        if found is None:
            return False
        key, obj = found
        ns, cache = key[0], self.agent.cache_of(obj)
        copy_dir = self.layout.cache_dir(ns, cache)
        marker = _stamp(self.layout.complete_marker(ns, cache))
        manifest = store.read_json(self.layout.manifest_path(ns, cache)) or {}
        try:
            files = core.expected_files(manifest)
        except core.ManifestError as err:
            self.log.warning(
                "copy cannot be scrubbed", extra={"namespace": ns, "cache": cache, "error": str(err)}
            )
            schedule.write(self.layout, ns, cache, schedule.ScrubRecord(self.clock(), names.SCRUB_FAILED))
            return True
        report = core.scrub(copy_dir, files, self.pacer, self.cancel,
                            lambda: core.blob_inode_index(self.layout.blobs_dir))  # fmt: skip
        if self.cancel.is_set():
            return True
        rotten = self._rotten_blobs(report, files)
        sharing = self._sharing(ns, cache, report)
        with self.copies.lock:
            state = self.copies.state(key)  # kept: the repairing download reads scrub_findings
            if state.job is not None or _stamp(self.layout.complete_marker(ns, cache)) != marker:
                return True  # replaced, evicted or removed meanwhile: its next turn scrubs what is there
            if report.clean:
                record = schedule.record_of(report, names.SCRUB_CLEAN, self.clock())
                schedule.write(self.layout, ns, cache, record)
            else:
                record = schedule.record_of(report, names.SCRUB_FAILED, self.clock())
                self._take_out(key, ns, cache, report, record, state, rotten, sharing)
        current = self.copies.get(key) or obj
        if report.clean:
            self.agent.merge_status(key, {"scrub": record.status()})
            return True
        bad = "; ".join(f.describe() for f in report.findings[: names.SCRUB_MISMATCHED_MAX])
        message = f"scrub found {len(report.findings)} bad file(s), fetching them again: {bad}"
        self.agent.count_mismatches(ns, cache, len(report.findings))
        self.log.warning("scrub mismatch", extra={"namespace": ns, "cache": cache, "detail": bad})
        self.agent.emit_event(current, "Warning", names.REASON_SCRUB_MISMATCH, message)
        self.agent.set_status(
            current, names.PHASE_PENDING, names.REASON_SCRUB_MISMATCH, message, {"scrub": record.status()}
        )
        return True

    def _rotten_blobs(self, report: core.Report, files: list[core.Expected]) -> list[str]:
        """The blobs the repair would link in place of a bad name, checked first (paced, outside the
        lock): one that rotted too is dropped, so the repair fetches those bytes instead."""
        wanted = {f.path: f for f in files}
        out = []
        for finding in report.findings:
            want = wanted[finding.path]
            blob = self.layout.blobs_dir / want.sha256
            if blob.exists() and not _blob_is(blob, want, self.pacer):
                out.append(want.sha256)
        return out

    def _sharing(self, ns: str, cache: str, report: core.Report) -> list[tuple[str, str]]:
        """Other complete copies on this node with a name on a corrupt inode (dedup shares them):
        scrubbed next, so they leave Ready too (one stat per file, outside the lock)."""
        bad = {
            f.inode for f in report.findings if f.inode is not None and f.kind in (core.CHANGED, core.SIZE)
        }
        if not bad:
            return []
        with self.copies.lock:
            cache_of = self.agent.cache_of
            others = {(k[0], cache_of(o)) for k, o in self.copies.objects.items() if cache_of(o)} - {
                (ns, cache)
            }
        out = []
        for other_ns, other_cache in sorted(others):
            manifest = store.read_json(self.layout.manifest_path(other_ns, other_cache)) or {}
            root = self.layout.cache_dir(other_ns, other_cache)
            for entry in manifest.get("files") or []:
                path = entry.get("path") if isinstance(entry, dict) else None
                if not isinstance(path, str) or not core.safe_path(path):
                    continue
                try:
                    info = os.lstat(root / path)
                except OSError:
                    continue
                if (info.st_dev, info.st_ino) in bad:
                    out.append((other_ns, other_cache))
                    break
        return out

    def _take_out(
        self,
        key: CopyKey,
        ns: str,
        cache: str,
        report: core.Report,
        record: schedule.ScrubRecord,
        state: CopyState,
        rotten: list[str],
        sharing: list[tuple[str, str]],
    ) -> None:
        """Under the store lock: no new mount, no peer serving, no dedup of the bad bytes."""
        with contextlib.suppress(FileNotFoundError):
            self.layout.complete_marker(ns, cache).unlink()
        # corrupt content: its inode is bad wherever it is linked (a LINKED name points at another
        # blob's good inode: only the name is wrong, that blob stays)
        bad_inodes = {
            f.inode for f in report.findings if f.inode is not None and f.kind in (core.CHANGED, core.SIZE)
        }
        for inode, sha in core.blob_inode_index(self.layout.blobs_dir).items():
            if inode in bad_inodes:
                with contextlib.suppress(FileNotFoundError):
                    (self.layout.blobs_dir / sha).unlink()
        for sha in rotten:
            with contextlib.suppress(FileNotFoundError):
                (self.layout.blobs_dir / sha).unlink()
        for path in (f.path for f in report.findings if f.kind == core.NOT_REGULAR):
            _remove(self.layout.cache_dir(ns, cache) / path)  # a folder or link where a file belongs
        for other_ns, other_cache in sharing:
            schedule.force(self.layout, other_ns, other_cache)
        schedule.write(self.layout, ns, cache, record)
        state.scrub_findings = [f.describe() for f in report.findings]
        store.write_progress(
            self.layout, ns, cache,
            store.Progress(names.PHASE_PENDING, 0, 0, _refusal(report), self.clock()),
        )  # fmt: skip


def _blob_is(blob: Path, want: core.Expected, budget: BytePacer) -> bool:
    report = core.Report()
    return (
        core.check_file(blob.parent, core.Expected(blob.name, want.size, want.sha256), budget, report, None)
        is None
    )


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_ino, info.st_mtime_ns


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _refusal(report: core.Report) -> str:
    """What a new mount is told while the copy is repaired (csi/waiting.py shows it in the Pod's events)."""
    bad = ", ".join(f.path for f in report.findings[: names.SCRUB_MISMATCHED_MAX])
    return f"{names.SCRUB_REPAIR_PROGRESS} ({bad})"
