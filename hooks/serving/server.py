"""`praesto-hooks`: gunicorn serving every hook and admission endpoint.

gunicorn is embedded (BaseApplication) so the image has one entry point and
flags Kubernetes users expect; TLS is on when a certificate is given (the
admission webhooks require it). Nothing secret is ever printed: not the key
path's contents, not request bodies (access logs are off by default).

Bad input is refused in one line with exit 2 before gunicorn starts: a --bind gunicorn would read
as a host name on its default port (and retry five times), a certificate or key that is missing,
unreadable or not a pair (else a traceback from gunicorn's TLS setup), a name that does not resolve.
"""

from __future__ import annotations

import argparse
import resource
import socket
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

from flask import Flask
from gunicorn.app.base import BaseApplication
from praesto.hooks.admission.http import CONFIG_REQUIRE_CLIENT_CERT
from praesto.hooks.config import ConfigError, HooksConfig, environment
from praesto.hooks.orphans.settings import environment_problem
from praesto.hooks.serving import worker_metrics
from praesto.hooks.serving.app import create_app
from praesto.hooks.serving.whole_request_worker import (
    DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_MIN_BODY_RATE,
    DEFAULT_REQUEST_TIMEOUT,
    SMALL_BODY,
    WORKER_CONNECTIONS,
)
from praesto.hooks.serving.whole_request_worker import settings as worker_settings

from praesto.cliargs import EXIT_USAGE, CommandParser, add_version, positive_int, seconds

TLS_FILES = (("--certfile", "certfile"), ("--keyfile", "keyfile"), ("--client-ca-file", "client_ca_file"))
OTHER_FILES = 64  # a worker's descriptors besides connections: listener, poller, pipes, logs, metric files


class HooksServer(BaseApplication):  # type: ignore[misc]
    def __init__(self, app: Flask, options: dict[str, Any]):
        self.application = app
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self) -> Flask:
        return self.application


def bind_address(text: str) -> str:
    """What gunicorn binds: host:port, [v6]:port, unix:PATH or fd://N. gunicorn itself reads a bare
    word as a host name on port 8000, then fails to resolve it five times over."""
    forms = "expected host:port (e.g. 0.0.0.0:8443), [ipv6]:port, unix:PATH or fd://N"
    if text.startswith("fd://"):
        ok = text[5:].isdigit()
    elif text.startswith("unix:"):
        ok = bool(text[5:].lstrip("/"))
    else:
        host, colon, port = text.removeprefix("tcp://").rpartition(":")
        ok = bool(colon and host.strip("[]") and port.isdigit() and 0 < int(port) < 65536)
    if not ok:
        raise argparse.ArgumentTypeError(f"{forms}, got {text!r}")
    return text


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = CommandParser(
        prog="praesto-hooks", description="Serve the Praesto Metacontroller hooks and admission webhooks."
    )
    add_version(parser)
    parser.add_argument(
        "--bind",
        action="append",
        type=bind_address,
        help="address to listen on, host:port or fd://N (repeatable); default 0.0.0.0:8443 with TLS, else 0.0.0.0:8080",
    )
    parser.add_argument("--workers", type=positive_int, default=2, help="worker processes (default 2)")
    parser.add_argument("--threads", type=positive_int, default=4, help="threads per worker (default 4)")
    parser.add_argument(
        "--timeout", type=positive_int, default=30, help="worker timeout in seconds (default 30)"
    )
    parser.add_argument(
        "--max-request-bytes",
        type=positive_int,
        default=DEFAULT_MAX_REQUEST_BYTES,
        help=f"largest request body on any route; larger ones get 413 unread (default {DEFAULT_MAX_REQUEST_BYTES})",
    )
    parser.add_argument(
        "--request-timeout",
        type=seconds,
        default=DEFAULT_REQUEST_TIMEOUT,
        help="seconds a client has to complete the TLS handshake and send the whole request "
        f"(default {DEFAULT_REQUEST_TIMEOUT:g})",
    )
    parser.add_argument(
        "--max-connections-per-client",
        type=positive_int,
        default=DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
        help="incomplete connections one client address may hold in each worker; past it, its connection "
        f"silent the longest is closed with 408 (default {DEFAULT_MAX_CONNECTIONS_PER_CLIENT}, "
        f"at most {WORKER_CONNECTIONS // 4})",
    )
    parser.add_argument(
        "--min-body-rate",
        type=positive_int,
        default=DEFAULT_MIN_BODY_RATE,
        help=f"bytes/s a body over {SMALL_BODY} bytes must keep up while it holds its worker's turn; "
        f"a slower one gets 408 (default {DEFAULT_MIN_BODY_RATE})",
    )
    parser.add_argument("--certfile", help="TLS certificate (PEM); enables HTTPS together with --keyfile")
    parser.add_argument("--keyfile", help="TLS private key (PEM)")
    parser.add_argument(
        "--client-ca-file",
        help="CA bundle (PEM) of the API server's webhook client certificate: the admission endpoints "
        "then answer only clients presenting a certificate it signed (hook endpoints are unaffected)",
    )
    parser.add_argument("--access-log", action="store_true", help="log every request (off by default)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument(
        "--release-orphaned-copies",
        action="store_true",
        help="also run praesto-orphans (release ModelCacheNodes whose Node is gone, so ModelCache deletion "
        "finishes) as a child of gunicorn's master; the chart runs it as its own Deployment instead",
    )
    args = parser.parse_args(argv)
    if bool(args.certfile) != bool(args.keyfile):
        parser.error("--certfile and --keyfile must be given together")
    if args.client_ca_file and not args.certfile:
        parser.error("--client-ca-file needs HTTPS (--certfile and --keyfile)")
    if args.max_request_bytes < 1 << 20:
        parser.error("--max-request-bytes must be at least 1048576 (1 MiB): admission reviews need it")
    if not 1 <= args.request_timeout <= 60:
        parser.error("--request-timeout must be between 1 and 60 seconds")
    if args.max_connections_per_client > WORKER_CONNECTIONS // 4:
        parser.error(
            f"--max-connections-per-client must be at most {WORKER_CONNECTIONS // 4}: a quarter of a "
            f"worker's {WORKER_CONNECTIONS} connections, so that other clients keep room"
        )
    if args.min_body_rate < 64 << 10:
        parser.error("--min-body-rate must be at least 65536 (64 KiB/s)")
    return args


def open_files_for(connections: int) -> int:
    """Raise the soft open-files limit toward `connections` (the workers inherit it) and return how
    many connections a worker can hold within it. Containers often start at a soft 1024 with a
    higher hard limit (Go programs raise it themselves); an accept() past it fails with EMFILE."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections + OTHER_FILES
    if soft != resource.RLIM_INFINITY and soft < wanted:
        soft = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if soft == resource.RLIM_INFINITY:
        return connections
    return max(1, min(connections, soft - OTHER_FILES))


def gunicorn_options(args: argparse.Namespace, connections: int = WORKER_CONNECTIONS) -> dict[str, Any]:
    tls = bool(args.certfile)
    options: dict[str, Any] = {
        "bind": args.bind or ["0.0.0.0:8443" if tls else "0.0.0.0:8080"],
        "workers": args.workers,
        "threads": args.threads,
        # Handshake, head and body are read on the worker's event loop under a deadline and a
        # size limit; a pool thread only sees a complete request (hooks/serving/whole_request_worker.py).
        **worker_settings(
            args.max_request_bytes,
            args.request_timeout,
            args.max_connections_per_client,
            args.min_body_rate,
            connections,
        ),
        "timeout": args.timeout,
        "graceful_timeout": 10,
        "errorlog": "-",
        "loglevel": args.log_level,
        "accesslog": "-" if args.access_log else None,
        "proc_name": "praesto-hooks",
        # No gunicornc control socket: it would be written under $HOME (read-only in
        # the image) and two servers on one machine would fight over the path.
        "control_socket_disable": True,
    }
    if tls:
        options["certfile"] = args.certfile
        options["keyfile"] = args.keyfile
    if args.client_ca_file:
        # Optional at the TLS layer (Metacontroller calls the hooks without a certificate);
        # the admission blueprint requires a verified one (hooks/admission/http.py).
        options["ca_certs"] = args.client_ca_file
        options["cert_reqs"] = ssl.CERT_OPTIONAL
    if args.release_orphaned_copies:
        options["when_ready"] = _start_orphan_releaser
        options["on_exit"] = _stop_orphan_releaser
    return options


def startup_problem(args: argparse.Namespace) -> str | None:
    """What would fail only inside gunicorn (a traceback, or five bind retries), named with its fix."""
    for flag, dest in TLS_FILES:
        path = getattr(args, dest)
        try:
            if path:
                Path(path).read_bytes()
        except OSError as error:
            return f"{flag} {path}: {error.strerror}; give a readable PEM file (the chart mounts the hooks' TLS Secret)"
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        if args.certfile:
            context.load_cert_chain(args.certfile, args.keyfile)
    except ssl.SSLError as error:
        return (
            f"--certfile {args.certfile} / --keyfile {args.keyfile}: {error.reason or error}; give a PEM "
            "certificate and the private key it was issued for"
        )
    try:
        if args.client_ca_file:
            context.load_verify_locations(args.client_ca_file)
    except ssl.SSLError as error:
        return f"--client-ca-file {args.client_ca_file}: {error.reason or error}; give PEM CA certificates"
    return _unresolved_bind(args.bind or [])


def _unresolved_bind(binds: list[str]) -> str | None:
    """A host name that does not resolve: gunicorn would retry it five times, then exit 1."""
    for bind in binds:
        if bind.startswith(("fd://", "unix:")):
            continue
        host, _, port = bind.removeprefix("tcp://").rpartition(":")
        try:
            socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except socket.gaierror as error:
            return f"--bind {bind}: cannot resolve {host} ({error.strerror}); give an IP address, e.g. 0.0.0.0:{port}"
    return None


_releaser: list[subprocess.Popen[bytes]] = []


def _start_orphan_releaser(_server: Any) -> None:
    """praesto-orphans (`python -m praesto.hooks.orphans`, hooks/orphans/cli.py with its defaults and
    the environment, checked by `main` before gunicorn starts), started once by gunicorn's master for
    `--release-orphaned-copies`: threads in the master would be forked into workers mid-flight (locks
    held, TLS stuck). Its stdout and stderr are the master's (inherited), so its log and any refusal
    it prints land in the hooks' log. The chart runs it as its own Deployment instead.
    `-P`: the working directory is not put first on sys.path, so a `praesto/` folder there (a
    source checkout, or anything writable) cannot shadow the installed package."""
    _releaser.append(subprocess.Popen([sys.executable, "-P", "-m", "praesto.hooks.orphans"]))


def _stop_orphan_releaser(_server: Any) -> None:
    for process in _releaser:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    problem = startup_problem(args)
    if problem:
        print(f"praesto-hooks: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    try:
        config = HooksConfig.from_env()
    except ConfigError as err:
        print(f"praesto-hooks: {err}", file=sys.stderr)
        return 2
    releaser_problem = environment_problem(environment()) if args.release_orphaned_copies else None
    if releaser_problem:
        print(f"praesto-hooks: error: --release-orphaned-copies: {releaser_problem}", file=sys.stderr)
        return EXIT_USAGE
    # Before create_app builds the metrics: every worker's requests count in one /metrics.
    with worker_metrics.directory() as metrics_dir:
        app = create_app(config, metrics_dir=metrics_dir)
        app.config[CONFIG_REQUIRE_CLIENT_CERT] = bool(args.client_ca_file)
        app.config["MAX_CONTENT_LENGTH"] = args.max_request_bytes
        HooksServer(app, gunicorn_options(args, open_files_for(WORKER_CONNECTIONS))).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
