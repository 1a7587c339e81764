"""`praesto_agent_copies` and `praesto_agent_copy_bytes_*` (agent/copy_metrics.py), as a scraper reads
them: the real agent against the real API server and the local hub, scraped over HTTP from its own
metrics server and parsed with prometheus_client's parser of the text format Prometheus reads. The
alerts on a Failed copy, a stalled download and a node out of room stand on these series."""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from praesto import names
from testkit.agent_harness import MCN, NODE, Env, env_context, ready_condition
from testkit.kube_real import RealKube

MiB = 1 << 20
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture
def env(tmp_path: Path, kube: RealKube) -> Iterator[Env]:
    yield from env_context(kube, tmp_path)


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def of_cache(samples: Samples, name: str, cache: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: v for (n, labels), v in samples.items() if n == name and ("model_cache", cache) in labels}


def copy_series(phase: str, reason: str, cache: str) -> frozenset[tuple[str, str]]:
    return frozenset({"namespace": "team-a", "model_cache": cache, "phase": phase, "reason": reason}.items())


def test_each_copy_shows_its_phase_reason_and_bytes(env: Env) -> None:
    env.add_model("kept", **{"w.bin": os.urandom(MiB)})
    env.create_mcn("kept")
    env.create_mcn("absent", repo="org/no-such-model")
    port = env.start().metrics.serve(0, "127.0.0.1")
    env.wait_phase("kept", names.PHASE_READY)
    failed = env.wait_phase("absent", names.PHASE_FAILED)
    reason = ready_condition(failed)["reason"]

    def both_shown() -> bool:
        samples = scrape(port)
        return of_cache(samples, "praesto_agent_copies", "kept") == {
            copy_series(names.PHASE_READY, "Cached", "kept"): 1.0
        } and copy_series(names.PHASE_FAILED, reason, "absent") in of_cache(
            samples, "praesto_agent_copies", "absent"
        )

    env.wait(both_shown, "the Ready and the Failed copy in /metrics")
    samples = scrape(port)
    labels = frozenset({"namespace": "team-a", "model_cache": "kept"}.items())
    assert of_cache(samples, "praesto_agent_copy_bytes_done", "kept") == {labels: float(MiB)}
    assert of_cache(samples, "praesto_agent_copy_bytes_total", "kept") == {labels: float(MiB)}
    assert of_cache(samples, "praesto_agent_copies", "absent") == {
        copy_series(names.PHASE_FAILED, reason, "absent"): 1.0
    }  # one series per copy: its phase now, not one per phase it went through

    env.kube.delete(MCN, names.modelcachenode_name("kept", NODE), "team-a")
    env.wait(
        lambda: not of_cache(scrape(port), "praesto_agent_copies", "kept"), "the removed copy's series gone"
    )
    assert not of_cache(scrape(port), "praesto_agent_copy_bytes_done", "kept")


def test_a_running_download_shows_downloading_and_rising_bytes(env: Env) -> None:
    size = 4 * MiB
    env.add_model("paced", **{"w.bin": os.urandom(size)})
    env.hub.faults.rate = MiB  # bytes/s: about four seconds
    env.create_mcn("paced")
    port = env.start(progress_seconds=0.2, concurrency=1).metrics.serve(0, "127.0.0.1")
    labels = frozenset({"namespace": "team-a", "model_cache": "paced"}.items())
    seen: list[float] = []

    def rising_while_downloading() -> bool:
        samples = scrape(port)
        copies = of_cache(samples, "praesto_agent_copies", "paced")
        done = of_cache(samples, "praesto_agent_copy_bytes_done", "paced").get(labels)
        if copy_series(names.PHASE_DOWNLOADING, "Downloading", "paced") in copies and done is not None:
            assert of_cache(samples, "praesto_agent_copy_bytes_total", "paced") == {labels: float(size)}
            if not seen or done != seen[-1]:
                seen.append(done)
        return len(seen) >= 2

    env.wait(rising_while_downloading, "two different byte counts while Downloading", timeout=20)
    assert seen == sorted(seen) and seen[-1] < size
    env.wait_phase("paced", names.PHASE_READY)
