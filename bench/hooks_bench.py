"""Sync hook cost at scale, and the gunicorn server's request rate.

1. One local-mode ModelCache selecting 2,000 Nodes with 2,000 existing
   ModelCacheNodes: the pure sync hook's time as a ratio to json.loads +
   json.dumps of the same request, measured in the same run (target <= 2x).
2. Requests/s of a real `praesto-hooks` (gunicorn) for a 10-node sync request,
   from a few client threads over keep-alive-less HTTP on 127.0.0.1.

Run: python -m bench.hooks_bench
"""

from __future__ import annotations

import http.client
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from praesto.hooks.config import HooksConfig
from praesto.hooks.modelcache import sync

from tests.hooks.factory import NOW, cache_node, mcn, modelcache, node_status, sync_request
from tests.support.server import hooks_server

SIZE = 4_400_000_000


def big_request(count: int) -> dict[str, Any]:
    nodes = [cache_node(f"node-{i:05d}") for i in range(count)]
    children = [
        mcn("tinyllama", f"node-{i:05d}", node_status("Downloading", i * 1_000_000, SIZE, sizeBytes=SIZE))
        for i in range(count)
    ]
    return sync_request(modelcache("tinyllama"), nodes=nodes, children=children)


def best_of(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def bench_sync(count: int = 2000, repeat: int = 15) -> None:
    config = HooksConfig()
    request = big_request(count)
    body = json.dumps(request)
    baseline = best_of(lambda: json.dumps(json.loads(body)), repeat)
    parsed = json.loads(body)
    hook = best_of(lambda: sync(parsed, config, NOW), repeat)
    response = sync(parsed, config, NOW)
    assert len(response["children"]) == count
    full = best_of(lambda: json.dumps(sync(json.loads(body), config, NOW)), repeat)
    print(f"sync, {count} nodes + {count} children, request {len(body) / 1e6:.1f} MB (best of {repeat})")
    print(f"  json.loads+json.dumps of the request: {baseline * 1e3:8.1f} ms")
    print(
        f"  sync hook (pure function):            {hook * 1e3:8.1f} ms  ratio {hook / baseline:.2f}x (target <= 2x)"
    )
    print(f"  loads + sync + dumps(response):       {full * 1e3:8.1f} ms  ratio {full / baseline:.2f}x")


def bench_server(seconds: float = 5.0, clients: int = 4, workers: int = 2, threads: int = 4) -> None:
    body = json.dumps(big_request(10)).encode()
    done: list[float] = []
    lock = threading.Lock()
    with (
        tempfile.TemporaryDirectory() as tmp,
        hooks_server(Path(tmp), workers=workers, threads=threads) as server,
    ):
        host, port = server.base_url.removeprefix("http://").split(":")

        def client() -> None:
            deadline = time.monotonic() + seconds
            conn = http.client.HTTPConnection(host, int(port), timeout=10)
            local = []
            while time.monotonic() < deadline:
                started = time.perf_counter()
                conn.request("POST", "/hooks/modelcache/sync", body, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                resp.read()
                assert resp.status == 200
                local.append(time.perf_counter() - started)
            conn.close()
            with lock:
                done.extend(local)

        threads_ = [threading.Thread(target=client) for _ in range(clients)]
        started = time.perf_counter()
        for t in threads_:
            t.start()
        for t in threads_:
            t.join()
        elapsed = time.perf_counter() - started
    print(
        f"praesto-hooks (gunicorn {workers} workers x {threads} threads), 10-node sync, {clients} clients: "
        f"{len(done) / elapsed:.0f} req/s, median {statistics.median(done) * 1e3:.1f} ms, "
        f"p99 {sorted(done)[int(len(done) * 0.99)] * 1e3:.1f} ms"
    )


def main() -> None:
    bench_sync()
    bench_server()


if __name__ == "__main__":
    main()
