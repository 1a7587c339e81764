"""The Metacontroller stand-in in its own process, so its memory is its own, reporting what it did.

The child authenticates with the chart's Metacontroller ServiceAccount (a kubeconfig),
runs both controllers at the chart's flags (client rate limit, workers, resync), and
answers `stats()` with what happened since the last call: passes per controller and
hook, failed passes (first errors), every hook call's path, request bytes and seconds,
and its peak RSS. The pass log is drained every call, so a long run keeps no history.
"""

from __future__ import annotations

import json
import multiprocessing
import threading
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

Obj = dict[str, Any]


@dataclass
class Stats:
    passes: dict[str, int] = field(default_factory=dict)  # "composite sync" -> count
    writes: dict[str, int] = field(default_factory=dict)  # "composite create ModelCacheNode" -> count
    errors: list[str] = field(default_factory=list)
    calls: list[tuple[str, int, float]] = field(default_factory=list)  # (path, request bytes, seconds)
    failed: list[tuple[str, int, str]] = field(
        default_factory=list
    )  # (path, request bytes, why) per failed call
    peak_rss_mib: float = 0.0
    limiter_wait_s: float = 0.0  # seconds callers waited on the client rate limiter, all time
    limiter_requests: int = 0
    # since the last call, sampled each second: per informer kind the most watch events not yet in
    # its cache and the oldest one's age (s); per controller the deepest work queue
    backlog: dict[str, tuple[int, float]] = field(default_factory=dict)
    queue_depth: dict[str, int] = field(default_factory=dict)


def _serve(conn: Connection, kubeconfig: str, hooks_url: str, ca_path: str, composite: Obj,
           decorator: Obj, args: list[str]) -> None:  # fmt: skip
    from kubernetes import config

    from bench.common import rss_mib
    from testkit.client_rate_limit import MetacontrollerFlags
    from testkit.kube_apply import Kube
    from testkit.metacontroller import HookClient, Metacontroller

    calls: list[tuple[str, int, float]] = []
    failed: list[tuple[str, int, str]] = []

    class ObservedHooks(HookClient):
        """The stand-in's hook client, which also keeps each failed call: where a size limit bites."""

        def call(self, webhook: Obj, body: Obj, allowed: frozenset[str]) -> Obj:
            try:
                return super().call(webhook, body, allowed)
            except Exception as error:
                why = f"{type(error).__name__}: {str(error)[:200]}"
                failed.append((urlsplit(webhook["url"]).path, len(json.dumps(body).encode()), why))
                raise

    hooks = ObservedHooks(hooks_url, Path(ca_path), observer=lambda *call: calls.append(call))
    kube = Kube(config.new_client_from_config(config_file=kubeconfig), field_manager="metacontroller")
    flags = MetacontrollerFlags.from_args(args)
    process = Metacontroller(
        kube, hooks, composite, decorator, flags=flags, workers=flags.workers
    )  # as 4.17.2
    process.start()
    lock = threading.Lock()
    backlog: dict[str, tuple[int, float]] = {}
    depth: dict[str, int] = {}
    stopping = threading.Event()

    def sample() -> None:  # how far behind the caches and queues fall (a lagging cache creates what exists)
        while not stopping.wait(1.0):
            factory = process.factory
            informers = factory.informers() if factory is not None else []
            with lock:
                for informer in informers:
                    count, age = informer.backlog()
                    seen = backlog.get(informer.kind, (0, 0.0))
                    backlog[informer.kind] = (max(seen[0], count), max(seen[1], age))
                for controller in (process.composite, process.decorator):
                    depth[controller.name] = max(depth.get(controller.name, 0), controller.queue.depth())

    threading.Thread(target=sample, name="standin-sampler", daemon=True).start()
    conn.send("started")
    while True:
        command = conn.recv()
        stats = Stats()
        with lock:
            stats.backlog, stats.queue_depth = dict(backlog), dict(depth)
            backlog.clear()
            depth.clear()
        for controller in (process.composite, process.decorator):
            for done in controller.drain():
                name = f"{controller.name} {done.hook or '-'}"
                stats.passes[name] = stats.passes.get(name, 0) + 1
                for write in done.writes:
                    what = f"{controller.name} {' '.join(write.split()[:2])}"
                    stats.writes[what] = stats.writes.get(what, 0) + 1
                if done.error and len(stats.errors) < 5:
                    stats.errors.append(f"{done.key}: {done.error[:300]}")
        stats.calls, calls[:] = list(calls), []
        stats.failed, failed[:] = list(failed), []
        stats.peak_rss_mib = rss_mib()[1]
        if process.bucket is not None:
            stats.limiter_wait_s, stats.limiter_requests = process.bucket.waited, process.bucket.requests
        if command == "stop":
            stopping.set()
            process.stop()
        conn.send(stats)
        if command == "stop":
            return


class StandIn:
    """`with StandIn(...) as standin:` the controllers run in a child process until the block ends."""

    def __init__(self, kubeconfig: Path, hooks_url: str, ca_path: Path, composite: Obj, decorator: Obj,
                 args: list[str]) -> None:  # fmt: skip
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(
            target=_serve,
            args=(child, str(kubeconfig), hooks_url, str(ca_path), composite, decorator, args),
            name="metacontroller-standin",
            daemon=True,
        )

    def __enter__(self) -> StandIn:
        self._process.start()
        if not self._conn.poll(120):
            raise TimeoutError("the Metacontroller stand-in did not start within 120 s")
        self._conn.recv()
        return self

    def stats(self) -> Stats:
        self._conn.send("stats")
        out: Stats = self._conn.recv()
        return out

    def __exit__(self, *_: object) -> None:
        try:
            self._conn.send("stop")
            if self._conn.poll(60):
                self._conn.recv()
        finally:
            self._process.join(30)
            if self._process.is_alive():
                self._process.kill()
