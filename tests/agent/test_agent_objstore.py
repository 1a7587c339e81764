"""The node agent with s3:// caches: credentials from the cache's Secret (and the chart's).

Real moto S3 server (IAM auth on) and the real API server; the Secret is read per attempt,
so creating it late, or fixing its contents, needs no re-apply.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from praesto import names
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
