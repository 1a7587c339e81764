"""The server TLS context of a `praesto-hooks` worker, rebuilt only when its files change."""

from __future__ import annotations

import os
import ssl
from typing import Any

from gunicorn import sock as gsock


class TlsContexts:
    """One server context per set of certificate, key and CA files. gunicorn builds one per
    connection (`gunicorn/sock.py` `ssl_context`: it loads the system CAs, ~5 ms), which a flood
    of connections turns into seconds of the event loop; a renewed file (the kubelet swaps a
    Secret volume's `..data` link: a new inode) still reaches the next handshake."""

    def __init__(self, socket_class: type[ssl.SSLSocket]) -> None:
        self.socket_class = socket_class
        self.files: tuple[tuple[int, int, int, int] | None, ...] = ()
        self.context: ssl.SSLContext | None = None

    def get(self, cfg: Any) -> ssl.SSLContext:
        files = tuple(_identity(path) for path in (cfg.certfile, cfg.keyfile, cfg.ca_certs))
        if self.context is None or files != self.files:
            context = gsock.ssl_context(cfg)
            context.sslsocket_class = self.socket_class
            self.files, self.context = files, context
        return self.context


def _identity(path: str | None) -> tuple[int, int, int, int] | None:
    if not path:
        return None
    info = os.stat(path)
    return info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size
