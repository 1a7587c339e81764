"""Fetch a plan's files into staging: parallel ranges, streaming hashes, resume, dedup.

Work is a queue of (file, part) items served by `concurrency` threads, each with its
own keep-alive connections. Large files are split into `part_size` ranges, written
with `pwrite` into preallocated files and hashed as they arrive (see hashing.py);
their parts are interleaved across files so several files hash on several cores.
How many parts are in flight adapts (PartConcurrency): a few while each connection is fast, so
each file's bytes mostly arrive at its hashing frontier and are hashed on the
receiving thread while cache-hot; up to `concurrency` when connections are slow
(a CDN's per-connection cap), where more connections mean more bytes per second.
Completed parts are fsync'd and journaled every `checkpoint_seconds`, which is what
a resumed run trusts, on a thread of their own (checkpoints.py): no fetch thread waits
on the disk. A file is verified when its last part lands; a mismatch re-fetches that
file once, then fails with ChecksumMismatch.

Crash-safety protocol (what a hard kill leaves at each step, and what resume does):
1. Staging and journal created; the journal's first line pins revision and part
   size. Kill: a later run with another plan throws the staging away.
2. Parts written with pwrite; each checkpoint fdatasyncs, then journals them.
   Kill: journaled parts are trusted (re-hashed from disk), the rest fetched again.
3. A file's last part lands: hash checked, fsync, chmod 0444, [crash point
   `file-read-only`], hard link into the blob area, "verified" journaled at the
   next checkpoint. Kill before that entry: resume drops the read-only name (it
   may share its inode with a blob, so it is never reopened for writing) and takes
   the blob back or fetches the file again.
4. Publication (publish.py): manifest and owner fsync'd into the tree, the tree
   renamed to the destination, `.praesto-complete` written and fsync'd last.
   Kill before the marker: nothing without it is ever mounted, and the next run
   publishes again.

Over 400 lines on purpose: the crash-safety protocol above is one sequence of steps over shared
state (the queue, the journal, the staging files); split across modules, each step's invariant
would be read away from the steps it protects. What could stand alone already does (hashing,
checkpoints, concurrency, writes, arrivals, publish).
"""

from __future__ import annotations

import errno
import logging
import os
import queue
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from praesto.agent.download.access import Access
from praesto.agent.download.api import (
    NO_SOURCES,
    WRITE_DIRECT,
    ByteSource,
    DownloadCancelled,
    LastingDownloadError,
    Options,
    PartSources,
    Plan,
    RemoteFile,
    Result,
    Target,
    TemporaryDownloadError,
)
from praesto.agent.download.checkpoints import Checkpointer
from praesto.agent.download.concurrency import RATE_WINDOW, START_CONNECTIONS, OwnCpuMeter, PartConcurrency
from praesto.agent.download.crashpoints import FILE_READ_ONLY, PARTS_JOURNALED, STAGING_CREATED, crash_point
from praesto.agent.download.hashing import MemoryBudget, StreamHasher
from praesto.agent.download.http import (
    MAX_ATTEMPTS,
    MAX_REDIRECTS,
    Expired,
    Redirect,
    Transient,
    backoff,
)
from praesto.agent.download.journal import Journal
from praesto.agent.download.publish import (
    TREE,
    add_to_blobs,
    link_from_blob,
    origin_key,
    recall_origin,
    remember_origin,
    stored_object_key,
)
from praesto.agent.download.writes import DirectWrites, direct_writes_possible

log = logging.getLogger("praesto.download")
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


@dataclass
class FileJob:
    file: RemoteFile
    staged: Path
    parts: list[tuple[int, int]]
    fd: int = -1
    direct: DirectWrites | None = None  # O_DIRECT writes of its aligned chunks (writes.py)
    hasher: StreamHasher | None = None
    remaining: int = 0
    unjournaled: list[int] = field(default_factory=list)
    target: Target | None = None
    checksum_retries: int = 0
    resumed: set[int] = field(default_factory=set)  # parts journaled by an earlier run
    whole: bool = False  # fetched whole through the origin's whole-file route (Access.whole_files: Xet)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Engine:
    def __init__(
        self, plan: Plan, staging: Path, access: Access, options: Options, sources: PartSources = NO_SOURCES
    ) -> None:
        """`access`: how the plan's origin serves its bytes (the origin's `open`, download/origin.py);
        `sources`: peers and arrivals beside it (the origin budget already wraps `access.transport`).
        All fixed here: nothing changes them while the engine runs."""
        self.plan = plan
        self.staging = staging
        self.tree = staging / TREE
        self.options = options
        self.peers, self.arrivals = sources.peers, sources.arrivals
        self.transport: ByteSource = access.transport
        self._locate = access.locate
        self.route = access.whole_files
        self.budget = MemoryBudget(options.memory_budget)
        self.concurrency = PartConcurrency(START_CONNECTIONS, options.concurrency, busy=OwnCpuMeter())
        self._meter = threading.local()  # per connection: bytes and seconds towards the next rate
        self.journal = Journal(staging, {"revision": plan.revision, "partSize": options.part_size, "v": 1})
        self.result = Result(plan)
        self.sha256: dict[str, str] = {}
        self.jobs: list[FileJob] = []
        self.done = 0
        self._queue: queue.Queue[tuple[FileJob, int] | None] = queue.Queue()
        self._outstanding = 0
        self._cond = threading.Condition()
        self._reporting = threading.Lock()  # progress goes out in order: a count never goes back
        self._reported = -1
        self._error: BaseException | None = None
        self._verified_unjournaled: list[tuple[str, str]] = []
        self._checkpointing = threading.Lock()  # a checkpoint, or a file's reset, at a time
        self._checkpointer = Checkpointer(self._checkpoint, options.checkpoint_seconds, self._failed)
        self._direct = options.write_mode == WRITE_DIRECT and direct_writes_possible(staging)

    # ---- set-up: resume, dedup, preallocate -----------------------------------------
    def prepare(self) -> None:
        resumed = self.journal.load()
        if resumed is None:
            shutil.rmtree(self.staging, ignore_errors=True)
        self.tree.mkdir(parents=True, exist_ok=True)
        self.journal.open(fresh=resumed is None)
        crash_point(STAGING_CREATED)
        need = 0
        for f in self.plan.files:
            staged = self.tree / f.path
            parts = _split(f.size, self.options.part_size)
            if resumed and f.path in resumed.verified and _size_is(staged, f.size):
                self.sha256[f.path] = resumed.verified[f.path]
                self.result.bytes_resumed += f.size
                continue
            if _read_only(staged):
                # Verified and made read-only, but killed before the journal said so. It may
                # share its inode with the blob area (dedup): never reopen it for writing;
                # drop this name, and take the blob back or fetch the file again.
                staged.unlink()
            known = f.sha256 or self._recalled(f)
            if link_from_blob(self.options.blobs_dir, known, f.size, staged):
                assert known is not None
                self.sha256[f.path] = known
                self.result.bytes_deduplicated += f.size
                continue
            job = FileJob(f, staged, parts)
            done = resumed.parts.get(f.path, set()) if resumed and len(parts) > 1 else set()
            if done and not _size_is(staged, f.size):
                done = set()
            self._open(job, keep=bool(done))
            assert job.hasher is not None
            for index in sorted(done):
                start, end = parts[index]
                job.hasher.add_on_disk(start, end - start)
                self.result.bytes_resumed += end - start
            job.resumed = done
            job.whole = self.route is not None and self.route.eligible(self, job)
            job.remaining = len(parts) - len(done)
            need += sum(end - start for i, (start, end) in enumerate(parts) if i not in done)
            self.jobs.append(job)
        self.done = self.result.bytes_resumed + self.result.bytes_deduplicated
        # and what archive layers say they unpack to beside them (one that does not say is stopped at
        # the bound as it unpacks: asking the whole bound free here would refuse a PVC its own size)
        need += self.plan.disk_bytes(None) - self.plan.total_bytes
        free = shutil.disk_usage(self.tree).free
        if need > free:
            raise OSError(errno.ENOSPC, f"{need} bytes needed, {free} free")
        for job in self.jobs:
            if job.file.size and job.remaining == len(job.parts):
                os.posix_fallocate(job.fd, 0, job.file.size)

    def _origin_key(self, f: RemoteFile) -> str | None:
        """The origin's name for `f`'s bytes when no sha256 is published: a Hub file's git id at this
        source and revision, an object's store digest in this bucket (None: a CRC names nothing)."""
        scope = self.options.dedup_scope
        if f.git_sha1 is not None:
            return origin_key(scope, self.plan.source.uri, self.plan.revision, f.path, f.git_sha1, f.size)
        if f.digest is not None and f.digest.cryptographic:
            bucket = self.plan.source.lineage
            return stored_object_key(scope, bucket, f.digest.algorithm, f.digest.value, f.size)
        return None

    def _recalled(self, f: RemoteFile) -> str | None:
        """A file fetched and verified before under the same origin name: its blob."""
        key = self._origin_key(f)
        return None if key is None else recall_origin(self.options.blobs_dir, key)

    def _open(self, job: FileJob, *, keep: bool) -> None:
        job.staged.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_RDWR | os.O_CREAT | (0 if keep else os.O_TRUNC)
        if not keep and job.staged.exists():
            job.staged.unlink()  # may be a read-only hard link from an earlier attempt
        job.fd = os.open(job.staged, flags, 0o644)
        if self._direct and len(job.parts) > 1:  # small files: not worth a second descriptor
            job.direct = DirectWrites.open(job.staged)
        f = job.file
        job.hasher = StreamHasher(job.fd, f.size, self.budget, f.second_digest())

    # ---- running ---------------------------------------------------------------------
    def run(self) -> None:
        self._report()
        self.concurrency.mark(self.done)
        order = sorted(self.jobs, key=lambda j: -j.file.size)
        large = [j for j in order if len(j.parts) > 1 and not j.whole]
        depth = max((len(j.parts) for j in large), default=0)
        # Whole small files first: they take no concurrency slot, so they overlap the large files'
        # first parts; then parts interleaved across files: several hashers at once.
        # Files on the whole-file route (Xet) are one item each, fetched in file order like a small file.
        items: list[tuple[FileJob, int]] = [(j, 0) for j in order if len(j.parts) == 1 or j.whole]
        for index in range(depth):
            items += [(j, index) for j in large if index < len(j.parts) and index not in j.resumed]
        self._enqueue(items)
        workers = [
            threading.Thread(target=self._worker, name=f"praesto-fetch-{n}", daemon=True)
            for n in range(max(1, self.options.concurrency))
        ]
        self._checkpointer.start()
        for w in workers:
            w.start()
        try:
            with self._cond:
                while self._outstanding and self._error is None:
                    self._cond.wait(0.5)
            for _ in workers:
                self._queue.put(None)
            for w in workers:
                w.join()
        finally:
            self._checkpointer.stop()
        self._checkpoint()
        self.close()
        if self._error is not None:
            raise self._error
        if self.options.cancel.is_set():
            raise DownloadCancelled()

    def close(self) -> None:
        for job in self.jobs:
            self._close_direct(job)
            if job.fd >= 0:
                os.close(job.fd)
                job.fd = -1
            if job.hasher is not None:
                job.hasher.discard()
        self.journal.close()

    def _enqueue(self, items: list[tuple[FileJob, int]]) -> None:
        with self._cond:
            self._outstanding += len(items)
        for item in items:
            self._queue.put(item)

    def _worker(self) -> None:
        try:
            while self._next():
                pass
        finally:
            self.transport.close()
            if self.route is not None:
                self.route.close()

    def _next(self) -> bool:
        """Fetch one queued part; False at the end. A concurrency slot is taken before the queue is
        read, so parts leave the queue in order: each file's next part starts at its frontier."""
        self.concurrency.enter()
        gated = True
        try:
            if (item := self._queue.get()) is None:
                return False
            if len(item[0].parts) == 1:  # a whole file hashes in order anyway: no slot needed
                gated = False
                self.concurrency.leave()
            try:
                if self._error is None and not self.options.cancel.is_set():
                    self._fetch_part(*item)
            except BaseException as error:
                self._failed(error)
            finally:
                with self._cond:
                    self._outstanding -= 1
                    self._cond.notify_all()
            return True
        finally:
            if gated:
                self.concurrency.leave()

    def _failed(self, error: BaseException) -> None:
        """The first error of a fetch or checkpoint thread ends the download."""
        with self._cond:
            if self._error is None:
                self._error = error
            self._cond.notify_all()

    def _target(self, job: FileJob, *, fresh: bool = False) -> Target:
        with job.lock:
            if job.target is None or fresh:
                url = self._locate(job.file)
                job.target = self.transport.resolve(url) if len(job.parts) > 1 else Target(url, True)
            return job.target

    def _fetch_part(self, job: FileJob, index: int) -> None:
        if job.whole:
            assert self.route is not None
            self.route.fetch_file(self, job)
            return
        start, end = job.parts[index]
        pos = [start]
        hasher, fd, direct = job.hasher, job.fd, job.direct
        assert hasher is not None
        meter = self._meter.__dict__.setdefault("m", [0, 0.0])  # this connection: bytes, seconds
        last = [0.0]  # when the previous chunk of this part arrived

        arrivals = self.arrivals

        def sink(offset: int, chunk: memoryview, peer: bool = False) -> None:
            written = len(chunk) if direct is not None and direct.write(offset, chunk) else 0
            while written < len(chunk):
                written += os.pwrite(fd, chunk[written:], offset + written)
            pos[0] = offset + len(chunk)
            if arrivals is not None:  # peers may copy it now, before the part is whole
                arrivals.reached(job.file.path, index, pos[0])
            hasher.feed(offset, chunk)
            self._progress(len(chunk), peer=peer)
            now = time.monotonic()
            if last[0]:  # a part's first chunk waited for the request too: not counted
                meter[0] += len(chunk)
                meter[1] += now - last[0]
                if meter[1] >= RATE_WINDOW:
                    self.concurrency.observe(meter[0], meter[1], self.done)
                    meter[0], meter[1] = 0, 0.0
            last[0] = now

        # Peers first, for files an unforgeable origin digest verifies; the origin fetches the rest.
        if self.peers is not None and job.file.peers_may_supply:
            self.peers.fetch(job.file, start, end, lambda o, c: sink(o, c, True), self.options.cancel)
        failures, expired, hops = 0, 0, 0
        target: Target | None = None
        while pos[0] < end:
            before = pos[0]
            try:
                if target is None:
                    target = self._target(job, fresh=expired > 0)
                self.transport.fetch(target, pos[0], end, sink, self.options.cancel)
                break
            except Redirect as redirect:
                # A tenant's origin may answer every byte request with another redirect: bounded,
                # like resolve(), so a loop fails the copy instead of holding a fetch thread forever.
                hops += 1
                if hops > MAX_REDIRECTS:
                    raise LastingDownloadError(
                        "SourceUnavailable",
                        f"{job.file.path}: more than {MAX_REDIRECTS} redirects fetching its bytes",
                    ) from None
                target = job.target = redirect.target
            except Expired:
                expired += 1
                if expired > 2:
                    raise LastingDownloadError(
                        "Unauthorized", f"{job.file.path}: the byte server keeps refusing access (HTTP 403)"
                    ) from None
                target = None
            except Transient as error:
                failures = 1 if pos[0] > before else failures + 1
                if failures >= MAX_ATTEMPTS:
                    raise TemporaryDownloadError(
                        "SourceUnavailable",
                        f"{job.file.path}: giving up after {failures} failed attempts ({error}); retry later",
                    ) from None
                log.warning(
                    "retrying file=%s offset=%d attempt=%d: %s", job.file.path, pos[0], failures, error
                )
                backoff(failures, error.retry_after, self.options.cancel)
        self._part_done(job, index)

    def _progress(self, n: int, *, peer: bool = False, wire: int | None = None) -> None:
        """`n` more bytes of files done; `wire`: the origin's bytes for them, when not `n` (Xet)."""
        with self._cond:
            self.done += n
            if peer:
                self.result.bytes_from_peers += n
            else:
                self.result.bytes_from_origin += n if wire is None else wire
        self._report()

    def count_route_bytes(self, n: int) -> None:
        """The whole-file route's bytes from the origin (Xet's xorb ranges): what it fetched, not what
        it decoded to (Result.bytes_from_xet)."""
        with self._cond:
            self.result.bytes_from_origin += n
            self.result.bytes_from_xet += n

    def _report(self) -> None:
        """Report the count as it is now; a thread that read an older count after another reported
        a newer one stays silent (two part threads once reported 306282 then 306156)."""
        if self.options.progress is None:
            return
        with self._reporting:
            done = self.done
            if done < self._reported:
                return
            self._reported = done
            self.options.progress(done, self.plan.total_bytes)

    def _part_done(self, job: FileJob, index: int) -> None:
        with job.lock:
            job.remaining -= 1
            job.unjournaled.append(index)
            last = job.remaining == 0
        if last:
            self._verify(job)
        self._checkpointer.due()

    def _verify(self, job: FileJob) -> None:
        assert job.hasher is not None
        sha256, second = job.hasher.finish()
        f = job.file
        wrong = f.mismatch(sha256, second)
        if wrong is not None:
            expected, got = wrong
            whole = job.whole  # the route's own checks passed, the plan's digest did not: ranges next
            if whole:
                assert self.route is not None
                self.route.mismatch(self, job, f"expected sha256 {f.sha256}, got {got}")
            blamed = whole or (self.peers is not None and self.peers.blame(f))  # origin only
            if job.checksum_retries >= 1 and not blamed:
                self._close_direct(job)
                with job.lock:
                    fd, job.fd = job.fd, -1
                os.close(fd)
                job.staged.unlink(missing_ok=True)
                self.journal.reset(f.path)
                raise LastingDownloadError(
                    "ChecksumMismatch",
                    f"{f.path}: expected {expected}, got {got} twice; the source serves corrupt bytes "
                    "or the listing is stale: check the repo and retry",
                )
            log.warning("checksum mismatch file=%s, fetching it again%s", f.path, " from the origin" * blamed)
            job.checksum_retries += 0 if blamed else 1
            self._start_over(job, f.size)
            self._enqueue([(job, i) for i in range(len(job.parts))])
            return
        self._close_direct(job)
        with job.lock:
            fd, job.fd = job.fd, -1
            job.unjournaled.clear()
        os.fsync(fd)
        os.close(fd)
        os.chmod(job.staged, 0o444)
        crash_point(FILE_READ_ONLY)
        add_to_blobs(self.options.blobs_dir, sha256, job.staged)
        key = None if f.sha256 else self._origin_key(f)
        if key is not None:  # verified by the origin's other digest: remember the bytes by it
            remember_origin(self.options.blobs_dir, key, sha256)
        self.sha256[f.path] = sha256
        if job.whole:  # verified after coming whole through the route (Xet)
            with self._cond:
                self.result.xet_files += 1
        if job.hasher.read_back:
            log.debug("file=%s hashed %d bytes from disk", f.path, job.hasher.read_back)
        with self._cond:
            self._verified_unjournaled.append((f.path, sha256))

    def _start_over(self, job: FileJob, counted: int) -> None:
        """Forget what `job` wrote (`counted` bytes of progress) and reopen it empty, to fetch again."""
        assert job.hasher is not None
        with self._checkpointing:  # no checkpoint journals this file's old parts after the reset
            self.journal.reset(job.file.path)
            if self.arrivals is not None:
                self.arrivals.forget(job.file.path)
            with self._cond:
                self.done -= counted
            job.hasher.discard()
            self._close_direct(job)
            with job.lock:
                os.close(job.fd)
                self._open(job, keep=False)
                job.remaining = len(job.parts)
                job.unjournaled.clear()

    def _close_direct(self, job: FileJob) -> None:
        """Every part of `job` has landed (or it starts over): count and close its O_DIRECT descriptor."""
        direct, job.direct = job.direct, None
        if direct is not None:
            with self._cond:
                self.result.bytes_written_direct += direct.bytes
            direct.close()

    def _checkpoint(self) -> None:
        """fdatasync files with newly completed parts, then journal them and the files verified since
        (on the Checkpointer's thread, and once more after the fetch threads end)."""
        with self._checkpointing:
            for job in self.jobs:
                with job.lock:  # a duplicate, so _verify may close the file while it is flushed
                    parts, job.unjournaled = job.unjournaled, []
                    fd = os.dup(job.fd) if parts and job.fd >= 0 else -1
                if fd < 0:
                    continue
                try:
                    os.fdatasync(fd)
                finally:
                    os.close(fd)
                self.journal.parts_done(job.file.path, parts)
                crash_point(PARTS_JOURNALED)
            with self._cond:
                verified, self._verified_unjournaled = self._verified_unjournaled, []
            self.journal.verified(verified)


def _split(size: int, part_size: int) -> list[tuple[int, int]]:
    if size <= part_size:
        return [(0, size)]
    return [(start, min(size, start + part_size)) for start in range(0, size, part_size)]


def _size_is(path: Path, size: int) -> bool:
    try:
        return path.stat().st_size == size
    except OSError:
        return False


def _read_only(path: Path) -> bool:
    try:
        return not path.lstat().st_mode & 0o200
    except FileNotFoundError:
        return False
