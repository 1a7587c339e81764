"""A copy's Ready state follows the platform's trust as it is now (issue 37 item 4).

The platform's signing trust reaches the agent as a mounted ConfigMap (chart verification.trust,
--trust-dir), which the kubelet updates in place (testkit/configmap_volume.py writes it as the
kubelet's AtomicWriter does) without restarting the agent. After a key is replaced, no copy
verified only under the old one is served: the served copy leaves Ready at once and is fetched
again and verified under the new key (or fails SignatureInvalid while the origin still holds the
old signature), at the next reconcile pass and at agent start; a revision kept for rollback that
was verified under the old key is not rolled back to without a fetch. Against the real API server
and the local hub.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from praesto.agent.rolling import commit_of
from praesto.csi.storefs import CsiStore

from praesto import names, store, trustpolicy
from testkit.agent_harness import MCN, NODE, Env, env_context, ready_condition
from testkit.configmap_volume import project
from testkit.kube_real import RealKube
from testkit.objects import modelcachenode
from testkit.pki import KeyPair
from testkit.signed_models import key_pair, sign_with_key

TRUST = "platform"  # the entry's name in the chart's verification.trust
FILES = {"config.json": b'{"model_type": "tiny"}', "model.safetensors": os.urandom(5000)}
NEWER = {"config.json": b'{"model_type": "tiny"}', "model.safetensors": os.urandom(6000)}
REPO = "org/signed"
NODE_OBJ = names.modelcachenode_name("signed", NODE)


@pytest.fixture
def env(tmp_path: Path, kube: RealKube) -> Iterator[Env]:
    yield from env_context(kube, tmp_path)


@pytest.fixture
def keys(tmp_path: Path) -> tuple[KeyPair, KeyPair]:
    """The platform's key before and after it was replaced (the first one withdrawn)."""
    return key_pair(tmp_path / "keys" / "old.key"), key_pair(tmp_path / "keys" / "new.key")


def _mount_trust(env: Env, key: KeyPair) -> None:
    """The chart's trust ConfigMap holding `key` under TRUST, as the kubelet mounts (or updates) it."""
    assert env.trust_dir is not None
    project(env.trust_dir, {trustpolicy.trust_file_name(TRUST, "publicKey"): key.cert_path.read_bytes()})


def _create_cache(env: Env, revision: str = "main") -> None:
    """A ModelCacheNode as the sync hook writes it for signature.publicKey.clusterTrust: platform."""
    obj = modelcachenode("signed", NODE, "team-a", source={"uri": f"hf://{REPO}", "revision": revision})
    obj["spec"]["verification"] = {
        "method": "publicKey",
        "path": names.DEFAULT_SIGNATURE_FILE,
        "clusterTrust": TRUST,
    }
    env.kube.create(obj)


def _ask(env: Env, revision: str) -> None:
    env.kube.patch(MCN, NODE_OBJ, {"spec": {"source": {"revision": revision}}}, "team-a")


def _record(path: Path) -> dict[str, Any]:
    signature: dict[str, Any] = json.loads((path / names.MANIFEST_FILE).read_text())[names.MANIFEST_SIGNATURE]
    return signature


def _retired(env: Env) -> list[str]:
    """The commits of the copies out of service kept under .praesto/retired."""
    root = env.layout.retired_root("team-a", "signed")
    return [commit_of(store.read_json(p / names.MANIFEST_FILE)) for p in sorted(root.iterdir())]


def _ready_at(env: Env, revision: str) -> bool:
    status = env.status("signed")
    return status.get("phase") == names.PHASE_READY and status.get("resolvedRevision") == revision


def _mount(env: Env, volume: str, revision: str) -> None:
    record = store.MountRecord(volume, "team-a", "signed", f"/pods/{volume}/volumes/m", time.time(), revision)
    CsiStore(env.layout).record_mount(record)


def _asked_origin(env: Env) -> bool:
    """The download asked the hub for the repo (its unchanged bytes may come from the node's blobs)."""
    return any(REPO in path for _method, path in env.hub.requests)


def _failed_signature(env: Env) -> dict[str, Any]:
    status = env.wait_reason("signed", names.REASON_SIGNATURE_INVALID)
    assert status["phase"] == names.PHASE_FAILED
    return status


def test_a_replaced_platform_key_takes_the_copy_out_of_service_and_it_is_fetched_again(
    env: Env, tmp_path: Path, keys: tuple[KeyPair, KeyPair]
) -> None:
    old, new = keys
    first = env.hub.add_repo(REPO, sign_with_key(FILES, old))
    env.trust_dir = tmp_path / "cluster-trust"
    _mount_trust(env, old)
    _create_cache(env)
    env.start()
    env.wait(lambda: _ready_at(env, first), "Ready under the old key")
    before = _record(env.layout.cache_dir("team-a", "signed"))
    assert before["trustFrom"].startswith(f"the platform's trust {TRUST!r}")
    _mount(env, "vol-running", first)  # a Pod reads the copy

    _mount_trust(env, new)  # the platform withdrew the old key; the kubelet updates the volume
    status = _failed_signature(env)  # the origin still serves the old signature: refused, not served
    message = status.get("message") or ready_condition(status).get("message", "")
    assert "signed by another key" in message
    assert not env.layout.is_complete("team-a", "signed")  # no new mount gets the old copy
    events = [e for e in env.kube.list("events", "team-a") if e["reason"] == names.REASON_SIGNATURE_INVALID]
    assert any("no longer served" in e["message"] and "replaced or withdrawn" in e["message"] for e in events)
    retired = env.layout.retired_root("team-a", "signed")
    assert _retired(env) == [first]  # out of service, kept only while its Pod reads it

    second = env.hub.commit(REPO, sign_with_key(FILES, new))  # the publisher signs again with the new key
    env.wait(lambda: _ready_at(env, second), "fetched again and verified under the new key")
    after = _record(env.layout.cache_dir("team-a", "signed"))
    assert after["trust"] != before["trust"] and after["signer"] != before["signer"]
    assert retired.exists()  # the running Pod still reads the old inode
    CsiStore(env.layout).drop_mount("vol-running")
    env.wait(lambda: not retired.exists(), "the withdrawn copy removed after its last mount")


def test_a_withdrawn_platform_trust_entry_takes_the_copy_out_and_says_so(
    env: Env, tmp_path: Path, keys: tuple[KeyPair, KeyPair]
) -> None:
    """The entry removed from verification.trust altogether: nothing verifies the copy any more, so it
    leaves Ready and waits for the trust, naming it (nothing is fetched unverified meanwhile)."""
    old, _new = keys
    first = env.hub.add_repo(REPO, sign_with_key(FILES, old))
    env.trust_dir = tmp_path / "cluster-trust"
    _mount_trust(env, old)
    _create_cache(env)
    env.start()
    env.wait(lambda: _ready_at(env, first), "Ready under the platform's key")
    project(env.trust_dir, {})
    status = env.wait_reason("signed", "WaitingForSecret")
    message = status.get("message") or ready_condition(status).get("message", "")
    assert f"clusterTrust {TRUST!r}" in message and "withdrawn" in message
    assert not env.layout.is_complete("team-a", "signed")


def test_an_agent_started_after_the_key_was_replaced_re_derives_every_copy(
    env: Env, tmp_path: Path, keys: tuple[KeyPair, KeyPair]
) -> None:
    old, new = keys
    first = env.hub.add_repo(REPO, sign_with_key(FILES, old))
    env.trust_dir = tmp_path / "cluster-trust"
    _mount_trust(env, old)
    _create_cache(env)
    agent = env.start()
    env.wait(lambda: _ready_at(env, first), "Ready under the old key")
    agent.stop()

    _mount_trust(env, new)  # replaced while no agent ran
    env.hub.reset_counters()
    env.start()
    _failed_signature(env)
    assert _asked_origin(env)  # planned and verified again, never served from what was on disk
    assert not env.layout.is_complete("team-a", "signed")


def test_a_revision_kept_for_rollback_is_not_rolled_back_to_under_a_replaced_key(
    env: Env, tmp_path: Path, keys: tuple[KeyPair, KeyPair]
) -> None:
    """first is retired by a switch (a Pod still mounts it), verified under the old key; after the
    key is replaced and the served revision fetched again under the new one, asking for first
    fetches it (and refuses it), where an unchanged key would move it back without a byte."""
    old, new = keys
    first = env.hub.add_repo(REPO, sign_with_key(FILES, old))
    second = env.hub.commit(REPO, sign_with_key(NEWER, old), branch="v2")
    env.trust_dir = tmp_path / "cluster-trust"
    _mount_trust(env, old)
    _create_cache(env, first)
    env.start()
    env.wait(lambda: _ready_at(env, first), "the first revision served")
    _mount(env, "vol-first", first)
    _ask(env, "v2")
    env.wait(lambda: _ready_at(env, second), "switched to the second revision", timeout=60)
    retired = env.layout.retired_root("team-a", "signed")
    served_trust = _record(env.layout.cache_dir("team-a", "signed"))["trust"]
    assert [_record(p)["trust"] for p in retired.iterdir()] == [served_trust]  # first, kept for its Pod

    third = env.hub.commit(REPO, sign_with_key(NEWER, new), branch="v2")  # v2 signed again
    _mount_trust(env, new)
    env.wait(lambda: _ready_at(env, third), "v2 fetched again under the new key", timeout=60)

    env.hub.reset_counters()
    _ask(env, first)  # a rollback to the revision still on disk, verified under the old key only
    env.wait(
        lambda: (env.status("signed").get("next") or {}).get("reason") == names.REASON_SIGNATURE_INVALID,
        "the rollback target fetched and refused",
        timeout=60,
    )
    assert _asked_origin(env)  # fetched (its bytes from the blobs) and verified, not moved back
    assert _ready_at(env, third)  # the served revision serves on
    assert first in _retired(env)  # still there for its Pod, never served again
