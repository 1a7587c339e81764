"""Mutating admission latency against a no-op handler on the same gunicorn.

One `praesto-hooks` gunicorn (the product's own server class and options:
TLS, 2 workers x 4 threads) serves the real app plus a bench-only no-op
route that parses the AdmissionReview and allows it. ModelCaches come from
the real kube-apiserver (`make cluster-bin`), through the fault proxy, by the real watch-fed lookups. 8 client
threads on keep-alive HTTPS connections alternate rounds between the two
endpoints with the same annotated Pod body; we print p50/p99 per endpoint and
the mutate/no-op ratios (target <= 1.5x).

Run: python -m bench.admission_bench [--requests N]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import ROUNDS, print_table, ratio
from praesto import names
from testkit.admission_objects import modelcache, mounts, pod, review_body
from testkit.kube_real import proxied, running_plane
from testkit.server import make_tls_files

THREADS = 8
MUTATE = "/admission/mutate-pod"
NOOP = "/bench/noop"


def serve(fd: int, cert: str, key: str) -> None:
    """Child process: the product app plus the no-op route, under the product's gunicorn options."""
    from flask import Response, request
    from praesto.hooks.admission import review
    from praesto.hooks.serving.app import create_app, json_response
    from praesto.hooks.serving.server import HooksServer, gunicorn_options, parse_args

    app = create_app()

    @app.post(NOOP)
    def noop() -> Response:
        body = request.get_json(silent=True) or {}
        return json_response(review.allow(str(body.get("request", {}).get("uid", ""))))

    options = gunicorn_options(parse_args(["--bind", f"fd://{fd}", "--certfile", cert, "--keyfile", key]))
    options["errorlog"] = os.devnull
    HooksServer(app, options).run()


def _connection(port: int, context: ssl.SSLContext) -> http.client.HTTPSConnection:
    return http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30)


def _post(conn: http.client.HTTPSConnection, path: str, body: bytes) -> dict[str, Any]:
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    payload = response.read()
    if response.status != 200:
        raise RuntimeError(f"{path}: HTTP {response.status}: {payload[:200]!r}")
    answer = json.loads(payload)
    assert isinstance(answer, dict)
    return answer


def _round(port: int, context: ssl.SSLContext, path: str, body: bytes, count: int) -> list[float]:
    """THREADS clients, each `count` sequential requests on its own keep-alive connection."""
    latencies: list[list[float]] = [[] for _ in range(THREADS)]
    start = threading.Barrier(THREADS)

    def client(index: int) -> None:
        conn = _connection(port, context)
        _post(conn, path, body)  # connect + TLS handshake outside the timing
        start.wait()
        for _ in range(count):
            began = time.perf_counter()
            _post(conn, path, body)
            latencies[index].append(time.perf_counter() - began)
        conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [x for per_thread in latencies for x in per_thread]


def _quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q * 100) - 1]


def _wait_ready(port: int, context: ssl.SSLContext, body: bytes, process: subprocess.Popen[bytes]) -> None:
    """Until every worker has loaded its lookups: 40 patched answers in a row, polled with a deadline."""
    deadline = time.monotonic() + 60
    streak = 0
    while streak < 40:
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("praesto-hooks did not become ready")
        try:
            conn = _connection(port, context)
            answer = _post(conn, MUTATE, body)
            conn.close()
        except OSError:
            time.sleep(0.05)
            continue
        streak = streak + 1 if "patch" in answer["response"] else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.admission_bench")
    parser.add_argument("--requests", type=int, default=150, help="requests per client thread per round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per endpoint")
    parser.add_argument("--serve", nargs=3, metavar=("FD", "CERT", "KEY"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(int(args.serve[0]), args.serve[1], args.serve[2])
        return 0

    obj = pod(mounts(("llama", "/models/llama"), ("shared", "/models/shared")))
    body = json.dumps(review_body(obj)).encode()
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_plane(Path(tmp) / "kube-plane") as plane,
        proxied(plane) as api,
    ):
        api.create(modelcache("llama", names.PHASE_READY), with_status=True)
        api.create(modelcache("shared", names.PHASE_READY, pvc=True), with_status=True)
        for i in range(500):  # a realistic cluster: the lookup serves many caches
            api.create(
                modelcache(f"other-{i}", names.PHASE_READY, namespace=f"ns-{i % 50}"), with_status=True
            )
        tls = make_tls_files(Path(tmp) / "tls")
        kubeconfig = Path(tmp) / "kubeconfig"
        kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "e", "cluster": {"server": api.url}}],
                    "users": [{"name": "u", "user": {}}],
                    "contexts": [{"name": "c", "context": {"cluster": "e", "user": "u"}}],
                    "current-context": "c",
                }
            )
        )
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(256)
        port = listener.getsockname()[1]
        command = [sys.executable, "-m", "bench.admission_bench", "--serve"]
        command += [str(listener.fileno()), str(tls.cert_path), str(tls.key_path)]
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PRAESTO_IMAGE": "ghcr.io/praesto/praesto:bench"}
        process = subprocess.Popen(command, env=env, pass_fds=(listener.fileno(),))
        listener.close()
        context = ssl.create_default_context(cafile=str(tls.ca_path))
        try:
            _wait_ready(port, context, body, process)
            results: dict[str, list[float]] = {MUTATE: [], NOOP: []}
            p50s: dict[str, list[float]] = {MUTATE: [], NOOP: []}
            for _ in range(max(ROUNDS, args.rounds)):
                for path in (NOOP, MUTATE):
                    latencies = _round(port, context, path, body, args.requests)
                    results[path] += latencies
                    p50s[path].append(statistics.median(latencies))
        finally:
            process.terminate()
            process.wait(timeout=30)

    print(
        f"mutating admission vs no-op, {THREADS} threads x {args.requests} requests x {args.rounds} rounds,"
    )
    print("same gunicorn (praesto-hooks defaults: 2 workers x 4 threads, TLS, keep-alive)")
    stats = {}
    for path, values in results.items():
        stats[path] = (_quantile(values, 0.50), _quantile(values, 0.99))
        print(
            f"  {path:24s} n={len(values):5d}  p50 {stats[path][0] * 1e3:7.2f} ms  p99 {stats[path][1] * 1e3:7.2f} ms"
        )
    print(
        f"  ratio p50 {stats[MUTATE][0] / stats[NOOP][0]:.2f}x   p99 {stats[MUTATE][1] / stats[NOOP][1]:.2f}x   (target <= 1.5x)"
    )
    print_table(
        "Pod admission latency, /admission/mutate-pod (a Pod asking for a model) vs a no-op handler on the "
        "same praesto-hooks gunicorn: p50 of each round",
        p50s,
        scale=1e3,
        unit="ms",
    )
    print(f"  ratio of medians of the per-round p50s: {ratio(p50s[MUTATE], p50s[NOOP]):.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
