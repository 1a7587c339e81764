"""A copy's Ready state follows the trust material its cache names in its own namespace, as it is now
(issue 37 item 4; the platform's trust: test_agent_trust.py).

spec.verification's secretRef or configMapRef names one object; the tenant replacing the key in it
(same name, new content) changes no spec. The agent follows that object (agent/trust_material.py): a
ConfigMap by a watch of it alone, a Secret by a GET every TRUST_SECRET_RECHECK_SECONDS (here RECHECK,
short), so after the content changed no copy verified only under the old material
is served: the served copy leaves Ready and is fetched again and verified under the new material (or
fails SignatureInvalid while the origin still carries the old signature), at the next pass and at
agent start; a revision kept for rollback verified under the old material is not rolled back to
without a fetch; a deleted object takes the copy out naming it; an unchanged key (the object edited
elsewhere) changes nothing. Against the real API server and the local hub.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.rest import ApiException
from praesto.agent.copies import ref_of
from praesto.agent.credentials import required_signature, signature_policy
from praesto.agent.rolling import commit_of
from praesto.agent.trust_material import SecretRecheck, TrustObject, Unreadable, material_value
from praesto.csi.storefs import CsiStore

from praesto import names, store
from praesto.reflector import Backoff
from testkit.agent_harness import MCN, NODE, Env, env_context, ready_condition
from testkit.kube_real import RealKube
from testkit.objects import modelcachenode
from testkit.pki import KeyPair
from testkit.signed_models import key_pair, sign_with_key

FILES = {"config.json": b'{"model_type": "tiny"}', "model.safetensors": os.urandom(5000)}
NEWER = {"config.json": b'{"model_type": "tiny"}', "model.safetensors": os.urandom(6000)}
REPO = "org/signed"
KEY_OBJECT = "publisher-key"
NODE_OBJ = names.modelcachenode_name("signed", NODE)
RECHECK = 0.2  # seconds between GETs of a trust Secret (production: 300, TRUST_SECRET_RECHECK_SECONDS)


@pytest.fixture
def env(tmp_path: Path, kube: RealKube) -> Iterator[Env]:
    yield from env_context(kube, tmp_path)


@pytest.fixture
def keys(tmp_path: Path) -> tuple[KeyPair, KeyPair]:
    """The publisher's key before and after the tenant replaced it (the first one withdrawn)."""
    return key_pair(tmp_path / "keys" / "old.key"), key_pair(tmp_path / "keys" / "new.key")


def _pem(key: KeyPair) -> bytes:
    return key.cert_path.read_bytes()


def _put_key(env: Env, kind: str, key: KeyPair, **extra: str) -> None:
    """The tenant's Secret or ConfigMap holding `key` under key.pub: created, or replaced in place."""
    values = {"key.pub": _pem(key), **{k: v.encode() for k, v in extra.items()}}
    if kind == "Secret":
        body: dict[str, Any] = {"data": {k: base64.b64encode(v).decode() for k, v in values.items()}}
    else:
        body = {"data": {k: v.decode() for k, v in values.items()}}
    resource = "secrets" if kind == "Secret" else "configmaps"
    if env.kube.get(resource, KEY_OBJECT, "team-a") is None:
        meta = {"name": KEY_OBJECT, "namespace": "team-a"}
        env.kube.create({"apiVersion": "v1", "kind": kind, "metadata": meta, **body})
    else:
        env.kube.patch(resource, KEY_OBJECT, body, "team-a")


def _create_cache(env: Env, kind: str, revision: str = "main") -> None:
    """A ModelCacheNode as the sync hook writes it for signature.publicKey.secretRef (or configMapRef)."""
    obj = modelcachenode("signed", NODE, "team-a", source={"uri": f"hf://{REPO}", "revision": revision})
    field = "secretRef" if kind == "Secret" else "configMapRef"
    obj["spec"]["verification"] = {
        "method": "publicKey",
        "path": names.DEFAULT_SIGNATURE_FILE,
        field: {"name": KEY_OBJECT, "key": "key.pub"},
    }
    env.kube.create(obj)


def _record(path: Path) -> dict[str, Any]:
    signature: dict[str, Any] = json.loads((path / names.MANIFEST_FILE).read_text())[names.MANIFEST_SIGNATURE]
    return signature


def _ready_at(env: Env, revision: str) -> bool:
    status = env.status("signed")
    return status.get("phase") == names.PHASE_READY and status.get("resolvedRevision") == revision


def _asked_origin(env: Env) -> bool:
    return any(REPO in path for _method, path in env.hub.requests)


def _retired(env: Env) -> list[str]:
    root = env.layout.retired_root("team-a", "signed")
    return [commit_of(store.read_json(p / names.MANIFEST_FILE)) for p in sorted(root.iterdir())]


def _mount(env: Env, volume: str, revision: str) -> None:
    record = store.MountRecord(volume, "team-a", "signed", f"/pods/{volume}/volumes/m", time.time(), revision)
    CsiStore(env.layout).record_mount(record)


def _message(status: dict[str, Any]) -> str:
    return str(status.get("message") or ready_condition(status).get("message", ""))


@pytest.mark.parametrize("kind", ["Secret", "ConfigMap"])
def test_a_key_replaced_in_the_named_object_takes_the_copy_out_and_it_is_fetched_again(
    env: Env, kind: str, keys: tuple[KeyPair, KeyPair]
) -> None:
    old, new = keys
    first = env.hub.add_repo(REPO, sign_with_key(FILES, old))
    _put_key(env, kind, old)
    _create_cache(env, kind)
    env.start(trust_secret_recheck_seconds=RECHECK)
    env.wait(lambda: _ready_at(env, first), "Ready under the old key")
    before = _record(env.layout.cache_dir("team-a", "signed"))
    assert before["trustFrom"].startswith(f"{kind} team-a/{KEY_OBJECT} key key.pub")
    _mount(env, "vol-running", first)

    _put_key(env, kind, new)  # same object, new content: no spec changes
    status = env.wait_reason(
        "signed", names.REASON_SIGNATURE_INVALID
    )  # the origin still has the old signature
    assert status["phase"] == names.PHASE_FAILED and "signed by another key" in _message(status)
    assert not env.layout.is_complete("team-a", "signed")  # no new mount gets the old copy
    events = [e for e in env.kube.list("events", "team-a") if e["reason"] == names.REASON_SIGNATURE_INVALID]
    assert any(
        "no longer served" in e["message"] and f"{kind} team-a/{KEY_OBJECT}" in e["message"] for e in events
    )
    assert _retired(env) == [first]  # kept only while its Pod reads it

    second = env.hub.commit(REPO, sign_with_key(FILES, new))  # the publisher signs again with the new key
    env.wait(lambda: _ready_at(env, second), "fetched again and verified under the new key")
    after = _record(env.layout.cache_dir("team-a", "signed"))
    assert after["trust"] != before["trust"]


def test_an_unchanged_key_changes_nothing_when_the_object_is_edited(
    env: Env, keys: tuple[KeyPair, KeyPair]
) -> None:
    """Another key of the same ConfigMap changes: the watch delivers it, the fingerprint is the same,
    the copy stays Ready and nothing is fetched."""
    old, _new = keys
    first = env.hub.add_repo(REPO, sign_with_key(FILES, old))
    _put_key(env, "ConfigMap", old)
    _create_cache(env, "ConfigMap")
    agent = env.start()
    env.wait(lambda: _ready_at(env, first), "Ready under the key")
    trust = agent.reconciler.trust
    calls: list[str] = []
    read = trust.material

    def counted(namespace: str, wanted: Any) -> Any:
        found = read(namespace, wanted)
        calls.append(str(found)[:20])
        return found

    trust.material = counted  # type: ignore[method-assign]
    env.hub.reset_counters()
    edited = env.kube.patch("configmaps", KEY_OBJECT, {"data": {"README": "rotated nothing"}}, "team-a")
    version = edited["metadata"]["resourceVersion"]
    watch = trust._watches[TrustObject("ConfigMap", "team-a", KEY_OBJECT)]

    def seen() -> bool:
        held = watch.items.get(("team-a", KEY_OBJECT)) or {}
        return bool((held.get("metadata") or {}).get("resourceVersion") == version)

    env.wait(seen, "the watch delivered the edit")
    calls.clear()
    env.wait(lambda: len(calls) >= 3, "passes re-derived the copy from the edited object")
    assert _ready_at(env, first) and env.layout.is_complete("team-a", "signed")
    assert not _asked_origin(env)


def test_a_deleted_trust_object_takes_the_copy_out_and_says_which(
    env: Env, keys: tuple[KeyPair, KeyPair]
) -> None:
    old, _new = keys
    first = env.hub.add_repo(REPO, sign_with_key(FILES, old))
    _put_key(env, "Secret", old)
    _create_cache(env, "Secret")
    env.start(trust_secret_recheck_seconds=RECHECK)
    env.wait(lambda: _ready_at(env, first), "Ready under the key")
    env.kube.delete("secrets", KEY_OBJECT, "team-a")
    status = env.wait_reason("signed", "WaitingForSecret")
    assert f"Secret team-a/{KEY_OBJECT}" in _message(status)
    assert not env.layout.is_complete("team-a", "signed")


def test_an_agent_started_after_the_key_was_replaced_re_derives_the_copy(
    env: Env, keys: tuple[KeyPair, KeyPair]
) -> None:
    old, new = keys
    first = env.hub.add_repo(REPO, sign_with_key(FILES, old))
    _put_key(env, "Secret", old)
    _create_cache(env, "Secret")
    agent = env.start()
    env.wait(lambda: _ready_at(env, first), "Ready under the old key")
    agent.stop()

    _put_key(env, "Secret", new)  # replaced while no agent ran
    env.hub.reset_counters()
    env.start()  # the default period (300 s): the GET made when the copy is first named gives the new key
    env.wait_reason("signed", names.REASON_SIGNATURE_INVALID)
    assert _asked_origin(env)  # planned and verified again, never served from what was on disk
    assert not env.layout.is_complete("team-a", "signed")


def test_a_revision_kept_for_rollback_is_not_rolled_back_to_under_a_replaced_key(
    env: Env, keys: tuple[KeyPair, KeyPair]
) -> None:
    old, new = keys
    first = env.hub.add_repo(REPO, sign_with_key(FILES, old))
    second = env.hub.commit(REPO, sign_with_key(NEWER, old), branch="v2")
    _put_key(env, "Secret", old)
    _create_cache(env, "Secret", first)
    env.start(trust_secret_recheck_seconds=RECHECK)
    env.wait(lambda: _ready_at(env, first), "the first revision served")
    _mount(env, "vol-first", first)
    env.kube.patch(MCN, NODE_OBJ, {"spec": {"source": {"revision": "v2"}}}, "team-a")
    env.wait(lambda: _ready_at(env, second), "switched to the second revision", timeout=60)
    assert _retired(env) == [first]

    third = env.hub.commit(REPO, sign_with_key(NEWER, new), branch="v2")  # v2 signed again
    _put_key(env, "Secret", new)
    env.wait(lambda: _ready_at(env, third), "v2 fetched again under the new key", timeout=60)

    env.hub.reset_counters()
    env.kube.patch(MCN, NODE_OBJ, {"spec": {"source": {"revision": first}}}, "team-a")  # roll back
    env.wait(
        lambda: (env.status("signed").get("next") or {}).get("reason") == names.REASON_SIGNATURE_INVALID,
        "the rollback target fetched and refused",
        timeout=60,
    )
    assert _asked_origin(env)  # fetched and verified, not moved back
    assert _ready_at(env, third)
    assert first in _retired(env)  # still there for its Pod, never served again


class _Objects:
    """What the download reads (agent/kube.py read_secret_value, read_config_map_value) from the
    same object the watch holds: both must give one fingerprint, or every copy would be refetched."""

    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj = obj

    def read_secret_value(self, namespace: str, secret: str, key: str, what: str) -> bytes:
        return base64.b64decode(self.obj["data"][key])

    def read_config_map_value(self, namespace: str, config_map: str, key: str, what: str) -> bytes:
        return str(self.obj["data"][key]).encode()


@pytest.mark.parametrize("kind", ["Secret", "ConfigMap"])
def test_the_watch_and_the_download_give_the_same_fingerprint(tmp_path: Path, kind: str) -> None:
    pem = _pem(key_pair(tmp_path / "k.key"))
    value = base64.b64encode(pem).decode() if kind == "Secret" else pem.decode()
    data = {"key.pub": value}
    obj: dict[str, Any] = {
        "kind": kind,
        "metadata": {"name": KEY_OBJECT, "namespace": "team-a"},
        "data": data,
    }
    node = modelcachenode("signed", NODE, "team-a", source={"uri": f"hf://{REPO}", "revision": "main"})
    field = "secretRef" if kind == "Secret" else "configMapRef"
    node["spec"]["verification"] = {
        "method": "publicKey",
        "path": "model.sig",
        field: {"name": KEY_OBJECT, "key": "key.pub"},
    }
    ref = ref_of(node)
    held = material_value(kind, data, "key.pub")
    watched = required_signature(ref, {}, lambda _ns, _wanted: held)
    downloaded = signature_policy(_Objects(obj), ref, {})  # type: ignore[arg-type]
    assert watched is not None and downloaded is not None
    assert watched.trust == downloaded.trust and watched.trust.startswith("sha256:")
    assert watched.origin == downloaded.origin
    gone = required_signature(ref, {}, lambda _ns, _wanted: Unreadable("deleted"))
    assert gone is not None and gone.trust == store.TRUST_WITHDRAWN
    assert gone.origin.startswith(f"{kind} team-a/{KEY_OBJECT} key key.pub") and "deleted" in gone.origin
    unknown = required_signature(ref, {}, lambda _ns, _wanted: None)
    assert unknown is not None and unknown.trust == ""  # not read yet: method and path only


def test_a_trust_secret_re_read_wakes_the_reconciler_only_when_it_changed() -> None:
    """Every GET of an unchanged Secret costs the reconciler nothing; new content, a deletion or a
    refusal (the grant gone) wakes it; a missing Secret or a failed read is read again on the backoff,
    not a period later."""
    answers: list[Any] = [{"key.pub": "QQ=="}, {"key.pub": "QQ=="}, {"key.pub": "Qg=="}, None, None]
    wakes: list[int] = []

    def read() -> dict[str, str] | None:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return dict(answer) if answer is not None else None

    obj = TrustObject("Secret", "team-a", KEY_OBJECT)
    log = logging.LoggerAdapter(logging.getLogger("test"))
    recheck = SecretRecheck(obj, read, lambda: wakes.append(1), 300.0, Backoff(0.05, 0.5), log)
    assert recheck.step() == 300.0 and len(wakes) == 1  # first read: now known
    assert recheck.step() == 300.0 and len(wakes) == 1  # same content: nothing to do
    recheck.step()
    assert len(wakes) == 2 and recheck.items[("team-a", KEY_OBJECT)]["data"] == {"key.pub": "Qg=="}
    assert recheck.step() <= 0.5 and len(wakes) == 3 and recheck.items == {}  # deleted: looked for again soon
    assert recheck.step() <= 0.5 and len(wakes) == 3
    answers.append(ApiException(status=403, reason="Forbidden"))
    assert recheck.step() <= 0.5 and len(wakes) == 4 and "(403)" in recheck.last_error
    answers.append(ApiException(status=500, reason="Internal"))
    assert recheck.step() <= 0.5 and len(wakes) == 5  # no longer refused: the deletion stands again
