"""Publish and unpublish cache directories at the kubelet's target paths.

Each operation: validate (already done by praesto.csi.volume) -> look at the
current state (mount table, mount records) -> act -> record. Every step is
safe to repeat, because the kubelet retries until it gets OK. Operations on
one target path are serialised; different targets run in parallel.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator

import grpc
from praesto.csi import mounts, storefs
from praesto.csi.coldstart_recorder import PodStartRecorder
from praesto.csi.recovery import CacheLocator, Recovery, rebuild_records, revision_at
from praesto.csi.storefs import CsiStore
from praesto.csi.volume import CsiError, PublishRequest
from praesto.csi.waiting import waiting_answer

from praesto import names, store

log = logging.getLogger(__name__)


class TargetLocks:
    """One lock per target path, forgotten when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, tuple[threading.Lock, int]] = {}

    @contextlib.contextmanager
    def hold(self, key: str) -> Iterator[None]:
        with self._guard:
            lock, users = self._locks.get(key, (threading.Lock(), 0))
            self._locks[key] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                lock, users = self._locks[key]
                if users == 1:
                    del self._locks[key]
                else:
                    self._locks[key] = (lock, users - 1)


class Publisher:
    def __init__(
        self,
        layout: store.StoreLayout,
        node_name: str,
        unassigned_after: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        mountinfo: os.PathLike[str] | str = mounts.MOUNTINFO,
    ) -> None:
        self.layout = layout
        self.fs = CsiStore(layout)  # every write under <base>/.praesto: through dir fds, no symlink followed
        self.pod_starts = PodStartRecorder(self.fs)  # cold-start accounting (issue #15)
        self.node_name = node_name
        self.unassigned_after = unassigned_after
        self._clock = clock
        self._mountinfo = mountinfo
        self._locks = TargetLocks()
        self._asked: dict[tuple[str, str], float] = {}  # when we first asked the agent
        self._asked_guard = threading.Lock()

    # ---- state ---------------------------------------------------------------

    def _entries(self) -> list[mounts.MountInfo]:
        with open(self._mountinfo) as handle:
            return mounts.parse_mountinfo(handle.read())

    def _locator(self, entries: list[mounts.MountInfo]) -> CacheLocator:
        locator = CacheLocator.of(entries, str(self.layout.base))
        if locator is None:
            raise CsiError(grpc.StatusCode.INTERNAL, f"base path {self.layout.base} is in no mount")
        return locator

    def _record_at(self, target: str) -> store.MountRecord | None:
        return next((r for r in self.fs.all_mounts() if r.target_path == target), None)

    def recover(self) -> Recovery:
        """Settle mount records against the mount table (call before serving)."""
        result = rebuild_records(self.fs, self._entries())
        for record in result.adopted:
            log.warning(
                "adopted unrecorded mount of %s/%s at %s", record.namespace, record.name, record.target_path
            )
        for record in result.dropped:
            log.info(
                "dropped record of gone mount %s/%s at %s", record.namespace, record.name, record.target_path
            )
        return result

    # ---- publish ---------------------------------------------------------------

    def publish(self, req: PublishRequest) -> None:
        started = time.time()
        base = os.path.realpath(self.layout.base)
        if mounts.is_within(req.target_path, base) or mounts.is_within(
            req.target_path, str(self.layout.base)
        ):
            raise CsiError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"target_path: {req.target_path!r} is inside the model store {self.layout.base}; "
                "publish to the kubelet's pod volume directory",
            )
        with self._locks.hold(req.target_path):
            entries = self._entries()
            locator = self._locator(entries)
            if self._already_published(req, entries, locator):
                return
            with self._open_cache(req) as fd:
                if not self.layout.is_complete(req.namespace, req.name):
                    raise self._not_ready(req)
                # Record first: the agent never evicts a cache with a record, so
                # it cannot pull the directory away while we mount it. The record names the
                # commit this fd holds: a revision switch may rename it into `retired` now,
                # and the agent keeps a retired copy while a record names its commit.
                self.fs.record_mount(
                    store.MountRecord(
                        req.volume_id, req.namespace, req.name, req.target_path, time.time(), revision_at(fd)
                    ),
                )
                # ...and look again: the agent takes the marker away before it checks the
                # records, so a removal that began before our record is visible here.
                if not self.layout.is_complete(req.namespace, req.name):
                    self.fs.drop_mount(req.volume_id)
                    raise self._not_ready(req)
                try:
                    self._mount(req, fd)
                except BaseException:
                    self.fs.drop_mount(req.volume_id)
                    raise
            with self._asked_guard:
                self._asked.pop((req.namespace, req.name), None)
            self.pod_starts.mounted(req, started)
            log.info("published %s/%s at %s", req.namespace, req.name, req.target_path)

    def _already_published(
        self, req: PublishRequest, entries: list[mounts.MountInfo], locator: CacheLocator
    ) -> bool:
        """True when the target already shows this cache read-only (idempotent retry)."""
        stacked = mounts.mounts_at(entries, req.target_path)
        at_target = self._record_at(req.target_path)
        if not stacked:
            if at_target is not None:  # a record whose mount is gone
                self.fs.drop_mount(at_target.volume_id)
            same_id = self.fs.find_mount(req.volume_id)
            if same_id is not None and same_id.target_path != req.target_path:
                if mounts.mounts_at(entries, same_id.target_path):
                    raise CsiError(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"volume_id: {req.volume_id!r} is already published at {same_id.target_path!r} on "
                        f"node {self.node_name}; {names.CSI_DRIVER_NAME} publishes an ephemeral volume once",
                    )
                self.fs.drop_mount(same_id.volume_id)
            return False
        shown = locator.cache_of(stacked[-1])
        other_volume = at_target is not None and at_target.volume_id != req.volume_id
        if other_volume or shown != (req.namespace, req.name):
            what = (
                f"volume {at_target.volume_id!r}"
                if at_target is not None and other_volume
                else "another mount"
            )
            raise CsiError(
                grpc.StatusCode.ALREADY_EXISTS,
                f"target_path: {req.target_path!r} already holds {what}; a target path serves one volume, "
                "unpublish it first",
            )
        if not stacked[-1].read_only:  # a crash between bind and remount: finish the job
            mounts.mount(
                "none",
                req.target_path,
                mounts.MS_REMOUNT | mounts.MS_BIND | mounts.MS_RDONLY | mounts.MS_NOSUID | mounts.MS_NODEV,
            )
        if at_target is None:
            revision = locator.revision_of(stacked[-1])
            self.fs.record_mount(
                store.MountRecord(
                    req.volume_id, req.namespace, req.name, req.target_path, time.time(), revision
                ),
            )
        return True

    @contextlib.contextmanager
    def _open_cache(self, req: PublishRequest) -> Iterator[int]:
        """fd of `<base>/<ns>/<name>` (storefs' walk), refusing symlinks at either level.

        A symlink there (e.g. `<base>/team-a/llm -> ../team-b/llm`) would show
        another namespace's cache or any host directory. The agent never
        creates one, so it means tampering: PERMISSION_DENIED, not
        INVALID_ARGUMENT, because the request is fine and the Pod author
        cannot fix it; the store must be repaired.
        """
        with contextlib.ExitStack() as stack:
            try:
                fd = stack.enter_context(storefs.store_dir(self.layout.base, (req.namespace, req.name)))
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                cache_dir = self.layout.cache_dir(req.namespace, req.name)
                raise CsiError(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"model cache {req.namespace}/{req.name}: {cache_dir} is not a plain directory inside "
                    f"{self.layout.base} ({exc.strerror}); refusing to mount it, remove it so the node agent "
                    "can download the cache again",
                ) from exc
            if fd is None:
                raise self._not_ready(req)
            yield fd

    def _mount(self, req: PublishRequest, fd: int) -> None:
        # the marker must still be there *after* our record, else it was evicted meanwhile
        try:
            os.stat(names.COMPLETE_FILE, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            raise self._not_ready(req) from None
        os.makedirs(req.target_path, mode=0o750, exist_ok=True)
        mounts.bind_read_only(f"/proc/self/fd/{fd}", req.target_path)

    def _not_ready(self, req: PublishRequest) -> CsiError:
        self.fs.request_hydration(req.namespace, req.name)
        self.pod_starts.waiting(req, time.time())
        key = (req.namespace, req.name)
        now = self._clock()
        with self._asked_guard:
            first = self._asked.setdefault(key, now)
        progress = self.fs.read_progress(req.namespace, req.name)
        answer = waiting_answer(
            req.namespace, req.name, self.node_name, progress, now - first, self.unassigned_after
        )
        return CsiError(answer.code, answer.message)

    # ---- unpublish ---------------------------------------------------------

    def unpublish(self, volume_id: str, target: str) -> None:
        with self._locks.hold(target):
            for _ in mounts.mounts_at(self._entries(), target):
                try:
                    mounts.unmount(target)
                except OSError as exc:
                    if exc.errno == errno.EINVAL:  # not a mount point any more
                        break
                    if exc.errno != errno.EBUSY:
                        raise
                    # the Pod is gone when the kubelet unpublishes; detach what lingers
                    mounts.unmount(target, mounts.MNT_DETACH)
            try:
                os.rmdir(target)
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno == errno.ENOTEMPTY:
                    raise CsiError(
                        grpc.StatusCode.INTERNAL,
                        f"target_path: {target!r} still holds files after unmounting; they are not from the "
                        "model cache, remove them and the kubelet's retry will finish",
                    ) from exc
                raise
            record = self.fs.find_mount(volume_id)
            if record is None or record.target_path != target:
                record = self._record_at(target)  # adopted after a restart under a stand-in id
            if record is not None:
                self.fs.drop_mount(record.volume_id)
                log.info("unpublished %s/%s from %s", record.namespace, record.name, target)
