"""One node agent per base path: an exclusive `flock` held for the agent's life.

Two agents on one store (a second DaemonSet, a second release, a hand-run agent)
would each sweep the other's copies as unowned, resume each other's staging and
evict under each other's feet. The lock lives in `<base>/.praesto/agent.lock`
and holds the owner's pid so the refusal can name it; the kernel drops the lock
when the process dies, so a crash never leaves the store locked.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path

from praesto.store import StoreLayout


class BasePathInUse(Exception):
    """Another agent holds the base path; the message names the path, the holder and the fix."""


def lock_path(layout: StoreLayout) -> Path:
    """Where the lock lives: the layout's owner names it (praesto/store.py `LOCK_FILE`)."""
    return layout.lock_file


def _holder(fd: int) -> str:
    with contextlib.suppress(OSError, ValueError):
        text = os.pread(fd, 32, 0).decode().strip()
        if text.isdigit():
            return f"pid {int(text)}"
    return "pid unknown"


def acquire(layout: StoreLayout) -> int:
    """Lock the store for this process; the returned fd keeps it (close it, or exit, to release)."""
    path = lock_path(layout)
    path.parent.mkdir(exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        holder = _holder(fd)
        os.close(fd)
        if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise
        raise BasePathInUse(
            f"base path {layout.base} is in use by another praesto node agent ({holder}, lock {path}); "
            "two agents on one store would remove each other's copies; stop the other agent, or give "
            "each its own --base-path (chart localCache.basePath)"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def release(fd: int) -> None:
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
