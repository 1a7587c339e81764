"""The node agent with s3:// caches: credentials from the cache's Secret (and the chart's).

Real moto S3 server (IAM auth on) and the real API server; the Secret is read per attempt,
so creating it late, or fixing its contents, needs no re-apply.
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from praesto.csi.storefs import CsiStore

from praesto import names, store
from testkit.agent_harness import MCN, Env, dump_api, env_context, tree
from testkit.kube_real import RealKube
from testkit.s3server import S3Server, private_bucket_endpoint

FILES = {"config.json": b'{"a": 1}', "w.bin": os.urandom(3 << 20)}


@pytest.fixture
def env(tmp_path: Path, kube: RealKube) -> Iterator[Env]:
    yield from env_context(kube, tmp_path)


@pytest.fixture
def s3(tmp_path: Path) -> Iterator[tuple[S3Server, tuple[str, str]]]:
    with S3Server(tmp_path / "moto", auth_actions=3) as server:
        key = server.create_key()
        client = server.client(key)
        client.create_bucket(Bucket="models")
        for path, data in FILES.items():
            client.put_object(Bucket="models", Key=f"m/{path}", Body=data)
        yield server, key


def _secret(env: Env, name: str, data: dict[str, str], annotations: dict[str, str] | None = None) -> None:
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    metadata: dict[str, Any] = {"name": name, "namespace": "team-a", "annotations": annotations or {}}
    if env.kube.get("secrets", name, "team-a") is None:
        env.kube.create({"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "data": encoded})
    else:
        env.kube.patch(
            "secrets", name, {"data": encoded, "metadata": {"annotations": annotations or {}}}, "team-a"
        )


def _mcn(env: Env, cache: str, uri: str, secret: str | None) -> None:
    source: dict[str, Any] = {"uri": uri}
    if secret:
        source["secretRef"] = {"name": secret}
    env.kube.create(
        {
            "apiVersion": names.API_VERSION,
            "kind": names.MODELCACHENODE_KIND,
            "metadata": {
                "name": names.modelcachenode_name(cache, "node-a"),
                "namespace": "team-a",
                "labels": {
                    names.LABEL_NODE: names.node_label_value("node-a"),
                    names.LABEL_MODEL_CACHE: cache,
                },
            },
            "spec": {"modelCacheName": cache, "nodeName": "node-a", "source": source, "size": "1Gi"},
        }
    )


def test_s3_cache_waits_for_its_secret_then_its_credentials_then_downloads(
    env: Env, s3: tuple[S3Server, tuple[str, str]]
) -> None:
    server, key = s3
    _mcn(env, "llm", "s3://models/m", "s3-creds")
    env.start()
    status = env.wait_reason("llm", "WaitingForSecret")
    assert status["phase"] == names.PHASE_PENDING and "team-a/s3-creds not found" in status["message"]

    with private_bucket_endpoint() as refusing:  # the Secret exists but holds no key yet
        _secret(env, "s3-creds", {"AWS_ENDPOINT_URL": refusing})
        status = env.wait_reason("llm", "WaitingForCredentials")
    assert status["phase"] == names.PHASE_PENDING and "spec.source.secretRef" in status["message"]

    # KServe-style annotations for the endpoint, keys in data: fixed in place, no re-apply
    host = server.endpoint.removeprefix("http://")
    annotations = {"serving.kserve.io/s3-endpoint": host, "serving.kserve.io/s3-usehttps": "0"}
    _secret(env, "s3-creds", {"AWS_ACCESS_KEY_ID": key[0], "AWS_SECRET_ACCESS_KEY": key[1]}, annotations)
    env.kube.patch("secrets", "s3-creds", {"data": {"AWS_ENDPOINT_URL": None}}, "team-a")
    status = env.wait_phase("llm", names.PHASE_READY)
    assert tree(env.layout.cache_dir("team-a", "llm")) == FILES
    assert len(status["resolvedRevision"]) == 64

    api = dump_api(env.kube)
    for value in key:
        assert value not in api and value not in env.log.getvalue()
        for path in env.base.rglob("*"):
            if path.is_file() and path.stat().st_size < 1 << 20:
                assert value.encode() not in path.read_bytes(), path
    reads = {(r.verb, r.namespace, r.name) for r in env.kube.requests if r.resource == "secrets"}
    assert reads == {("get", "team-a", "s3-creds")}


def test_wrong_key_is_unauthorized_and_the_chart_secret_is_the_fallback(
    env: Env, s3: tuple[S3Server, tuple[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, key = s3
    _secret(env, "bad", {"AWS_ACCESS_KEY_ID": "AKIAWRONGWRONG00", "AWS_SECRET_ACCESS_KEY": "wrong-secret-value-xyz",
                         "AWS_ENDPOINT_URL": server.endpoint})  # fmt: skip
    _secret(env, "cluster-creds", {"AWS_ACCESS_KEY_ID": key[0], "AWS_SECRET_ACCESS_KEY": key[1],
                                   "AWS_ENDPOINT_URL": server.endpoint})  # fmt: skip
    monkeypatch.setenv("PRAESTO_CREDENTIALS_SECRET", "team-a/cluster-creds")
    monkeypatch.setenv("PRAESTO_CREDENTIALS_NAMESPACES", "team-a")  # the platform admin opted team-a in
    _mcn(env, "own", "s3://models/m", "bad")  # the cache's own Secret wins, even when wrong
    _mcn(env, "shared", "s3://models/m", None)  # no secretRef: the chart's credentials Secret
    env.start()
    status = env.wait_reason("own", "Unauthorized")
    assert status["phase"] == names.PHASE_FAILED and "InvalidAccessKeyId" in status["message"]
    assert "wrong-secret-value-xyz" not in str(status) and "wrong-secret-value-xyz" not in env.log.getvalue()
    env.wait_phase("shared", names.PHASE_READY)
    assert env.kube.get(MCN, names.modelcachenode_name("shared", "node-a"), "team-a") is not None


@pytest.mark.parametrize(
    ("namespaces", "sources"),
    [
        # Multi-tenant finding 2: any namespace could download what the organisation's credential reads.
        ("some-other-team", ""),
        # An opted-in namespace still reaches only the prefixes in the chart's credentials.sources.
        ("team-a", "s3://models/shared/, hf://team-a-org/"),
    ],
    ids=["namespace-not-opted-in", "source-outside-the-listed-prefixes"],
)
def test_the_cluster_secret_is_never_read_for_a_cache_outside_its_scope(
    env: Env,
    s3: tuple[S3Server, tuple[str, str]],
    monkeypatch: pytest.MonkeyPatch,
    namespaces: str,
    sources: str,
) -> None:
    server, key = s3
    _secret(env, "cluster-creds", {"AWS_ACCESS_KEY_ID": key[0], "AWS_SECRET_ACCESS_KEY": key[1],
                                   "AWS_ENDPOINT_URL": server.endpoint})  # fmt: skip
    monkeypatch.setenv("PRAESTO_CREDENTIALS_SECRET", "team-a/cluster-creds")
    monkeypatch.setenv("PRAESTO_CREDENTIALS_NAMESPACES", namespaces)
    monkeypatch.setenv("PRAESTO_CREDENTIALS_SOURCES", sources)
    _mcn(env, "borrowed", "s3://models/m", None)
    env.start()
    env.wait(
        lambda: env.status("borrowed").get("phase") == names.PHASE_FAILED, "an anonymous attempt to fail"
    )
    reads = {(r.namespace, r.name) for r in env.kube.requests if r.resource == "secrets"}
    assert ("team-a", "cluster-creds") not in reads  # never even read for this cache


def test_cluster_credentials_allowed_reads_namespaces_and_prefixes(monkeypatch: pytest.MonkeyPatch) -> None:
    from praesto.agent.credentials import CredentialPolicy

    monkeypatch.setenv("PRAESTO_CREDENTIALS_NAMESPACES", "team-a, team-b")
    cluster_credentials_allowed = CredentialPolicy.from_env(os.environ).entitled  # read once, at start
    assert cluster_credentials_allowed("team-a", "s3://anything/")
    assert not cluster_credentials_allowed("team-c", "s3://anything/")
    monkeypatch.setenv("PRAESTO_CREDENTIALS_SOURCES", "s3://models/shared/,hf://org/")
    cluster_credentials_allowed = CredentialPolicy.from_env(os.environ).entitled  # a restart reads it again
    assert cluster_credentials_allowed("team-b", "s3://models/shared/llama/")
    assert cluster_credentials_allowed("team-b", "hf://org/model")
    assert not cluster_credentials_allowed("team-b", "s3://models/private/")
    assert not cluster_credentials_allowed("team-b", "hf://organisation-evil/model")


def test_a_new_prefix_in_the_bucket_rolls_beside_and_unchanged_objects_are_linked_not_fetched(
    env: Env, s3: tuple[S3Server, tuple[str, str]]
) -> None:
    """Issue #25 part 1 for object stores: the prefix is the version. The new one is fetched beside the
    served copy, objects whose store MD5 did not change are linked to the blobs the old copy holds (one
    inode in both), the switch keeps the mounted old copy until its Pod ends, then it goes."""
    server, key = s3
    client = server.client(key)
    shared, old, new = os.urandom(1 << 20), os.urandom(5000), os.urandom(7000)
    for prefix, weights in (("v1", old), ("v2", new)):
        for path, data in {"shared.bin": shared, "w.bin": weights}.items():
            client.put_object(Bucket="models", Key=f"roll/{prefix}/{path}", Body=data)
    _secret(env, "s3-creds", {"AWS_ACCESS_KEY_ID": key[0], "AWS_SECRET_ACCESS_KEY": key[1],
                              "AWS_ENDPOINT_URL": server.endpoint})  # fmt: skip
    _mcn(env, "roll", "s3://models/roll/v1", "s3-creds")
    env.start()
    first = env.wait_phase("roll", names.PHASE_READY)
    assert first["revision"] == "models/roll/v1" and len(first["resolvedRevision"]) == 64
    CsiStore(env.layout).record_mount(
        store.MountRecord(
            "vol-old", "team-a", "roll", "/pods/old/volumes/m", time.time(), first["resolvedRevision"]
        )
    )  # a Pod reads the first version

    name = names.modelcachenode_name("roll", "node-a")
    env.kube.patch(MCN, name, {"spec": {"source": {"uri": "s3://models/roll/v2"}}}, "team-a")
    env.wait(lambda: env.status("roll").get("revision") == "models/roll/v2", "the switch", timeout=60)
    status = env.status("roll")
    assert status["phase"] == names.PHASE_READY and status["resolvedRevision"] != first["resolvedRevision"]
    served = env.layout.cache_dir("team-a", "roll")
    assert tree(served) == {"shared.bin": shared, "w.bin": new}
    retired = env.layout.retired_root("team-a", "roll")
    kept = list(retired.iterdir())
    assert len(kept) == 1 and tree(kept[0]) == {"shared.bin": shared, "w.bin": old}  # still mounted
    assert (
        os.stat(kept[0] / "shared.bin").st_ino == os.stat(served / "shared.bin").st_ino
    )  # not fetched again

    CsiStore(env.layout).drop_mount("vol-old")  # the Pod ended
    env.wait(lambda: not retired.exists(), "the retired version removed")
