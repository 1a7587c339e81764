"""The node agent fetches a ModelScope copy as it does a Hub one: the cache's own Secret's token
(key MODELSCOPE_API_TOKEN) to the hub only, the endpoint from MODELSCOPE_ENDPOINT, a wrong token a
lasting Unauthorized that names no secret. Real API server (the `kube` fixture), in-process agent."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from praesto import names
from testkit.agent_harness import NODE, Env, rbac_violations, tree
from testkit.egress import LOOPBACK
from testkit.kube_real import RealKube
from testkit.modelscope_hub import ModelScopeHub
from testkit.objects import modelcachenode

TOKEN = "ms-aGeNtToKeN0987654321"
TOKEN_B = "ms-tEaMbToKeN1122334455"


@pytest.fixture
def env(tmp_path: Path, kube: RealKube) -> Iterator[Env]:
    base = tmp_path / "store"
    base.mkdir()
    with ModelScopeHub(tmp_path / "hub") as hub:
        env = Env(kube, hub, base)
        try:
            yield env
        finally:
            if env.agent is not None:
                env.agent.stop()
    assert rbac_violations(kube.requests) == []


def _start(env: Env) -> None:
    env.start(modelscope_endpoint=env.hub.endpoint, egress=LOOPBACK)


def _mcn(
    env: Env, cache: str, uri: str, secret: tuple[str, str] | None = None, namespace: str = "team-a"
) -> None:
    source: dict[str, Any] = {"uri": uri, "revision": "master"}
    if secret:
        source["secretRef"] = {"name": secret[0], "key": secret[1]}
    env.kube.create(modelcachenode(cache, NODE, namespace, source=source, size="1Gi"))


def test_a_private_modelscope_copy_with_the_caches_own_token(env: Env) -> None:
    files = {"configuration.json": b"{}", "w.safetensors": os.urandom(300_000)}
    commit = env.hub.add_repo("org/private", files, private=True)
    env.hub.tokens.add(TOKEN)
    env.create_secret("team-a", "ms-token", "MODELSCOPE_API_TOKEN", TOKEN)
    _mcn(env, "qwen", "ms://org/private", secret=("ms-token", "MODELSCOPE_API_TOKEN"))
    _start(env)
    status = env.wait_phase("qwen", names.PHASE_READY)
    assert status["resolvedRevision"] == commit
    assert tree(env.layout.cache_dir("team-a", "qwen")) == files
    assert isinstance(env.hub, ModelScopeHub)
    assert TOKEN not in env.log.getvalue() and env.hub.cdn_credentials == 0


def test_a_wrong_token_is_unauthorized_and_never_logged(env: Env) -> None:
    env.hub.add_repo("org/private", {"configuration.json": b"{}"}, private=True)
    env.hub.tokens.add(TOKEN)
    env.create_secret("team-a", "ms-token", "MODELSCOPE_API_TOKEN", "ms-wrong")
    _mcn(env, "qwen", "ms://org/private", secret=("ms-token", "MODELSCOPE_API_TOKEN"))
    _start(env)
    status = env.wait_reason("qwen", "Unauthorized")
    assert status["phase"] == names.PHASE_FAILED
    assert "ms-wrong" not in env.log.getvalue() and "ms-wrong" not in str(status)


def test_another_namespaces_copy_is_never_served_without_its_own_token(env: Env) -> None:
    """Team-a's copy of a private repo is on the node (its files in the shared blob area). Team-b
    naming the same repo with no token, or a wrong one, gets Unauthorized from the hub and nothing
    of team-a's; with a token of its own the hub lists the files for it, and only then the node's
    verified bytes are reused (dedup, no byte fetched again)."""
    files = {"configuration.json": b"{}", "w.safetensors": os.urandom(300_000)}
    env.hub.add_repo("org/private", files, private=True)
    env.hub.tokens.update({TOKEN, TOKEN_B})
    env.create_secret("team-a", "ms-token", "MODELSCOPE_API_TOKEN", TOKEN)
    _mcn(env, "qwen", "ms://org/private", secret=("ms-token", "MODELSCOPE_API_TOKEN"))
    _start(env)
    env.wait_phase("qwen", names.PHASE_READY)
    env.hub.reset_counters()
    env.create_secret("team-b", "wrong", "MODELSCOPE_API_TOKEN", "ms-wrong")
    _mcn(env, "anon", "ms://org/private", namespace="team-b")
    _mcn(env, "wrong", "ms://org/private", secret=("wrong", "MODELSCOPE_API_TOKEN"), namespace="team-b")
    for cache in ("anon", "wrong"):
        assert env.wait_reason(cache, "Unauthorized", namespace="team-b")["phase"] == names.PHASE_FAILED
        dest = env.layout.cache_dir("team-b", cache)
        assert not dest.exists() or tree(dest) == {}
    assert env.hub.bytes_served == 0
    env.create_secret("team-b", "ms-token", "MODELSCOPE_API_TOKEN", TOKEN_B)
    _mcn(env, "own", "ms://org/private", secret=("ms-token", "MODELSCOPE_API_TOKEN"), namespace="team-b")
    env.wait_phase("own", names.PHASE_READY, namespace="team-b")
    assert tree(env.layout.cache_dir("team-b", "own")) == files
    assert env.hub.bytes_served == 0  # reused from the node, after the hub listed them for team-b's token
    secret_reads = {(r.namespace, r.name) for r in env.kube.requests if r.resource == "secrets"}
    assert secret_reads <= {("team-a", "ms-token"), ("team-b", "wrong"), ("team-b", "ms-token")}
    assert TOKEN_B not in env.log.getvalue() and "ms-wrong" not in env.log.getvalue()
