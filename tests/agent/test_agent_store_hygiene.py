"""One agent per base path, and no hydration request left that no agent will answer.

Issue #12 (8): nothing stopped two agents on one base path (each sweeps the
other's copies as unowned), and requests the CSI driver wrote for caches this
node does not hold stayed forever.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from praesto.agent import baselock
from praesto.agent.kube import KubeApi
from praesto.agent.metrics import AgentMetrics
from praesto.agent.node_agent import Agent
from praesto.csi.storefs import CsiStore

from praesto import names, store
from testkit.agent_harness import NODE, Env, env_context
from testkit.kube_real import RealKube

HOLDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from praesto.agent import baselock
    from praesto.store import StoreLayout
    baselock.acquire(StoreLayout(Path(sys.argv[1])))
    print("locked", flush=True)
    sys.stdin.read()  # hold until the test closes our stdin
    """
)


@pytest.fixture
def env(tmp_path: Path, kube: RealKube) -> Iterator[Env]:
    yield from env_context(kube, tmp_path)


def test_a_second_agent_on_the_same_base_path_refuses_to_start(env: Env) -> None:
    first = env.start()
    assert first.settings is not None
    second = Agent(
        replace(first.settings), KubeApi(env.kube.api_client(), NODE, watch_timeout=5), AgentMetrics.create()
    )
    with pytest.raises(baselock.BasePathInUse) as refused:
        second.start()
    message = str(refused.value)
    assert str(env.base) in message and f"pid {os.getpid()}" in message
    assert "--base-path" in message
    first.stop()
    second.start().stop()  # released with the first agent's stop


def _kubeconfig(path: Path) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return path


def test_the_agent_process_exits_naming_the_path_and_the_holder(tmp_path: Path) -> None:
    base = tmp_path / "store"
    base.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(base)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        argv = [
            sys.executable, "-m", "praesto.agent.cli", "run", "--node-name", "n", "--base-path", str(base),
            "--kubeconfig", str(_kubeconfig(tmp_path / "kubeconfig")), "--metrics-port", "0",
        ]  # fmt: skip
        refused = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert refused.returncode == 1, refused.stderr
        assert str(base) in refused.stderr and f"pid {holder.pid}" in refused.stderr
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    baselock.release(baselock.acquire(store.StoreLayout(base)))  # the kernel let go with the holder


def test_requests_for_caches_this_node_does_not_hold_are_dropped(env: Env) -> None:
    env.add_model("kept", **{"config.json": b"{}"})
    env.create_mcn("kept", ttl="1h")
    CsiStore(env.layout).request_hydration("team-a", "ghost")  # a Pod asked for a cache not assigned here
    CsiStore(env.layout).request_hydration("team-b", "kept")  # same name, another namespace: not ours either
    (env.layout.requests_dir / "garbage.json").write_text("{not json")
    env.start()
    env.wait_phase("kept", names.PHASE_READY)
    env.wait(
        lambda: sorted(p.name for p in env.layout.requests_dir.glob("*.json")) == [],
        "requests nobody will answer to go",
    )


def test_a_base_path_created_later_is_locked_before_the_agent_touches_it(
    tmp_path: Path, kube: RealKube
) -> None:
    for env in env_context(kube, tmp_path, tmp_path / "later"):
        _base_appears_later(env, tmp_path / "prepared")


def _base_appears_later(env: Env, prepared: Path) -> None:
    (prepared / store.INTERNAL_DIR).mkdir(parents=True)
    holder = baselock.acquire(store.StoreLayout(prepared))  # another agent got there first
    agent = env.start()
    prepared.rename(env.base)  # the node's base path appears, already locked
    env.wait(lambda: agent.fatal is not None, "the agent to give up the store")
    assert agent.fatal is not None
    assert str(env.base) in agent.fatal and f"pid {os.getpid()}" in agent.fatal
    agent.stop()
    baselock.release(holder)

    agent = env.start()  # nobody holds it now: this agent does, and says so in the lock file
    lock = baselock.lock_path(env.layout)
    env.wait(lambda: lock.read_text().strip() == str(os.getpid()), "the agent to lock the store")
    assert agent.fatal is None
