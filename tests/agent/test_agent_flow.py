"""Agent ↔ API through the real `kubernetes` client against the real API server, bytes from the local hub."""

from __future__ import annotations

import os
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from praesto.csi.storefs import CsiStore

from praesto import names, store
from testkit.agent_harness import MCN, Env, env_context, ready_condition, tree
from testkit.kube_real import RealKube

LFS = os.urandom(5000)
SMALL = b'{"model_type": "tiny"}'


@pytest.fixture
def env(tmp_path: Path, kube: RealKube) -> Iterator[Env]:
    yield from env_context(kube, tmp_path)


def test_download_to_ready_with_status_and_metrics(env: Env) -> None:
    commit = env.add_model("tiny", **{"config.json": SMALL, "weights__model.safetensors": LFS})
    env.create_mcn("tiny", size="6Ki")
    agent = env.start()
    status = env.wait_phase("tiny", names.PHASE_READY)

    obj = env.get("tiny")
    assert obj is not None
    assert names.FINALIZER_NODE_AGENT in obj["metadata"]["finalizers"]
    cache_dir = env.layout.cache_dir("team-a", "tiny")
    assert tree(cache_dir) == {"config.json": SMALL, "weights/model.safetensors": LFS}
    total = len(SMALL) + len(LFS)
    assert status["localPath"] == str(cache_dir)
    assert status["resolvedRevision"] == commit
    assert status["sizeBytes"] == total
    assert status["progress"] == {"bytesDone": total, "bytesTotal": total}
    assert status["observedGeneration"] == 1
    ready = ready_condition(status)
    assert (ready["status"], ready["reason"]) == ("True", "Cached")
    size = next(c for c in status["conditions"] if c["type"] == "SizeWithinRequest")
    assert (size["status"], size["reason"]) == ("True", "SizeWithinRequest")

    assert env.metric("praesto_agent_downloaded_bytes_total", origin="source") == total
    assert env.metric("praesto_agent_cache_hits_total") == 0
    port = agent.metrics.serve(0, "127.0.0.1")
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "praesto_agent_download_duration_seconds_count 1.0" in text
    assert "praesto_agent_downloads_in_flight 0.0" in text
    assert '"namespace": "team-a", "cache": "tiny"' in env.log.getvalue()


def test_complete_copy_on_disk_is_a_cache_hit(env: Env) -> None:
    env.add_model("tiny", **{"config.json": SMALL})
    env.create_mcn("tiny")
    env.start()
    env.wait_phase("tiny", names.PHASE_READY)
    assert env.agent is not None
    env.agent.stop()
    env.kube.patch(MCN, names.modelcachenode_name("tiny", "node-a"), {"status": None}, "team-a", "status")
    env.hub.reset_counters()
    env.start()
    env.wait_phase("tiny", names.PHASE_READY)
    assert env.metric("praesto_agent_cache_hits_total") == 1
    assert env.hub.bytes_served == 0


def test_deletion_removes_the_directory_then_the_finalizer(env: Env) -> None:
    env.add_model("tiny", **{"config.json": SMALL, "w.bin": LFS})
    env.create_mcn("tiny")
    env.start()
    env.wait_phase("tiny", names.PHASE_READY)
    cache_dir = env.layout.cache_dir("team-a", "tiny")
    assert cache_dir.is_dir()
    name = names.modelcachenode_name("tiny", "node-a")
    # hold the finalizer removal, to observe the state in between
    env.kube.fail_next(10**6, 500, lambda r: r.verb == "patch" and r.resource == names.MODELCACHENODE_PLURAL)
    env.kube.delete(MCN, name, "team-a")
    env.wait(lambda: not cache_dir.exists(), "cache directory removed")
    held = env.get("tiny")
    assert held is not None and names.FINALIZER_NODE_AGENT in held["metadata"]["finalizers"]
    env.kube.clear_faults()
    env.wait(lambda: env.get("tiny") is None, "finalizer removed and object gone")
    assert env.base.is_dir()  # never anything outside the cache's own directories
    assert not env.layout.staging_dir("team-a", "tiny").exists()
    blobs = env.layout.blobs_dir
    assert not blobs.is_dir() or list(blobs.iterdir()) == []  # its content-addressed copies went too


def test_other_nodes_objects_are_ignored(env: Env) -> None:
    env.add_model("tiny", **{"config.json": SMALL})
    env.create_mcn("tiny", node="node-b")
    env.create_mcn("tiny", namespace="team-b")
    env.start()
    env.wait_phase("tiny", names.PHASE_READY, namespace="team-b")
    other = env.get("tiny", node="node-b")
    assert other is not None
    assert "finalizers" not in other["metadata"] and "status" not in other
    assert not env.layout.cache_dir("team-a", "tiny").exists()
    watches = [r for r in env.kube.requests if r.verb in ("list", "watch")]
    assert watches and all(r.query["labelSelector"] == f"{names.LABEL_NODE}=node-a" for r in watches)


def test_base_path_missing_is_reported_not_created(tmp_path: Path, kube: RealKube) -> None:
    base = tmp_path / "missing"
    for env in env_context(kube, tmp_path, base):
        env.add_model("tiny", **{"config.json": SMALL})
        env.create_mcn("tiny")
        env.start()
        status = env.wait_reason("tiny", "BasePathMissing")
        assert status["phase"] == names.PHASE_FAILED
        assert str(base) in status["message"]
        assert not base.exists()
        base.mkdir()  # the admin fixes the node: the agent carries on by itself
        env.wait_phase("tiny", names.PHASE_READY)


def test_waiting_for_secret_then_private_repo_with_token(env: Env) -> None:
    token = "hf_" + os.urandom(12).hex()
    env.hub.tokens.add(token)
    env.hub.add_repo("org/private", {"config.json": SMALL, "w.bin": LFS}, private=True)
    env.create_mcn("private", secret=("hf-token", "HF_TOKEN"))
    env.start()
    status = env.wait_reason("private", "WaitingForSecret")
    assert status["phase"] == names.PHASE_PENDING
    assert "team-a/hf-token" in status["message"]
    env.create_secret("team-a", "hf-token", "HF_TOKEN", token)
    env.wait_phase("private", names.PHASE_READY)
    assert tree(env.layout.cache_dir("team-a", "private"))["w.bin"] == LFS
    secret_reads = [r for r in env.kube.requests if r.resource == "secrets"]
    assert {(r.verb, r.namespace, r.name) for r in secret_reads} == {("get", "team-a", "hf-token")}
    from testkit.agent_harness import dump_api

    assert token not in dump_api(env.kube)
    assert token not in env.log.getvalue()
    for path in env.base.rglob("*"):
        if path.is_file() and path.stat().st_size < 1 << 20:
            assert token.encode() not in path.read_bytes(), path


def test_wrong_token_fails_with_unauthorized_and_retries(env: Env) -> None:
    env.hub.add_repo("org/private", {"config.json": SMALL}, private=True)
    env.create_secret("team-a", "hf-token", "HF_TOKEN", "hf_wrong")
    env.create_mcn("private", secret=("hf-token", "HF_TOKEN"))
    env.start()
    status = env.wait_reason("private", "Unauthorized")
    assert status["phase"] == names.PHASE_FAILED
    assert "retrying in" in status["message"]
    assert "hf_wrong" not in env.log.getvalue() and "hf_wrong" not in str(status)
    assert env.metric("praesto_agent_download_failures_total", reason="Unauthorized") >= 1


def test_missing_repo_fails_then_recovers_when_it_appears(env: Env) -> None:
    env.create_mcn("later")
    env.start()
    status = env.wait_reason("later", "Unauthorized")  # what the Hub answers for an unknown repo
    assert status["phase"] == names.PHASE_FAILED and "retrying in" in status["message"]
    events = [e for e in env.kube.list("events", "team-a") if e["reason"] == "Unauthorized"]
    assert len(events) == 1 and events[0]["type"] == "Warning"  # retries do not repeat the event
    env.add_model("later", **{"config.json": SMALL})
    env.wait_phase("later", names.PHASE_READY)


def test_progress_is_reported_and_rate_limited(env: Env) -> None:
    size = 3 << 20  # the downloader reports progress per 1 MiB read
    env.add_model("slow", **{"w.bin": os.urandom(size)})
    env.hub.faults.rate = 3 << 19  # bytes/s per response: about two seconds
    env.create_mcn("slow")
    env.start(progress_seconds=0.5, concurrency=1)
    env.wait(
        lambda: (
            env.status("slow").get("phase") == names.PHASE_DOWNLOADING
            and 0 < env.status("slow")["progress"]["bytesDone"] < size
        ),
        "partial progress in status",
    )
    progress = store.read_progress(env.layout, "team-a", "slow")
    assert progress is not None and progress.phase == names.PHASE_DOWNLOADING
    assert re.fullmatch(r"downloading \d+% of 3\.0 MiB(, ~\d+s left)?", progress.message)
    assert progress.bytes_total == size
    started = time.monotonic()
    env.wait_phase("slow", names.PHASE_READY)
    took = time.monotonic() - started
    patches = [r for r in env.kube.requests if r.resource == f"{names.MODELCACHENODE_PLURAL}/status"]
    assert len(patches) <= 6 + took / 0.5, (len(patches), took)
    assert store.read_progress(env.layout, "team-a", "slow") is None  # Ready: the CSI driver mounts


def test_deleting_during_a_download_cancels_it_and_cleans_up(env: Env) -> None:
    env.add_model("slow", **{"w.bin": os.urandom(4 << 20)})
    env.hub.faults.rate = 1 << 19  # eight seconds
    neighbour = env.base / "team-a" / "not-ours"
    neighbour.mkdir(parents=True)
    (neighbour / "keep.txt").write_text("x")
    (env.base / "stray-file").write_text("y")
    env.create_mcn("slow")
    env.start(concurrency=1)
    env.wait(lambda: env.status("slow").get("phase") == names.PHASE_DOWNLOADING, "download started")
    started = time.monotonic()
    env.kube.delete(MCN, names.modelcachenode_name("slow", "node-a"), "team-a")
    env.wait(lambda: env.get("slow") is None, "object released", timeout=10)
    assert time.monotonic() - started < 6  # cancelled, not waited out
    assert not env.layout.cache_dir("team-a", "slow").exists()
    assert not env.layout.staging_dir("team-a", "slow").exists()
    assert store.read_progress(env.layout, "team-a", "slow") is None
    assert (neighbour / "keep.txt").read_text() == "x" and (env.base / "stray-file").exists()


def test_deletion_waits_for_mounts_to_end(env: Env) -> None:
    env.add_model("tiny", **{"config.json": SMALL})
    env.create_mcn("tiny")
    env.start()
    env.wait_phase("tiny", names.PHASE_READY)
    record = store.MountRecord("vol-1", "team-a", "tiny", "/pods/x/volumes/m", time.time())
    CsiStore(env.layout).record_mount(record)
    env.kube.delete(MCN, names.modelcachenode_name("tiny", "node-a"), "team-a")
    env.wait(lambda: "waiting for 1 Pod mount" in env.status("tiny").get("message", ""), "deletion held")
    assert env.layout.is_complete("team-a", "tiny")
    CsiStore(env.layout).drop_mount("vol-1")  # the CSI driver unpublishes
    env.wait(lambda: env.get("tiny") is None, "object released")
    assert not env.layout.cache_dir("team-a", "tiny").exists()


def test_agent_calls_only_what_rbac_grants(env: Env) -> None:
    from kubernetes import client

    from testkit.agent_harness import rbac_violations

    env.hub.tokens.add("hf_tok")
    env.hub.add_repo("org/private", {"config.json": SMALL}, private=True)
    env.create_secret("team-a", "tok", "HF_TOKEN", "hf_tok")
    env.create_mcn("private", secret=("tok", "HF_TOKEN"))
    env.start()
    env.wait_phase("private", names.PHASE_READY)
    env.kube.delete(MCN, names.modelcachenode_name("private", "node-a"), "team-a")
    env.wait(lambda: env.get("private") is None, "deleted")
    used = {(r.verb, r.resource) for r in env.kube.requests}
    assert {
        ("list", names.MODELCACHENODE_PLURAL),
        ("watch", names.MODELCACHENODE_PLURAL),
        ("patch", names.MODELCACHENODE_PLURAL),
        ("patch", f"{names.MODELCACHENODE_PLURAL}/status"),
        ("get", "secrets"),
        ("create", "events"),
    } <= used
    assert rbac_violations(env.kube.requests) == []
    # the checker is not vacuous: a cluster-wide Secret list would be flagged
    mark = len(env.kube.requests)
    client.CoreV1Api(env.kube.api_client()).list_secret_for_all_namespaces()
    assert [(r.verb, r.resource) for r in rbac_violations(env.kube.requests[mark:])] == [("list", "secrets")]
    env.kube.clear_requests()


def test_same_content_in_two_caches_is_linked_not_downloaded(env: Env) -> None:
    env.add_model("first", **{"w.bin": LFS})
    env.add_model("second", **{"w.bin": LFS, "extra.json": SMALL})
    env.create_mcn("first")
    env.start(max_parallel_caches=1)
    env.wait_phase("first", names.PHASE_READY)
    env.create_mcn("second")
    env.wait_phase("second", names.PHASE_READY)
    assert env.metric("praesto_agent_downloaded_bytes_total", origin="dedup") == len(LFS)
    assert env.metric("praesto_agent_downloaded_bytes_total", origin="source") == len(LFS) + len(SMALL)
    a = env.layout.cache_dir("team-a", "first") / "w.bin"
    b = env.layout.cache_dir("team-a", "second") / "w.bin"
    assert a.stat().st_ino == b.stat().st_ino
