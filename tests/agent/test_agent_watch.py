"""The agent's watch survives API errors, dropped connections and expired resourceVersions."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from praesto import names
from testkit.agent_harness import Env, env_context
from testkit.kube_real import RealKube

SMALL = b'{"model_type": "tiny"}'


@pytest.fixture
def env(tmp_path: Path, kube: RealKube) -> Iterator[Env]:
    yield from env_context(kube, tmp_path)


def _watches_from(env: Env, start: int) -> list[str]:
    return [r.query.get("resourceVersion", "") for r in env.kube.requests[start:] if r.verb == "watch"]


def test_resumes_after_500s_and_a_dropped_connection_without_losing_events(env: Env) -> None:
    for cache in ("one", "two", "three"):
        env.add_model(cache, **{"config.json": SMALL})
    env.create_mcn("one")
    agent = env.start()
    env.wait_phase("one", names.PHASE_READY)
    env.kube.wait_for_watches(1)
    relists = agent.watcher.relists
    mark = len(env.kube.requests)
    # the next two list/watch calls fail, and the open watch is cut
    env.kube.fail_next(2, 500, lambda r: r.verb in ("list", "watch"))
    env.kube.drop_watches()
    env.create_mcn("two")  # happens while the agent is disconnected
    env.wait_phase("two", names.PHASE_READY)
    env.create_mcn("three")
    env.wait_phase("three", names.PHASE_READY)
    resumed = _watches_from(env, mark)
    assert len(resumed) >= 3 and all(resumed), resumed  # every retry resumes from a resourceVersion
    assert agent.watcher.relists == relists  # no relist needed


def test_relists_on_410_gone_and_catches_up(env: Env) -> None:
    for cache in ("one", "two", "three"):
        env.add_model(cache, **{"config.json": SMALL})
    env.create_mcn("one")
    agent = env.start()
    env.wait_phase("one", names.PHASE_READY)
    env.kube.wait_for_watches(1)
    relists = agent.watcher.relists
    # the watch cannot reconnect while the next events happen ...
    env.kube.fail_next(10**6, 500, lambda r: r.verb == "watch")
    env.kube.drop_watches()
    env.create_mcn("two")
    env.kube.compact()  # ... and the history it would resume from is gone: 410, relist
    env.kube.clear_faults()
    env.wait_phase("two", names.PHASE_READY)
    assert agent.watcher.relists == relists + 1
    env.kube.wait_for_watches(1)
    env.kube.expire_watches()  # a 410 pushed into the open watch
    env.create_mcn("three")
    env.wait_phase("three", names.PHASE_READY)
    env.wait(lambda: agent.watcher.relists == relists + 2, "second relist")


def test_object_deleted_while_disconnected_is_cleaned_up_on_relist(env: Env) -> None:
    env.add_model("one", **{"config.json": SMALL})
    env.create_mcn("one")
    agent = env.start()
    env.wait_phase("one", names.PHASE_READY)
    cache_dir = env.layout.cache_dir("team-a", "one")
    env.kube.wait_for_watches(1)
    env.kube.fail_next(10**6, 500, lambda r: r.verb == "watch")
    env.kube.drop_watches()
    # an admin strips the finalizer and deletes while the agent cannot see it
    name = names.modelcachenode_name("one", "node-a")
    env.kube.patch(
        f"{names.MODELCACHENODE_PLURAL}.{names.GROUP}", name, {"metadata": {"finalizers": None}}, "team-a"
    )
    env.kube.delete(f"{names.MODELCACHENODE_PLURAL}.{names.GROUP}", name, "team-a")
    env.kube.compact()
    env.kube.clear_faults()
    env.wait(lambda: not cache_dir.exists(), "directory of the vanished cache removed")
    assert agent.watcher.relists >= 2
