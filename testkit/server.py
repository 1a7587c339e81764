"""Run a real `praesto-hooks` (gunicorn) process for tests.

The listening socket is bound here (port 0, so the kernel picks a free port)
and handed to gunicorn as `--bind fd://N`: no race between picking a port and
the server binding it, so `pytest -n 2` is safe. Readiness is `/healthz`
answering, polled against a deadline.

    with hooks_server(tmp_path, tls=True) as server:
        requests_session.post(server.url("/hooks/modelcache/sync"), verify=server.ca_path, ...)

`post_json(server, path, body)` is a tiny stdlib client that trusts the
server's CA when TLS is on.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testkit.pki import CertificateAuthority

STARTUP_DEADLINE = 30.0
BACKLOG = 2048  # gunicorn's default `backlog` (gunicorn/config.py): the chart's praesto-hooks listens with it
STOP_DEADLINE = 15.0


@dataclass(frozen=True)
class TlsFiles:
    ca_path: Path
    cert_path: Path
    key_path: Path


@dataclass(frozen=True)
class RunningServer:
    base_url: str
    ca_path: Path | None
    process: subprocess.Popen[bytes]
    log_path: Path

    def url(self, path: str) -> str:
        return self.base_url + path

    def ssl_context(self) -> ssl.SSLContext | None:
        return ssl.create_default_context(cafile=str(self.ca_path)) if self.ca_path else None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@dataclass(frozen=True)
class CertifiedClient(RunningServer):
    """The same server, called with a client certificate (as the API server calls a webhook
    when its admission configuration names one; praesto-hooks --client-ca-file verifies it)."""

    client_cert: Path | None = None
    client_key: Path | None = None

    @classmethod
    def of(cls, server: RunningServer, cert: Path, key: Path) -> CertifiedClient:
        return cls(server.base_url, server.ca_path, server.process, server.log_path, cert, key)

    def ssl_context(self) -> ssl.SSLContext | None:
        context = super().ssl_context()
        if context is not None and self.client_cert is not None:
            context.load_cert_chain(str(self.client_cert), str(self.client_key))
        return context


def make_tls_files(directory: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> TlsFiles:
    """A throwaway CA and a server certificate for `hosts` (IPs and DNS names)."""
    ca = CertificateAuthority(directory, "ca")
    pair = ca.issue("tls", common_name=hosts[0], hosts=hosts)
    return TlsFiles(ca.cert_path, pair.cert_path, pair.key_path)


def _command() -> list[str]:
    """`praesto-hooks` of the running venv (the editable tree); the tiers pass the installed wheel's instead."""
    exe = shutil.which("praesto-hooks", path=str(Path(sys.executable).parent)) or shutil.which(
        "praesto-hooks"
    )
    return [exe] if exe else [sys.executable, "-m", "praesto.hooks.serving.server"]


def _wait_healthy(server: RunningServer, deadline: float) -> None:
    context = server.ssl_context()
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        code = server.process.poll()
        if code is not None:
            raise RuntimeError(f"praesto-hooks exited with {code} before serving:\n{server.log()}")
        try:
            with urllib.request.urlopen(server.url("/healthz"), timeout=2, context=context) as resp:
                if resp.status == 200:
                    return
        except (OSError, urllib.error.URLError) as err:
            last_error = err
        time.sleep(0.05)  # poll interval, bounded by the deadline above
    raise TimeoutError(f"praesto-hooks not healthy after {STARTUP_DEADLINE}s ({last_error}):\n{server.log()}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=STOP_DEADLINE)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=STOP_DEADLINE)


@contextmanager
def hooks_server(
    tmp_path: Path,
    *,
    tls: bool = False,
    env: Mapping[str, str] | None = None,
    workers: int = 1,
    threads: int = 2,
    extra_args: tuple[str, ...] = (),
    command: Sequence[str] | None = None,
    tls_files: TlsFiles | None = None,
) -> Iterator[RunningServer]:
    """Start `praesto-hooks` (or `command`) on a free 127.0.0.1 port; yield it healthy; stop it cleanly.
    `tls_files`: serve these (with `tls`) instead of a fresh pair."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(BACKLOG)
    port = listener.getsockname()[1]
    args = [
        *(command or _command()),
        "--bind",
        f"fd://{listener.fileno()}",
        "--workers",
        str(workers),
        "--threads",
        str(threads),
        *extra_args,
    ]
    ca_path = None
    if tls:
        files = tls_files or make_tls_files(tmp_path / "tls")
        args += ["--certfile", str(files.cert_path), "--keyfile", str(files.key_path)]
        ca_path = files.ca_path
    log_path = tmp_path / f"praesto-hooks-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            pass_fds=(listener.fileno(),),
        )
    listener.close()  # the child holds its own copy
    scheme = "https" if tls else "http"
    server = RunningServer(f"{scheme}://127.0.0.1:{port}", ca_path, process, log_path)
    try:
        _wait_healthy(server, time.monotonic() + STARTUP_DEADLINE)
        yield server
    finally:
        _stop(process)


def post_json(
    server: RunningServer, path: str, body: Any, *, raw: bytes | None = None, timeout: float = 30
) -> tuple[int, Any]:
    """POST JSON (or `raw` bytes) and return (status code, decoded JSON or text)."""
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(
        server.url(path), data=data, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=server.ssl_context()) as resp:
            status, payload = resp.status, resp.read()
    except urllib.error.HTTPError as err:
        status, payload = err.code, err.read()
    try:
        return status, json.loads(payload)
    except ValueError:
        return status, payload.decode(errors="replace")


def get_text(server: RunningServer, path: str, timeout: float = 30) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(server.url(path), timeout=timeout, context=server.ssl_context()) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


def half_client_hello() -> bytes:
    """The first half of a real TLS ClientHello: a handshake that has started and stalls."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="hooks")
    with contextlib.suppress(ssl.SSLWantReadError):  # the ClientHello is out; now it would wait
        tls.do_handshake()
    hello = outgoing.read()
    return hello[: len(hello) // 2]
