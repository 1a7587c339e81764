"""Metacontroller's client rate limit: client-go's token bucket, shared by every controller, and the flags that set it.

Sources:

* metacontroller v4.17.2 `pkg/cmd/metacontroller/main.go`: `--client-go-qps` (default 5),
  `--client-go-burst` (default 10) set `config.QPS`/`config.Burst` on the one rest config;
  `--workers` (default 5) is each controller's worker count; `--cache-flush-interval`
  (default 30m) the informers' resync.
* metacontroller v4.17.2 `pkg/controller/common/common.go` `NewControllerContext`: one dynamic
  client (`pkg/dynamic/clientset/clientset.go` `dynamic.NewForConfig`) serves every
  controller's reads and writes and the shared informers' lists, so they all queue behind
  one limiter.
* client-go v0.36.3 (Metacontroller 4.17.2's go.mod) `rest/config.go` `RESTClientForConfigAndClient`:
  the limiter is `flowcontrol.NewTokenBucketRateLimiter(qps, burst)` when qps > 0 (0 means 5/10);
  `rest/request.go`: every request waits on it (`tryThrottle`) except `Watch`
  ("We specifically don't want to rate limit watches").
* client-go v0.36.3 `util/flowcontrol/throttle.go`: a golang.org/x/time/rate limiter; the
  bucket starts full with `burst` tokens and refills at `qps`, capped at `burst`; `Wait`
  reserves a token at once (the count may go negative) and sleeps until it is due, so
  waiters are served in order, `1/qps` apart.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from kubernetes import client

DEFAULT_QPS, DEFAULT_BURST = (
    5.0,
    10,
)  # client-go rest.DefaultQPS / DefaultBurst, Metacontroller's flag defaults
DEFAULT_WORKERS = 5  # Metacontroller's `--workers`
DEFAULT_CACHE_FLUSH = 1800.0  # `--cache-flush-interval` 30m
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_DISCOVERY = re.compile(r"^(/api(/v1)?|/apis(/[^/]+(/[^/]+)?)?|/version|/openapi/.*)/?$")
_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class TokenBucket:
    """`flowcontrol.NewTokenBucketRateLimiter(qps, burst)`: `wait()` returns when this request may go."""

    def __init__(
        self,
        qps: float,
        burst: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError(f"token bucket needs qps > 0 and burst >= 1, got {qps}/{burst}")
        self.qps, self.burst = float(qps), int(burst)
        self._clock, self._sleep = clock, sleep
        self._tokens = float(burst)  # starts full
        self._last = clock()
        self._lock = threading.Lock()
        self.waited = 0.0  # total seconds callers spent waiting (what the limit cost)
        self.requests = 0

    def reserve(self) -> float:
        """`rate.Limiter.ReserveN(now, 1)`: take a token now; the seconds until it is due."""
        with self._lock:
            now = self._clock()
            elapsed = max(0.0, now - self._last)
            self._tokens = min(float(self.burst), self._tokens + elapsed * self.qps)
            self._last = now
            self._tokens -= 1.0
            delay = -self._tokens / self.qps if self._tokens < 0 else 0.0
            self.waited += delay
            self.requests += 1
            return delay

    def wait(self) -> None:
        delay = self.reserve()
        if delay > 0:
            self._sleep(delay)


def exempt(url: str, query_params: Sequence[tuple[str, Any]] | None) -> bool:
    """Requests that do not wait on the controllers' limiter: watches (client-go `Watch`) and discovery,
    which Metacontroller makes on its own client (`discovery.NewDiscoveryClientForConfigOrDie`)."""
    if any(k == "watch" and str(v).lower() == "true" for k, v in query_params or ()):
        return True
    return bool(_DISCOVERY.match(urlsplit(url).path))


class ThrottledApiClient(client.ApiClient):  # type: ignore[misc]
    """An ApiClient whose every request but a watch waits on `bucket`, as client-go's RESTClient does."""

    def __init__(self, configuration: client.Configuration, bucket: TokenBucket) -> None:
        super().__init__(configuration=configuration)
        self.bucket = bucket

    def own_pool(self) -> ThrottledApiClient:
        """The same identity and limiter on a new connection pool (what `Informer` asks of its client)."""
        return ThrottledApiClient(self.configuration, self.bucket)

    def request(self, method: str, url: str, query_params: Any = None, *args: Any, **kwargs: Any) -> Any:
        if not exempt(url, query_params):
            self.bucket.wait()
        return super().request(method, url, query_params, *args, **kwargs)


def go_duration(text: str) -> float:
    """Go's `time.ParseDuration` for the forms flags use (`30m`, `1h30m`, `20s`, `500ms`); seconds."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a Go duration: {text!r} (e.g. 30m, 20s, 1h30m)")
    return sum(float(n) * _UNIT[u] for n, u in parts)


@dataclass(frozen=True)
class MetacontrollerFlags:
    """The settings of Metacontroller's command line the stand-in honours (defaults: main.go v4.17.2)."""

    client_go_qps: float = DEFAULT_QPS
    client_go_burst: int = DEFAULT_BURST
    workers: int = DEFAULT_WORKERS
    cache_flush_interval: float = DEFAULT_CACHE_FLUSH
    workers_set: bool = False  # `--workers` was given (else `workers` is Metacontroller's default)

    @classmethod
    def from_args(cls, args: Sequence[str]) -> MetacontrollerFlags:
        """Parse Go `flag` syntax (`--name=value`, `-name=value`, `--name value`); other flags are ignored."""
        found: dict[str, str] = {}
        items = list(args)
        for i, arg in enumerate(items):
            if not arg.startswith("-"):
                continue
            name, eq, value = arg.lstrip("-").partition("=")
            if not eq and i + 1 < len(items) and not items[i + 1].startswith("-"):
                value = items[i + 1]
            found[name] = value
        try:
            return cls(
                client_go_qps=float(found.get("client-go-qps", DEFAULT_QPS)),
                client_go_burst=int(found.get("client-go-burst", DEFAULT_BURST)),
                workers=int(found.get("workers", DEFAULT_WORKERS)),
                cache_flush_interval=go_duration(found.get("cache-flush-interval", "30m")),
                workers_set="workers" in found,
            )
        except ValueError as error:
            raise ValueError(f"Metacontroller args {items}: {error}") from error

    def bucket(self) -> TokenBucket | None:
        """The shared limiter (`rest.Config`): 0 means client-go's defaults; a negative qps, none."""
        qps = self.client_go_qps or DEFAULT_QPS
        burst = self.client_go_burst or DEFAULT_BURST
        return TokenBucket(qps, burst) if qps > 0 else None
