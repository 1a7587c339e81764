"""Pods asking for a cache, created while its copies roll: admission through the real API server.

Each Pod carries the Praesto annotation (`praesto.io/model-mounts`, tests/cluster/tenants.py's
`pod`) in a namespace opted in for injection, so the API server sends its CREATE to
praesto-hooks' `/admission/mutate-pod` exactly as the chart registers the webhook
(templates/webhooks.yaml: namespaceSelector, matchConditions, failurePolicy, timeout). The
bench times each CREATE as the client sees it (the webhook call included), checks the
answer carries the injected CSI volume, and keeps every failure's message. The control plane's
scheduler binds the Pods to the fake Nodes, where no kubelet runs them.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from praesto import names
from tests.cluster.tenants import pod

Obj = dict[str, Any]


@dataclass
class StormResult:
    latencies: list[float] = field(default_factory=list)  # seconds per successful CREATE
    failures: list[str] = field(default_factory=list)  # one line per failed CREATE
    not_mutated: int = 0  # admitted but without the injected CSI volume
    ended_at: list[float] = field(default_factory=list)  # monotonic end of each CREATE
    started: float = 0.0
    ended: float = 0.0

    def summary(self, roll_done_at: float | None) -> dict[str, float]:
        """p50/p99 ms, rate per second, failures, and how many were admitted before the roll ended."""
        seconds = max(self.ended - self.started, 1e-9)
        ordered = sorted(self.latencies) or [float("nan")]
        per_second: dict[int, int] = {}
        for end in self.ended_at:
            per_second[int(end - self.started)] = per_second.get(int(end - self.started), 0) + 1
        during = sum(1 for end in self.ended_at if roll_done_at is None or end <= roll_done_at)
        return {
            "pods": len(self.latencies) + len(self.failures),
            "admitted": len(self.latencies),
            "failed": len(self.failures),
            "not_mutated": self.not_mutated,
            "seconds": seconds,
            "per_second": len(self.latencies) / seconds,
            "peak_per_second": max(per_second.values(), default=0),
            "p50_ms": 1000 * statistics.median(ordered),
            "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
            "max_ms": 1000 * ordered[-1],
            "admitted_while_rolling": during,
        }


class PodStorm:
    """`count` annotated Pods created from `threads` clients at once, in a background thread."""

    def __init__(self, configuration: client.Configuration, namespace: str, cache: str, count: int,
                 threads: int = 8) -> None:  # fmt: skip
        self.configuration, self.namespace, self.cache = configuration, namespace, cache
        self.count, self.threads = count, threads
        self.result = StormResult()
        self._next = iter(range(count))
        self._lock = threading.Lock()
        self._workers = [threading.Thread(target=self._work, daemon=True) for _ in range(threads)]

    def start(self) -> PodStorm:
        self.result.started = time.monotonic()
        for worker in self._workers:
            worker.start()
        return self

    def join(self, deadline: float) -> StormResult:
        end = time.monotonic() + deadline
        for worker in self._workers:
            worker.join(max(0.0, end - time.monotonic()))
        self.result.ended = max(self.result.ended_at, default=time.monotonic())
        return self.result

    def _take(self) -> int | None:
        with self._lock:
            return next(self._next, None)

    def _work(self) -> None:
        core = client.CoreV1Api(client.ApiClient(configuration=self.configuration))
        while (index := self._take()) is not None:
            body = pod(f"server-{index:05d}", self.namespace, self.cache)
            started = time.monotonic()
            try:
                created = core.create_namespaced_pod(self.namespace, body, _preload_content=False)
                mutated = names.CSI_DRIVER_NAME.encode() in created.data
            except ApiException as error:
                with self._lock:
                    self.result.failures.append(f"HTTP {error.status}: {str(error.body)[:200]}")
                continue
            except Exception as error:  # a connection reset: counted, the storm goes on
                with self._lock:
                    self.result.failures.append(f"{type(error).__name__}: {str(error)[:200]}")
                continue
            ended = time.monotonic()
            with self._lock:
                self.result.latencies.append(ended - started)
                self.result.ended_at.append(ended)
                self.result.not_mutated += 0 if mutated else 1


def delete_pods(configuration: client.Configuration, namespace: str) -> None:
    """The storm's Pods, gone at once (no kubelet would confirm a graceful deletion)."""
    core = client.CoreV1Api(client.ApiClient(configuration=configuration))
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
