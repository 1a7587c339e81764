"""`praesto-agent run` as a real process against the real API server (through the fault proxy) and the local hub."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from praesto.agent import capacity
from praesto.agent.settings import add_run_arguments, check_arguments

from praesto import names
from praesto.quantity import QuantityError
from testkit.agent_harness import env_context
from testkit.egress import LOOPBACK_ENV
from testkit.kube_real import RealKube
from testkit.ports import free_port

GiB = 2**30


def _kubeconfig(path: Path, server: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emu", "cluster": {"server": server}}],
        "users": [{"name": "agent", "user": {}}],
        "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "agent"}}],
        "current-context": "emu",
    }
    path.write_text(json.dumps(config))
    return path


def test_run_process_downloads_serves_metrics_and_stops_on_sigterm(tmp_path: Path, kube: RealKube) -> None:
    for env in env_context(kube, tmp_path):
        env.add_model("tiny", **{"config.json": b"{}", "w.bin": os.urandom(3000)})
        env.create_mcn("tiny")
        port = free_port()
        cmd = [
            sys.executable, "-m", "praesto.agent.cli", "run",
            "--base-path", str(env.base), "--hf-endpoint", env.hub.endpoint,
            "--kubeconfig", str(_kubeconfig(tmp_path / "kubeconfig", env.kube.url)),
            "--metrics-port", str(port), "--reserve", "0%",
        ]  # fmt: skip
        proc = subprocess.Popen(
            cmd, env={**os.environ, **LOOPBACK_ENV, "NODE_NAME": "node-a"}, stderr=subprocess.PIPE, text=True
        )  # the hub listens on loopback
        try:
            env.wait_phase("tiny", names.PHASE_READY)
            deadline = time.monotonic() + 10
            while True:
                try:
                    text = (
                        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
                    )
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            assert 'praesto_agent_downloaded_bytes_total{origin="source"} 3002.0' in text
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, err
        lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
        cache_lines = [line for line in lines if line.get("cache") == "tiny"]
        assert cache_lines and all(line["namespace"] == "team-a" for line in cache_lines)


def test_run_refuses_without_a_node_name(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    proc = subprocess.run(
        [sys.executable, "-m", "praesto.agent.cli", "run", "--base-path", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "--node-name: Required value" in proc.stderr


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--node-name", "n"], None),
        (["--node-name", "n", "--reserve", "15%"], None),
        (["--node-name", "n", "--reserve", "50Gi"], None),
        (["--node-name", "n", "--reserve", "lots"], "--reserve"),
        (["--node-name", "n", "--reserve", "150%"], "--reserve"),
        (["--node-name", "n", "--concurrency", "0"], "--concurrency"),
        (["--node-name", "n", "--metrics-port", "70000"], "--metrics-port"),
    ],
)
def test_flags(argv: list[str], problem: str | None) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_run_arguments(parser, {})
    found = check_arguments(parser.parse_args(argv), {})
    assert (found is None) if problem is None else (found is not None and found.startswith(problem))


def test_reserve_default_and_forms() -> None:
    assert capacity.reserve_bytes(None, 100 * GiB) == 30 * GiB
    assert capacity.reserve_bytes(None, 1000 * GiB) == 150 * GiB
    assert capacity.reserve_bytes("10%", 1000 * GiB) == 100 * GiB
    assert capacity.reserve_bytes("5Gi", 1000 * GiB) == 5 * GiB
    with pytest.raises(QuantityError):
        capacity.reserve_bytes("ten", 0)


def test_choose_evictions_is_least_recently_used_first() -> None:
    disk = capacity.Disk(total=100, free=10)
    a = capacity.Candidate("ns", "a", 30, last_used=3.0)
    b = capacity.Candidate("ns", "b", 30, last_used=1.0)
    c = capacity.Candidate("ns", "c", 30, last_used=2.0)
    assert capacity.choose_evictions(5, disk, 0, [a, b, c]) == []
    assert capacity.choose_evictions(35, disk, 0, [a, b, c]) == [b]
    assert capacity.choose_evictions(45, disk, 10, [a, b, c]) == [b, c]
    assert capacity.choose_evictions(200, disk, 0, [a, b, c]) is None
