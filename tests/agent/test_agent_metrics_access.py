"""Issue 21 item 19, at the process edge: `praesto-agent run` as a real process against the real
API server (through the fault proxy); its /metrics (every tenant's caches) answers a client outside the agent's Pod only with
`--metrics-from=any`. The chart side: tests/chart/test_chart_agent_metrics.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from testkit.kube_real import RealKube
from testkit.ports import free_port
from tests.chart.test_chart_agent_metrics import fetch, own_address


@contextmanager
def agent(tmp_path: Path, kube: RealKube, *extra: str) -> Iterator[int]:
    """A running agent; yields its metrics port once /healthz answers."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emu", "cluster": {"server": kube.url}}],
                "users": [{"name": "agent", "user": {}}],
                "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "agent"}}],
                "current-context": "emu",
            }
        )
    )
    base = tmp_path / "store"
    base.mkdir(exist_ok=True)
    port = free_port()
    cmd = [
        sys.executable, "-m", "praesto.agent.cli", "run", "--base-path", str(base), "--reserve", "0%",
        "--kubeconfig", str(kubeconfig), "--metrics-port", str(port), "--startup-taint-key", "", *extra,
    ]  # fmt: skip
    env = {**os.environ, "NODE_NAME": "node-a"}
    env.pop("PRAESTO_METRICS_FROM", None)
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if fetch("127.0.0.1", port, "/healthz")[0] == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the agent's /healthz did not answer within 30 s"
            time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def test_the_agent_process_keeps_metrics_inside_its_pod_unless_told(tmp_path: Path, kube: RealKube) -> None:
    outside = own_address()
    with agent(tmp_path, kube) as port:
        status, body = fetch(outside, port, "/metrics")
        assert status == 403 and "nodeAgent.metrics.allowedNamespaces" in body
        assert "praesto_agent" not in body
        assert fetch(outside, port, "/healthz") == (200, "ok\n")
        status, body = fetch("127.0.0.1", port, "/metrics")
        assert status == 200 and "praesto_agent_downloads_in_flight" in body
    with agent(tmp_path, kube, "--metrics-from=any") as port:
        status, body = fetch(outside, port, "/metrics")
        assert status == 200 and "praesto_agent_downloads_in_flight" in body
