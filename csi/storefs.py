"""The CSI driver's reads and writes under `<base>/.praesto`, never through a symlink.

The driver runs as root; the node agent (uid 65532, in the base path's group)
writes the same tree. A path-based write (`open`, `touch`, `mkstemp` + `replace`
by path) follows whatever symlink the agent planted there, say
`.praesto/mounts -> /etc/cron.d`, and root would then create or delete files
anywhere on the node. So every step here goes through directory file
descriptors: each directory below the base is opened with O_NOFOLLOW relative
to its parent, the directories the driver writes into must be owned by the
driver's own uid (root in the chart), files are created O_EXCL|O_NOFOLLOW under
a fresh name and renamed into place (rename replaces a planted symlink, never
follows it), and reads open with O_NOFOLLOW.

    mounts/    driver only: owner root, 0755 (the agent reads mount records)
    used/      owner root, 2775, base path's group: the agent removes a deleted cache's stamp
    requests/  owner root, 2775, base path's group: the agent removes answered requests
    pods/      owner root, 2775, base path's group: the agent removes reported pod starts (csi/coldstart_recorder.py)
    progress/  the agent's: read only, without following symlinks

This module holds the fd-safe walk only; every directory and file name comes from
`praesto.store`, the one owner of the layout. The walk (`store_dir`, `read_json_at`,
`record_names`, `unlink_at`) is shared: the node agent reads and removes the driver's
records through it too (agent/eviction.py), so no side follows a link planted in the store.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import stat
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import grpc
from praesto.csi.volume import CsiError

from praesto import store

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
PRIVATE = store.MOUNTS
SHARED = (store.USED, store.REQUESTS, store.PODS)  # the agent may remove entries (group-writable, setgid)
_MODES = {PRIVATE: 0o755, **dict.fromkeys(SHARED, 0o2775)}


# ---- the fd-safe walk (the driver and the agent) ---------------------------------------


@contextlib.contextmanager
def store_dir(base: Path, parts: Sequence[str]) -> Iterator[int | None]:
    """fd of `base/<parts...>`, no part followed through a symlink; None when it or a part is missing.

    Raises OSError (ELOOP or ENOTDIR) when a part is a symlink or not a directory.
    """
    try:
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        yield None
        return
    try:
        for part in parts:
            try:
                child = os.open(part, _DIR, dir_fd=fd)
            except FileNotFoundError:
                yield None
                return
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def read_json_at(dir_fd: int, name: str) -> dict[str, Any] | None:
    """A JSON record in `dir_fd`, None when missing, malformed, a symlink or not a regular file."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:  # missing, or a symlink (ELOOP): not a record the driver wrote
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = json.loads(handle.read(1 << 20))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return data if isinstance(data, dict) else None


def record_names(dir_fd: int) -> list[str]:
    """The finished records in `dir_fd`, sorted (names only: nothing is opened)."""
    return sorted(n for n in os.listdir(dir_fd) if store.is_record_name(n))


def unlink_at(dir_fd: int, name: str) -> bool:
    """Remove one entry of `dir_fd` (a planted symlink goes, its target stays); False when gone already."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


class UnsafeStore(CsiError):
    """A directory the driver would write through is a symlink or not its own: refuse, say what to remove."""

    def __init__(self, path: str, cause: str) -> None:
        super().__init__(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"{path} {cause}; the CSI driver writes only into plain directories it owns, so nothing can "
            "redirect its writes; remove it on the node (the driver creates it again)",
        )


class CsiStore:
    """Mount records, last-used stamps and hydration requests, written symlink-safely."""

    _read_json = staticmethod(read_json_at)

    def __init__(self, layout: store.StoreLayout) -> None:
        self.layout = layout

    # ---- directories ---------------------------------------------------------------

    @contextlib.contextmanager
    def _dir(self, sub: str, create: bool = True) -> Iterator[int | None]:
        """fd of `<base>/.praesto/<sub>` reached without following symlinks (None if absent and not created)."""
        base = os.open(self.layout.base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            internal = self._open_child(base, store.INTERNAL_DIR, create, 0o775, str(self.layout.internal))
            if internal is None:
                yield None
                return
            try:
                fd = self._open_child(internal, sub, create, _MODES.get(sub), str(self.layout.internal / sub))
                if fd is None:
                    yield None
                    return
                try:
                    if sub in _MODES:
                        self._check_own(fd, sub, os.fstat(base).st_gid)
                    yield fd
                finally:
                    os.close(fd)
            finally:
                os.close(internal)
        finally:
            os.close(base)

    def _open_child(self, parent: int, name: str, create: bool, mode: int | None, path: str) -> int | None:
        for _ in range(2):
            try:
                return os.open(name, _DIR, dir_fd=parent)
            except FileNotFoundError:
                if not create:
                    return None
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o700, dir_fd=parent)  # tightened first, opened up below once checked
                    fd = os.open(name, _DIR, dir_fd=parent)
                    os.fchmod(fd, mode if mode is not None else 0o775)
                    os.fchown(
                        fd, -1, os.fstat(parent).st_gid
                    )  # the agent writes `.praesto` as the base's group
                    return fd
            except OSError as err:
                if err.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UnsafeStore(path, "is a symbolic link or not a directory") from None
                raise
        raise UnsafeStore(path, "keeps changing while the driver opens it")

    def _check_own(self, fd: int, sub: str, group: int) -> None:
        st = os.fstat(fd)
        path = str(self.layout.internal / sub)
        if st.st_uid != os.geteuid():
            raise UnsafeStore(path, f"is owned by uid {st.st_uid}, not by the driver (uid {os.geteuid()})")
        want = _MODES[sub]
        if stat.S_IMODE(st.st_mode) != want:
            os.fchmod(fd, want)
        if sub in SHARED and st.st_gid != group:
            os.fchown(fd, -1, group)

    # ---- files ---------------------------------------------------------------------------

    @staticmethod
    def _write(dir_fd: int, name: str, data: bytes, when: float | None = None) -> None:
        tmp = f"{store.TEMP_PREFIX}{secrets.token_hex(8)}"
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd
        )
        try:
            try:
                os.write(fd, data)
                if when is not None:
                    os.utime(fd, (when, when))
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise

    # ---- mount records --------------------------------------------------------------------

    def record_mount(self, record: store.MountRecord) -> None:
        with self._dir(PRIVATE) as fd:
            assert fd is not None
            self._write(fd, record.file_name, json.dumps(asdict(record), sort_keys=True).encode())

    def all_mounts(self) -> list[store.MountRecord]:
        with self._dir(PRIVATE, create=False) as fd:
            if fd is None:
                return []
            found = (self._record(fd, n) for n in record_names(fd))
            return [r for r in found if r is not None]

    def find_mount(self, volume_id: str) -> store.MountRecord | None:
        with self._dir(PRIVATE, create=False) as fd:
            return None if fd is None else self._record(fd, store.mount_record_name(volume_id))

    def _record(self, fd: int, name: str) -> store.MountRecord | None:
        return store.record_from(self._read_json(fd, name))

    def drop_mount(self, volume_id: str, now: float | None = None) -> store.MountRecord | None:
        """Forget a mount and stamp its cache's last use; unknown ids are fine."""
        with self._dir(PRIVATE, create=False) as fd:
            if fd is None:
                return None
            record = self._record(fd, store.mount_record_name(volume_id))
            unlink_at(fd, store.mount_record_name(volume_id))
        if record is not None:
            self.touch_used(record.namespace, record.name, now)
        return record

    # ---- last use, hydration requests, progress -------------------------------------------

    def touch_used(self, namespace: str, name: str, now: float | None = None) -> None:
        with self._dir(store.USED) as fd:
            assert fd is not None
            self._write(fd, store.used_name(namespace, name), b"", time.time() if now is None else now)

    def request_hydration(self, namespace: str, name: str, now: float | None = None) -> None:
        """Ask the agent to (re)download a cache; repeating the request is harmless."""
        file_name = store.record_name(namespace, name)
        with self._dir(store.REQUESTS) as fd:
            assert fd is not None
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISREG(os.stat(file_name, dir_fd=fd, follow_symlinks=False).st_mode):
                    return
            when = time.time() if now is None else now
            payload = {"namespace": namespace, "name": name, "requestedAt": when}
            self._write(fd, file_name, json.dumps(payload, sort_keys=True).encode())

    # ---- pod-start records (csi/coldstart_recorder.py) ------------------------------------

    def read_pod_start(self, file_name: str) -> dict[str, Any] | None:
        with self._dir(store.PODS, create=False) as fd:
            return None if fd is None else read_json_at(fd, file_name)

    def write_pod_start(self, file_name: str, payload: dict[str, Any]) -> None:
        with self._dir(store.PODS) as fd:
            assert fd is not None
            self._write(fd, file_name, json.dumps(payload, sort_keys=True).encode())

    def read_progress(self, namespace: str, name: str) -> store.Progress | None:
        with self._dir(store.PROGRESS, create=False) as fd:
            if fd is None:
                return None
            return store.progress_from(read_json_at(fd, store.record_name(namespace, name)))
