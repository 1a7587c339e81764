"""How many parts are in flight (engine.PartConcurrency), and sinks fed whole parts at once.

The gate keeps a few connections while each is fast (less CPU per byte: a file's
parts arrive at its hashing frontier) and doubles them while the origin caps each
connection and more of them raise the total rate. Its rule is tested with a given
clock; the engine's use of it against the local hub, paced and unpaced.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from praesto.agent.download.api import LastingDownloadError, PartSources, RemoteFile, Sink, Target
from praesto.agent.download.concurrency import (
    RATE_WINDOW,
    START_CONNECTIONS,
    OwnCpuMeter,
    PartConcurrency,
    usable_cpus,
)
from praesto.agent.download.engine import Engine
from praesto.agent.download.fetch import download, plan
from praesto.agent.download.http import MAX_REDIRECTS, Redirect
from praesto.agent.download.origins import origin_for
from praesto.agent.download.publish import publish, staging_for

from praesto.spec import Source
from testkit.hub import LocalHub
from tests.download.conftest import MiB, options_for, tree_of

FLUSH_DEADLINE = 20.0  # seconds: a held flush or a checkpoint that never came fails the test, not hangs it


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_fast_connections_never_widen_the_gate() -> None:
    gate = PartConcurrency(4, 32, slow=64e6, clock=Clock())
    for done in range(0, 10 * 2**30, 2**30):
        gate.observe(int(100e6 * RATE_WINDOW), RATE_WINDOW, done)
    assert (gate.allowed, gate.peak, gate.settled) == (4, 4, False)


class CappedDownload:
    """Drives a PartConcurrency window by window: each connection at `per_connection` bytes/s (a capped
    origin), the total at whatever rate a window is given."""

    def __init__(self, gate: PartConcurrency, clock: Clock, per_connection: float) -> None:
        self.gate, self.clock, self.done = gate, clock, 0
        self.slow = (int(per_connection * RATE_WINDOW), RATE_WINDOW)
        gate.mark(0)  # the download starts

    def window(self, rate: float) -> None:
        self.clock.now += RATE_WINDOW
        self.done += int(rate * RATE_WINDOW)
        self.gate.observe(*self.slow, self.done)


def test_slow_connections_double_the_gate_while_the_total_rate_rises_then_it_settles() -> None:
    clock = Clock()
    gate = PartConcurrency(4, 32, slow=64e6, clock=clock)
    run = CappedDownload(gate, clock, 10e6)  # 10 MB/s: a capped connection
    run.window(60e6)  # connections starting (a burst per request): not judged
    assert gate.allowed == 4
    run.window(40e6)  # 4 connections x 10 MB/s
    assert gate.allowed == 8
    run.window(80e6)  # doubled: kept, and tried again
    assert gate.allowed == 16
    run.window(85e6)  # no longer rising: something else is the limit
    assert (gate.allowed, gate.peak, gate.settled) == (8, 16, True)
    run.window(10e6)
    assert gate.allowed == 8


def test_a_settled_gate_probes_again_later() -> None:
    """A verdict from one window can be wrong (bursts at request starts inflate a window's
    rate): a gate settled too low on a capped origin tries again after SETTLE_SECONDS."""
    clock = Clock()
    gate = PartConcurrency(4, 8, slow=64e6, clock=clock)
    run = CappedDownload(gate, clock, 2.5e6)
    run.window(60e6)  # starting: not judged
    run.window(30e6)  # still far more than 4 capped connections carry (bursts, a noisy window)
    run.window(17e6)  # 8 connections: below 30 x 1.3, so back to 4
    assert (gate.allowed, gate.settled) == (4, True)
    while gate.settled:
        run.window(10e6)  # 4 x 2.5 MB/s; the window that ends the settling is judged: doubling
    assert gate.allowed == 8
    run.window(20e6)  # 8 x 2.5 MB/s: kept
    assert (gate.allowed, gate.settled) == (8, False)


def test_the_gate_stops_at_its_limit() -> None:
    clock = Clock()
    gate = PartConcurrency(4, 6, slow=64e6, clock=clock)
    gate.mark(0)
    for done in (10**6, 2 * 10**6):  # the start's window, then a judged one
        clock.now += RATE_WINDOW
        gate.observe(1, RATE_WINDOW, done)
    assert gate.allowed == 6


def test_slow_connections_on_busy_cpus_do_not_widen_the_gate() -> None:
    # Loopback or a small node: each of 4 connections is "slow" only because the CPUs are
    # full (receive copies, sha256); more sockets would cost CPU per byte, not add bytes/s.
    clock = Clock()
    gate = PartConcurrency(4, 32, slow=64e6, clock=clock, busy=lambda: 0.95)
    gate.mark(0)
    for done in (int(200e6 * RATE_WINDOW), int(400e6 * RATE_WINDOW)):  # the start's window, then a judged one
        clock.now += RATE_WINDOW
        gate.observe(int(50e6 * RATE_WINDOW), RATE_WINDOW, done)
    assert (gate.allowed, gate.peak, gate.settled) == (4, 4, True)


def test_the_cpu_meter_counts_this_process_against_the_cpus_it_may_use() -> None:
    clock, cpu = [100.0], [5.0]
    meter = OwnCpuMeter(cpu_time=lambda: cpu[0], clock=lambda: clock[0], cpus=2.0)
    clock[0], cpu[0] = 101.0, 6.6  # 1.6 CPU-seconds in one second on two CPUs
    assert abs(meter() - 0.8) < 1e-9
    assert meter() == 0.0  # no time passed
    assert OwnCpuMeter(cpu_time=lambda: 0.0, cpus=0.0)() == 0.0  # nothing known: never claims busy


def test_another_process_keeping_the_cpus_busy_is_not_this_ones_limit() -> None:
    """#24 item 5: a compiler or a model server beside the download does not count as its CPU use."""
    meter = OwnCpuMeter()
    hog = subprocess.run(  # burns 0.3 CPU-seconds in another process while this one waits
        [sys.executable, "-c", "import time\nwhile time.process_time() < 0.3: pass"], check=True, timeout=60
    )
    assert hog.returncode == 0
    assert meter() < 0.5


def test_usable_cpus_honour_a_cgroup_quota(tmp_path: Path) -> None:
    quota = tmp_path / "cpu.max"
    quota.write_text("50000 100000\n")  # a container limited to half a CPU
    assert usable_cpus(str(quota)) == 0.5
    quota.write_text("max 100000\n")
    assert usable_cpus(str(quota)) == len(os.sched_getaffinity(0))
    assert usable_cpus(str(tmp_path / "absent")) == len(os.sched_getaffinity(0))


def _engine(hub: LocalHub, repo: str, dest: Path, **kwargs: object) -> Engine:
    options = options_for(hub, **kwargs)
    staging, _ = staging_for(dest, options)
    planned = plan(Source("hf", repo, "main"), options)
    return Engine(planned, staging, origin_for("hf").open(planned, options), options)


def _run(engine: Engine, dest: Path) -> None:
    engine.prepare()
    engine.run()
    publish(engine.plan, engine.staging, dest, False, engine.sha256)


def test_a_capped_origin_gets_more_connections(hub: LocalHub, tmp_path: Path) -> None:
    files = {f"model-{i}.safetensors": os.urandom(8 * MiB) for i in range(3)}
    hub.add_repo("org/capped", files)
    hub.faults.rate = (
        2 * MiB
    )  # per response, as a CDN caps each connection (~3 s: the gate judges 1 s windows)
    dest = tmp_path / "dest"
    engine = _engine(hub, "org/capped", dest, part_size=4 * MiB, concurrency=8)
    # About the origin's cap: how busy other test workers keep this machine's CPUs (which
    # would rightly stop the gate widening) is not what this test is about.
    engine.concurrency.busy = lambda: 0.0
    _run(engine, dest)
    assert tree_of(dest) == files
    assert engine.concurrency.peak > START_CONNECTIONS


def test_a_fast_origin_keeps_few_connections_and_hashes_from_the_network(
    hub: LocalHub, tmp_path: Path
) -> None:
    files = {f"model-{i}.safetensors": os.urandom(6 * MiB + i) for i in range(3)}
    hub.add_repo("org/fast", files)
    dest = tmp_path / "dest"
    engine = _engine(hub, "org/fast", dest, part_size=1 * MiB, concurrency=32)
    _run(engine, dest)
    assert tree_of(dest) == files
    # Never more than START_CONNECTIONS parts at once unless a connection ran slow for a
    # whole window (possible on a loaded machine), and then only while that paid.
    assert engine.concurrency.allowed <= START_CONNECTIONS * 2
    assert engine.result.bytes_from_origin == sum(len(d) for d in files.values())


class WholeCopy:
    """A peer holding a complete copy on disk that answers a range with one sink call."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.calls = 0
        self.lock = threading.Lock()

    def fetch(self, file: RemoteFile, start: int, end: int, sink: Sink, cancel: threading.Event) -> int:
        with open(self.root / file.path, "rb") as handle:
            data = os.pread(handle.fileno(), end - start, start)
        sink(start, memoryview(data))  # a whole part (here 4 MiB) in one call
        with self.lock:
            self.calls += 1
        return len(data)

    def blame(self, file: RemoteFile) -> bool:
        return False


def test_whole_parts_in_one_sink_call_complete_and_verify(hub: LocalHub, tmp_path: Path) -> None:
    """A source may hand over a part in one chunk, ahead of the hashing frontier and larger
    than the reorder budget; the engine must neither stall nor hold it all in memory."""
    files = {f"model-{i}.safetensors": os.urandom(16 * MiB + i) for i in range(2)}
    files["config.json"] = b'{"model_type": "test"}'
    hub.add_repo("org/whole", files)
    first = tmp_path / "first"
    options = options_for(hub, part_size=4 * MiB, concurrency=8, memory_budget=2 * MiB)
    download(plan(Source("hf", "org/whole", "main"), options), first, options)
    hub.reset_counters()
    peer = WholeCopy(first)
    second = tmp_path / "second"
    result = download(
        plan(Source("hf", "org/whole", "main"), options), second, options, PartSources(peers=peer)
    )
    assert tree_of(second) == files
    # Only files the origin vouches for by sha256 (the LFS weights) may come from a peer; the
    # small git-blob file comes from the origin (see RemoteFile.peers_may_supply).
    small = len(files["config.json"])
    assert result.bytes_from_peers == sum(len(d) for d in files.values()) - small
    assert result.bytes_from_origin == small
    assert peer.calls == 4 + 5  # every part (16 MiB: 4, 16 MiB + 1: 5), not the small file


def test_parts_keep_arriving_while_a_checkpoint_waits_on_the_disk(
    hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checkpoints flush beside the fetch threads: a disk slow to flush (one shared with other
    writers, a network volume) holds no connection between parts. With one connection, every
    part arrives while the first checkpoint's fdatasync is still held; then the download
    journals, verifies and publishes as before."""
    big = os.urandom(6 * MiB)
    hub.add_repo("org/flush", {"big.bin": big})
    flushing, disk_free, held_to_the_end = threading.Event(), threading.Event(), threading.Event()
    flush = os.fdatasync

    def slow_disk(fd: int) -> None:
        flushing.set()
        assert disk_free.wait(FLUSH_DEADLINE), "a fetch thread waited on the flush"
        flush(fd)

    def progress(done: int, total: int) -> None:
        if done > MiB:  # the first part is whole: its checkpoint has begun, or begins now
            assert flushing.wait(FLUSH_DEADLINE), "no checkpoint after the first part"
        if done == total:
            if not disk_free.is_set():
                held_to_the_end.set()
            disk_free.set()

    monkeypatch.setattr(os, "fdatasync", slow_disk)
    options = options_for(
        hub, progress=progress, staging_dir=tmp_path / "stage", checkpoint_seconds=0.0, concurrency=1
    )
    dest = tmp_path / "dest"
    download(plan(Source("hf", "org/flush", "main"), options), dest, options)
    assert held_to_the_end.is_set()
    assert tree_of(dest) == {"big.bin": big}


def test_a_redirect_loop_fails_the_copy_instead_of_holding_a_fetch_thread(
    hub: LocalHub, tmp_path: Path
) -> None:
    """A tenant's origin may answer every byte request with another redirect (each hop passes the
    egress rule): the engine follows MAX_REDIRECTS of them per part, then fails for good."""
    hub.add_repo("org/loop", {"w.bin": os.urandom(1024)})
    dest = tmp_path / "out"
    engine = _engine(hub, "org/loop", dest)
    hops: list[str] = []

    def always_redirect(target: Target, *_args: object) -> None:
        hops.append(target.url)
        raise Redirect(Target(f"{target.url.split('?')[0]}?hop={len(hops)}", authorized=False))

    engine.transport.fetch = always_redirect  # type: ignore[method-assign,assignment]
    engine.prepare()
    with pytest.raises(LastingDownloadError, match="more than 10 redirects"):
        engine.run()
    assert len(hops) == MAX_REDIRECTS + 1
