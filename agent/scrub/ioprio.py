"""Idle I/O priority for the scrubbing thread, through the ioprio_set syscall (no Python wrapper exists).

With IOPRIO_CLASS_IDLE the kernel's I/O scheduler (BFQ; mq-deadline and none ignore classes) serves the
scrub's reads only when no other process wants the disk. Where the syscall is refused (seccomp
ENOSYS/EPERM, a non-Linux kernel, an architecture without a known number) the scrub runs at the
normal priority, still within its bytes-per-second budget: `set_idle` returns why, and the agent
logs it once. ioprio is per thread on Linux, so only the scrubbing thread is affected.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

IOPRIO_CLASS_SHIFT = 13
IOPRIO_CLASS_IDLE = 3
IOPRIO_WHO_PROCESS = 1  # with who=0: the calling thread
SYSCALL_NUMBERS = {"x86_64": 251, "aarch64": 30, "arm64": 30, "ppc64le": 273, "s390x": 282}
SYSCALL_IOPRIO_GET = {"x86_64": 252, "aarch64": 31, "arm64": 31, "ppc64le": 274, "s390x": 283}


def idle_value() -> int:
    return IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT


def set_idle() -> str | None:
    """Put the calling thread in the idle I/O class; None on success, else why it was refused."""
    number = SYSCALL_NUMBERS.get(platform.machine())
    if number is None:
        return f"ioprio_set: no syscall number known for {platform.machine()}"
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    except OSError as err:
        return f"ioprio_set: no libc ({err})"
    if libc.syscall(number, IOPRIO_WHO_PROCESS, 0, idle_value()) != 0:
        errno = ctypes.get_errno()
        return f"ioprio_set refused: {os.strerror(errno)}"
    return None


def current() -> int | None:
    """The calling thread's I/O priority value (class << 13 | data), None where it cannot be read."""
    number = SYSCALL_IOPRIO_GET.get(platform.machine())
    if number is None:
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    value = int(libc.syscall(number, IOPRIO_WHO_PROCESS, 0))
    return None if value < 0 else value
