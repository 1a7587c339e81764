"""The stand-in's model of Metacontroller's client limiter against client-go's token bucket semantics.

client-go v0.36.3 `util/flowcontrol/throttle.go` over golang.org/x/time/rate: the bucket starts
with `burst` tokens, refills at `qps` up to `burst`, and each request reserves a token at once,
waiting until it is due (waiters are served in order, 1/qps apart).
"""

from __future__ import annotations

import http.server
import threading

import pytest
from kubernetes import client

from testkit.client_rate_limit import (
    MetacontrollerFlags,
    ThrottledApiClient,
    TokenBucket,
    exempt,
    go_duration,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


def bucket(qps: float, burst: int) -> tuple[TokenBucket, FakeClock]:
    clock = FakeClock()
    return TokenBucket(qps, burst, clock=clock, sleep=clock.sleep), clock


def test_a_full_bucket_lets_burst_requests_through_then_spaces_the_rest_at_qps() -> None:
    limiter, _ = bucket(5, 10)  # Metacontroller's defaults
    delays = [limiter.reserve() for _ in range(15)]
    assert delays[:10] == [0.0] * 10
    assert delays[10:] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])


def test_n_writes_at_once_take_n_minus_burst_over_qps_seconds() -> None:
    """What a pass creating 1,000 children costs: (1000 - burst) / qps seconds of waiting at the end."""
    limiter, _ = bucket(50, 100)
    last = max(limiter.reserve() for _ in range(1000))
    assert last == pytest.approx((1000 - 100) / 50)


def test_the_bucket_refills_at_qps_and_never_above_burst() -> None:
    limiter, clock = bucket(5, 10)
    for _ in range(10):
        limiter.reserve()
    clock.now += 0.4  # two tokens back
    assert [limiter.reserve() for _ in range(3)] == pytest.approx([0.0, 0.0, 0.2])
    clock.now += 3600  # idle: full again, capped at burst
    delays = [limiter.reserve() for _ in range(11)]
    assert delays[:10] == [0.0] * 10
    assert delays[10] == pytest.approx(0.2)


def test_a_waiter_in_debt_is_repaid_by_time_not_by_other_waiters() -> None:
    """Reservations go negative (x/time/rate): after 1 s at 5 qps, 5 of the owed tokens are back."""
    limiter, clock = bucket(5, 1)
    assert [limiter.reserve() for _ in range(4)] == pytest.approx([0.0, 0.2, 0.4, 0.6])
    clock.now += 1.0
    assert limiter.reserve() == pytest.approx(0.0)  # 3 owed, 5 refilled: 1 left (cap), taken
    assert limiter.reserve() == pytest.approx(0.2)


def test_wait_sleeps_for_the_reserved_delay_and_counts_it() -> None:
    limiter, clock = bucket(10, 2)
    for _ in range(4):
        limiter.wait()
    assert clock.slept == pytest.approx([0.1, 0.2])
    assert limiter.waited == pytest.approx(0.3)
    assert limiter.requests == 4


def test_concurrent_waiters_each_get_a_distinct_slot() -> None:
    limiter, _ = bucket(5, 10)
    delays: list[float] = []
    lock = threading.Lock()

    def take() -> None:
        delay = limiter.reserve()
        with lock:
            delays.append(delay)

    threads = [threading.Thread(target=take) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(delays) == pytest.approx([0.0] * 10 + [0.2 * i for i in range(1, 11)])


@pytest.mark.parametrize(("qps", "burst"), [(0, 10), (-1, 10), (5, 0)])
def test_a_bucket_that_could_never_grant_is_refused(qps: float, burst: int) -> None:
    with pytest.raises(ValueError, match="qps > 0 and burst >= 1"):
        TokenBucket(qps, burst)


def test_flags_default_to_metacontroller_4_17_2() -> None:
    flags = MetacontrollerFlags.from_args(["--zap-log-level=4", "--leader-election"])
    assert (flags.client_go_qps, flags.client_go_burst, flags.workers) == (5.0, 10, 5)
    assert flags.cache_flush_interval == 1800.0
    assert not flags.workers_set  # the tier's stand-in then keeps its own worker counts


def test_flags_read_go_flag_syntax() -> None:
    flags = MetacontrollerFlags.from_args(
        ["--client-go-qps=50", "-client-go-burst", "100", "--workers=8", "--cache-flush-interval=1h30m"]
    )
    assert (flags.client_go_qps, flags.client_go_burst, flags.workers) == (50.0, 100, 8)
    assert flags.cache_flush_interval == 5400.0
    assert flags.workers_set


def test_zero_means_client_go_defaults_and_negative_qps_no_limiter() -> None:
    """`rest.RESTClientForConfigAndClient`: QPS 0 -> 5, Burst 0 -> 10; qps <= 0 after that: no limiter."""
    default = MetacontrollerFlags.from_args(["--client-go-qps=0", "--client-go-burst=0"]).bucket()
    assert default is not None and (default.qps, default.burst) == (5.0, 10)
    assert MetacontrollerFlags.from_args(["--client-go-qps=-1"]).bucket() is None


def test_bad_flag_values_name_the_args() -> None:
    with pytest.raises(ValueError, match=r"Metacontroller args .*client-go-qps=fast"):
        MetacontrollerFlags.from_args(["--client-go-qps=fast"])
    with pytest.raises(ValueError, match="not a Go duration"):
        go_duration("30 minutes")


@pytest.mark.parametrize(
    ("url", "query", "free"),
    [
        ("https://h:6443/api/v1/nodes", [], False),
        ("https://h:6443/api/v1/nodes", [("watch", "true")], True),
        ("https://h:6443/apis/praesto.praesto.io/v1alpha1/namespaces/a/modelcachenodes/x", [], False),
        ("https://h:6443/apis", [], True),
        ("https://h:6443/apis/praesto.praesto.io/v1alpha1", [], True),
        ("https://h:6443/api/v1", [], True),
        ("https://h:6443/version", [], True),
    ],
)
def test_watches_and_discovery_do_not_wait(url: str, query: list[tuple[str, str]], free: bool) -> None:
    assert exempt(url, query) is free


def test_the_client_waits_on_the_bucket_for_reads_and_writes_but_not_watches_or_discovery() -> None:
    """`ThrottledApiClient`, as the stand-in's controllers and informers use it, against a loopback server."""

    class Answer(http.server.BaseHTTPRequestHandler):
        def _reply(self) -> None:
            body = b"{}"
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_PUT = _reply

        def log_message(self, *_: object) -> None:
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        limiter, clock = bucket(5, 1)
        configuration = client.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
        api = ThrottledApiClient(configuration, limiter).own_pool()  # what an informer makes of it

        def call(path: str, method: str = "GET", **query: str) -> None:
            api.call_api(path, method, query_params=list(query.items()), _preload_content=False)

        call("/api/v1/nodes")
        call("/apis/praesto.praesto.io/v1alpha1/namespaces/a/modelcachenodes/x", "PUT")
        call("/api/v1/nodes", watch="true")
        call("/apis")
        call("/apis/praesto.praesto.io/v1alpha1")
        assert limiter.requests == 2
        assert clock.slept == pytest.approx([0.2])  # burst 1: the second waited 1/qps
    finally:
        server.shutdown()
