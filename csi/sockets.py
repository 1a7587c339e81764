"""Unix socket endpoints the plugin serves: parsing, stale files, binding."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import stat

import grpc

log = logging.getLogger(__name__)


class EndpointError(ValueError):
    pass


def socket_path(endpoint: str, flag: str = "--endpoint") -> str:
    """`unix:///csi/csi.sock`, `unix:/csi/csi.sock` or a bare absolute path -> the path.

    flag names the command-line flag the value came from, for the error message.
    """
    path = endpoint
    if endpoint.startswith("unix://"):
        path = endpoint[len("unix://") :]
    elif endpoint.startswith("unix:"):
        path = endpoint[len("unix:") :]
    if not path.startswith("/"):
        raise EndpointError(
            f"{flag}: {endpoint!r} is not a unix socket endpoint; use unix:///csi/csi.sock (an absolute path)"
        )
    if len(path.encode()) > 107:
        raise EndpointError(f"{flag}: {path!r} is longer than a unix socket path may be (107 bytes)")
    return path


def remove_stale_socket(path: str, flag: str = "--endpoint") -> None:
    """Remove a socket left by a dead driver; refuse if one still answers or the path is no socket.

    The kubelet's plugin watcher recreates nothing: after a crash the old
    socket file stays and bind() would fail with EADDRINUSE.
    """
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise EndpointError(f"{flag}: {path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise
    else:
        raise EndpointError(f"{flag}: another process is serving on {path}; stop it first")
    finally:
        probe.close()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    log.info("removed stale socket %s", path)


def listen_unix(server: grpc.Server, path: str, flag: str = "--endpoint") -> None:
    """Bind server to the unix socket at path (call remove_stale_socket first)."""
    if server.add_insecure_port(f"unix://{path}") == 0:
        raise EndpointError(f"{flag}: cannot listen on {path}")
