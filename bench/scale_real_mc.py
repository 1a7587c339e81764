"""The real Metacontroller in place of the stand-in, for the scale tier (`--metacontroller BINARY`).

Why: the stand-in (testkit/metacontroller.py) is one Python process. At 10,000 children its
ModelCacheNode informer fell ten minutes behind the API server (docs/scale.md), so the shapes
past that measure the stand-in, not the product. Metacontroller itself is Go, with client-go's
informers and work queues.

Not part of CI: Metacontroller's module path is `metacontroller`, which no module proxy serves,
so the binary is built from a checkout of its v4.17.2 tag (docs/scale.md says how).

What differs from the stand-in, and only where this bench needs it:

* It runs as the chart's Metacontroller ServiceAccount with the chart's container args and
  environment (`rendered_command_args`, `rendered_env`: GOMEMLIMIT), plus what a Pod would have given it (`OUT_OF_CLUSTER`).
* The controllers the chart installed are patched to call a recording TLS forwarder in front of
  praesto-hooks (a Service needs kube-proxy): it counts each hook call's path, request bytes and
  seconds, as the stand-in's observer does, and forwards the body unchanged.
* Passes are counted per hook path (Metacontroller keeps no per-pass log); its writes are read
  from the API server's own counters, as for the stand-in.
"""

from __future__ import annotations

import http.client
import ssl
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.common import rss_mib
from bench.scale_standin import Stats
from testkit.helm_chart import NAMESPACE
from testkit.kube_apply import Kube
from testkit.ports import free_port
from testkit.server import make_tls_files

Obj = dict[str, Any]
CONTROLLER_KINDS = ("CompositeController", "DecoratorController")
CONTROLLER_API = "metacontroller.k8s.io/v1alpha1"
# What a Pod gives Metacontroller that a process here must be told: local ports, and the namespace it
# runs in (in a Pod, controller-runtime reads it from the ServiceAccount mount for the leader Lease).
OUT_OF_CLUSTER = ("--health-probe-bind-address=127.0.0.1:0", f"--leader-election-namespace={NAMESPACE}")
HEAP_METRIC = "go_memstats_heap_inuse_bytes"  # Go's live heap and its fragments: what GOMEMLIMIT bounds
HOOK_TIMEOUT = 60.0  # the forwarder's own wait on praesto-hooks; Metacontroller keeps its `timeout`


class Forwarder:
    """A TLS server on 127.0.0.1 that sends each POST on to praesto-hooks and keeps (path, bytes, s)."""

    def __init__(self, workdir: Path, hooks_url: str, hooks_ca: Path) -> None:
        self.tls = make_tls_files(workdir / "forwarder-tls")
        target = urlsplit(hooks_url)
        upstream = ssl.create_default_context(cafile=str(hooks_ca))
        self.lock = threading.Lock()
        self.calls: list[tuple[str, int, float]] = []
        self.failed: list[tuple[str, int, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                started = time.monotonic()
                try:
                    connection = http.client.HTTPSConnection(
                        str(target.hostname), target.port, context=upstream, timeout=HOOK_TIMEOUT
                    )
                    connection.request("POST", self.path, body, {"Content-Type": "application/json"})
                    answer = connection.getresponse()
                    status, data = answer.status, answer.read()
                    connection.close()
                except OSError as error:
                    with outer.lock:
                        outer.failed.append((self.path, len(body), f"{type(error).__name__}: {error}"))
                    self.send_error(502)
                    return
                with outer.lock:
                    if status == 200:
                        outer.calls.append((self.path, len(body), time.monotonic() - started))
                    else:
                        outer.failed.append((self.path, len(body), f"HTTP {status}: {data[:200]!r}"))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(self.tls.cert_path), str(self.tls.key_path))
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"

    def drain(self) -> tuple[list[tuple[str, int, float]], list[tuple[str, int, str]]]:
        with self.lock:
            calls, failed = list(self.calls), list(self.failed)
            self.calls.clear()
            self.failed.clear()
        return calls, failed


def point_hooks_at(controller: Obj, url: str, ca_pem: str) -> Obj:
    """The controller with every hook's webhook calling `url` + its path, trusting `ca_pem`."""
    for hook in (controller.get("spec") or {}).get("hooks", {}).values():
        webhook = hook.get("webhook") if isinstance(hook, dict) else None
        if isinstance(webhook, dict) and webhook.get("url"):
            webhook["url"] = url + urlsplit(webhook["url"]).path
            webhook["caBundle"] = {"inline": ca_pem}
    return controller


class RealMetacontroller:
    """`with RealMetacontroller(...) as mc:` Metacontroller runs until the block ends; `stats()` as StandIn."""

    def __init__(self, binary: Path, kubeconfig: Path, admin: Kube, hooks_url: str, hooks_ca: Path,
                 args: list[str], env: dict[str, str], workdir: Path) -> None:  # fmt: skip
        self.binary, self.kubeconfig, self.admin, self.args, self.env = binary, kubeconfig, admin, args, env
        workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / "metacontroller.log"
        self.forwarder = Forwarder(workdir, hooks_url, hooks_ca)
        self.process: subprocess.Popen[bytes] | None = None
        self.log_offset = 0
        self.metrics_port = free_port()
        self.peak_heap_mib = 0.0

    def __enter__(self) -> RealMetacontroller:
        threading.Thread(
            target=self.forwarder.server.serve_forever, name="hook-forwarder", daemon=True
        ).start()
        ca_pem = self.forwarder.tls.ca_path.read_text()
        for kind in CONTROLLER_KINDS:
            for item in self.admin.resource(CONTROLLER_API, kind).get().to_dict()["items"]:
                for key in ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"):
                    item["metadata"].pop(key, None)
                self.admin.apply(point_hooks_at(item, self.forwarder.url, ca_pem))
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [str(self.binary), *self.args, *OUT_OF_CLUSTER, f"--metrics-address=127.0.0.1:{self.metrics_port}"],
                stdout=log, stderr=subprocess.STDOUT, env={**self.env, "KUBECONFIG": str(self.kubeconfig)},
            )  # fmt: skip
        return self

    def stats(self) -> Stats:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"Metacontroller exited with {self.process.returncode}: {self.log_tail()}")
        stats = Stats()
        stats.calls, stats.failed = self.forwarder.drain()
        for path, _, _ in stats.calls:
            stats.passes[path] = stats.passes.get(path, 0) + 1
        stats.peak_rss_mib = rss_mib(self.process.pid)[1]
        self.peak_heap_mib = max(self.peak_heap_mib, self.heap_mib())
        stats.errors = self.new_errors()
        return stats

    def heap_mib(self) -> float:
        """Go's heap in use now, from Metacontroller's own /metrics (0 while it does not answer)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as answer:
                text = answer.read().decode()
        except OSError:
            return 0.0
        for line in text.splitlines():
            if line.startswith(HEAP_METRIC + " "):
                return float(line.split()[1]) / 2**20
        return 0.0

    def new_errors(self, keep: int = 5) -> list[str]:
        """Error lines Metacontroller logged since the last call (its zap JSON, cut to 300 characters),
        read from where the last call stopped: at --zap-log-level=4 the log grows by megabytes a minute."""
        with self.log_path.open("rb") as log:
            log.seek(self.log_offset)
            fresh = log.read()
        complete = fresh.rfind(b"\n") + 1  # a line still being written is read next time
        self.log_offset += complete
        lines = fresh[:complete].decode(errors="replace").splitlines()
        return [line[:300] for line in lines if '"level":"error"' in line][-keep:]

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def __exit__(self, *_: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.forwarder.server.shutdown()
