"""download()/plan() against the local hub: integrity, atomicity, retries, dedup, resume."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

import pytest
from praesto.agent.download import DownloadCancelled, DownloadError, Options
from praesto.agent.download.api import PartSources, Result
from praesto.agent.download.arrivals import Arrivals
from praesto.agent.download.fetch import download, plan
from praesto.agent.download.publish import SHARING, add_to_blobs
from praesto.agent.eviction import gc_blobs

from praesto import names
from praesto.spec import Source
from praesto.store import StoreLayout
from testkit.egress import LOOPBACK
from testkit.hub import LocalHub
from tests.download.conftest import MiB, options_for, sample_files, tree_of


def _src(repo: str = "org/model", revision: str = "main", **kw: tuple[str, ...]) -> Source:
    return Source("hf", repo, revision, kw.get("allow", ()), kw.get("ignore", ()))


def test_happy_path_publishes_identical_files_manifest_and_markers_last(
    hub: LocalHub, tmp_path: Path
) -> None:
    files = sample_files()
    commit = hub.add_repo("org/model", files)
    seen: list[tuple[int, int]] = []
    options = options_for(hub, progress=lambda d, t: seen.append((d, t)), staging_dir=tmp_path / "stage")
    resolved = plan(_src(), options)
    assert resolved.revision == commit
    assert resolved.total_bytes == sum(len(v) for v in files.values())
    dest = tmp_path / "store" / "ns" / "model"
    result = download(resolved, dest, options)

    assert tree_of(dest) == files
    assert result.bytes_from_origin == resolved.total_bytes
    assert not (tmp_path / "stage").exists()
    manifest = json.loads((dest / names.MANIFEST_FILE).read_text())
    assert manifest["source"] == "hf://org/model"
    assert manifest["resolvedRevision"] == commit
    assert {f["path"]: (f["size"], f["sha256"]) for f in manifest["files"]} == {
        k: (len(v), hashlib.sha256(v).hexdigest()) for k, v in files.items()
    }
    complete = (dest / names.COMPLETE_FILE).stat().st_mtime_ns
    for path in dest.rglob("*"):
        assert path.stat().st_mtime_ns <= complete, path
        if path.is_file():
            assert path.stat().st_mode & 0o777 == 0o444, path
    done = [d for d, _ in seen]
    assert done == sorted(done) and seen[-1] == (resolved.total_bytes, resolved.total_bytes)


def test_second_download_of_published_dest_is_a_no_op(hub: LocalHub, tmp_path: Path) -> None:
    hub.add_repo("org/model", sample_files())
    options = options_for(hub)
    resolved = plan(_src(), options)
    download(resolved, tmp_path / "m", options)
    hub.reset_counters()
    again = download(resolved, tmp_path / "m", options)
    assert again.bytes_from_origin == 0 and hub.bytes_served == 0


def test_revision_pinning_branch_tag_and_commit(hub: LocalHub, tmp_path: Path) -> None:
    first = hub.add_repo("org/model", {"a.txt": b"one", "w.bin": os.urandom(5000)})
    hub.tag("org/model", "v1", first)
    second = hub.commit("org/model", {"a.txt": b"two"})
    options = options_for(hub)
    for revision, commit, content in [
        ("main", second, b"two"),
        ("v1", first, b"one"),
        (first, first, b"one"),
    ]:
        resolved = plan(_src(revision=revision), options)
        assert resolved.revision == commit
        dest = tmp_path / revision
        download(resolved, dest, options)
        assert (dest / "a.txt").read_bytes() == content
        assert json.loads((dest / names.MANIFEST_FILE).read_text())["resolvedRevision"] == commit
    with pytest.raises(DownloadError) as info:
        plan(_src(revision="no-such-branch"), options)
    assert info.value.reason == "RevisionNotFound" and "no-such-branch" in info.value.message


def test_private_repo_needs_a_valid_token(hub: LocalHub, tmp_path: Path) -> None:
    hub.add_repo("org/secret", {"w.bin": os.urandom(4000)}, private=True)
    hub.tokens.add("hf_good")
    for token in (None, "hf_bad"):
        with pytest.raises(DownloadError) as info:
            plan(_src("org/secret"), options_for(hub, token=token))
        assert info.value.reason == "Unauthorized"
        assert "hf_bad" not in info.value.message
    options = options_for(hub, token="hf_good")
    download(plan(_src("org/secret"), options), tmp_path / "m", options)
    assert (tmp_path / "m" / "w.bin").stat().st_size == 4000
    with pytest.raises(DownloadError) as missing:
        plan(_src("org/absent"), options)
    assert missing.value.reason == "RepoNotFound"


def test_gated_repo_is_refused_at_plan_time_until_access_is_granted(hub: LocalHub, tmp_path: Path) -> None:
    hub.add_repo("org/gated", {"w.bin": os.urandom(4000)}, gated=True)
    hub.tokens.update({"hf_user", "hf_accepted"})
    hub.gated_access.add("hf_accepted")
    for token in (None, "hf_user"):
        with pytest.raises(DownloadError) as info:
            plan(_src("org/gated"), options_for(hub, token=token))
        assert info.value.reason == "GatedRepo"
    options = options_for(hub, token="hf_accepted")
    download(plan(_src("org/gated"), options), tmp_path / "m", options)
    assert (tmp_path / "m" / "w.bin").exists()


def test_allow_and_ignore_patterns(hub: LocalHub) -> None:
    hub.add_repo("org/model", sample_files())
    resolved = plan(_src(allow=("*.safetensors", "*.json"), ignore=("model-00002*",)), options_for(hub))
    assert [f.path for f in resolved.files] == ["config.json", "model-00001-of-00002.safetensors"]


def test_corrupt_bytes_are_retried_once_then_fail_without_publishing(hub: LocalHub, tmp_path: Path) -> None:
    files = sample_files()
    hub.add_repo("org/model", files)
    path = "model-00001-of-00002.safetensors"
    options = options_for(hub, staging_dir=tmp_path / "stage")
    resolved = plan(_src(), options)

    hub.faults.corrupt[path] = 1  # one bad response: the file is fetched again and passes
    download(resolved, tmp_path / "ok", options)
    assert (tmp_path / "ok" / path).read_bytes() == files[path]
    assert hub.bytes_by_path[path] == 2 * len(files[path])

    hub.faults.corrupt[path] = 1000
    with pytest.raises(DownloadError) as info:
        download(resolved, tmp_path / "bad", options)
    assert info.value.reason == "ChecksumMismatch" and path in info.value.message
    assert not (tmp_path / "bad").exists()
    assert not (tmp_path / "stage" / "tree" / path).exists()


class _Watched(Arrivals):
    """Arrivals that also log what the engine tells them, in order."""

    def __init__(self, part_size: int) -> None:
        super().__init__(part_size)
        self.log: list[tuple[str, str, int, int]] = []

    def reached(self, path: str, index: int, offset: int) -> None:
        self.log.append(("reached", path, index, offset))
        super().reached(path, index, offset)

    def forget(self, path: str) -> None:
        self.log.append(("forget", path, -1, -1))
        super().forget(path)


def test_the_engine_notes_how_far_each_part_is_written_and_forgets_a_file_written_again(
    hub: LocalHub, tmp_path: Path
) -> None:
    """What peers copy before a part is whole (download/arrivals.py): each part's offsets in order,
    ending at the part's end; a file that fails verification is forgotten before it is written again."""
    files = sample_files()
    hub.add_repo("org/model", files)
    path = "model-00001-of-00002.safetensors"  # 3 MiB + 123: four parts of 1 MiB
    arrivals = _Watched(MiB)
    options = options_for(hub, staging_dir=tmp_path / "stage")
    resolved = plan(_src(), options)
    hub.faults.corrupt[path] = 1  # one bad response: fetched again
    download(resolved, tmp_path / "ok", options, PartSources(arrivals=arrivals))
    assert (tmp_path / "ok" / path).read_bytes() == files[path]
    forgotten = arrivals.log.index(("forget", path, -1, -1))
    for stage in (arrivals.log[:forgotten], arrivals.log[forgotten + 1 :]):
        for index in range(4):
            offsets = [o for what, p, i, o in stage if (what, p, i) == ("reached", path, index)]
            assert offsets == sorted(offsets) and offsets[-1] == min(len(files[path]), (index + 1) * MiB)
            assert all(index * MiB < o for o in offsets)
    size = len(files[path])
    assert arrivals.snapshot()[path] == {i: min(size, (i + 1) * MiB) for i in range(4)}
    assert arrivals.upto(path, 2 * MiB + 5) == 3 * MiB


def test_small_file_corruption_is_caught_by_the_git_blob_id(hub: LocalHub, tmp_path: Path) -> None:
    hub.add_repo("org/model", {"config.json": b'{"a": 1}'})
    hub.faults.corrupt["config.json"] = 1000
    options = options_for(hub)
    with pytest.raises(DownloadError) as info:
        download(plan(_src(), options), tmp_path / "m", options)
    assert info.value.reason == "ChecksumMismatch" and "config.json" in info.value.message


def test_dropped_connections_and_server_errors_are_retried(hub: LocalHub, tmp_path: Path) -> None:
    files = sample_files()
    hub.add_repo("org/model", files)
    options = options_for(hub)
    resolved = plan(_src(), options)
    hub.faults.drop_after["model-00001-of-00002.safetensors"] = (200_000, 3)
    hub.faults.drop_after["nested/deep/dir/weights.bin"] = (1000, 1)
    hub.faults.fail_first, hub.faults.fail_status, hub.faults.retry_after = 3, 429, "0"
    download(resolved, tmp_path / "a", options)
    assert tree_of(tmp_path / "a") == files
    hub.faults.fail_first, hub.faults.fail_status, hub.faults.retry_after = 4, 503, None
    download(resolved, tmp_path / "b", options)
    assert tree_of(tmp_path / "b") == files


def test_unsafe_repo_paths_are_refused(hub: LocalHub) -> None:
    for bad in ("../evil.txt", "a/../../evil", "dir\\..\\evil", ".praesto-complete", "a//b", "/abs"):
        hub.add_repo("org/bad", {"ok.txt": b"ok", bad: b"x"})
        with pytest.raises(DownloadError) as info:
            plan(_src("org/bad"), options_for(hub))
        assert info.value.reason == "InvalidRepoFile" and repr(bad) in info.value.message


def _store_options(hub: LocalHub, tmp_path: Path) -> Options:
    return options_for(hub, blobs_dir=tmp_path / "store" / ".praesto" / "blobs" / "sha256")


def _second_cache(hub: LocalHub, tmp_path: Path, files: dict[str, bytes], repo: str, name: str) -> Result:
    """org/a downloaded into the node's store, then `repo` as cache `name`, counted from zero."""
    hub.add_repo("org/a", files)
    if repo != "org/a":
        hub.add_repo(repo, files)
    options = _store_options(hub, tmp_path)
    download(plan(_src("org/a"), options), tmp_path / "store" / "ns" / "a", options)
    hub.reset_counters()
    return download(plan(_src(repo), options), tmp_path / "store" / "ns" / name, options)


def test_dedup_between_two_caches_links_instead_of_fetching(hub: LocalHub, tmp_path: Path) -> None:
    files = sample_files()
    second = _second_cache(hub, tmp_path, files, "org/b", "b")
    lfs = [p for p, v in files.items() if len(v) > 1024]
    assert hub.bytes_served == sum(len(v) for p, v in files.items() if p not in lfs)  # small files only
    assert second.bytes_deduplicated == sum(len(files[p]) for p in lfs)
    for path in lfs:
        a, b = (tmp_path / "store" / "ns" / x / path for x in ("a", "b"))
        assert a.stat().st_ino == b.stat().st_ino and b.read_bytes() == files[path]


def test_two_caches_verifying_the_same_bytes_at_once_share_one_inode(tmp_path: Path) -> None:
    """Both fetched before either was in the blob area (two caches of one model at once): the second
    to verify takes the first one's inode, so the node stores the bytes once."""
    layout = StoreLayout(tmp_path / "store")
    data = os.urandom(6000)
    sha256 = hashlib.sha256(data).hexdigest()
    first, second = (tmp_path / name for name in ("first", "second"))
    for path in (first, second):
        path.write_bytes(data)
        path.chmod(0o444)
    add_to_blobs(layout.blobs_dir, sha256, first)
    add_to_blobs(layout.blobs_dir, sha256, second)
    blob = layout.blobs_dir / sha256
    assert first.stat().st_ino == second.stat().st_ino == blob.stat().st_ino
    assert second.read_bytes() == data and blob.stat().st_nlink == 3
    # A share a crash interrupted leaves the blob's passing second name: the blob GC drops it, not the blob.
    os.link(blob, layout.blobs_dir / f"{SHARING}{sha256}.1.2")
    gc_blobs(layout)
    assert sorted(p.name for p in layout.blobs_dir.iterdir()) == [sha256]
    assert blob.stat().st_nlink == 3


def test_a_second_cache_of_the_same_revision_takes_nothing_from_the_origin(
    hub: LocalHub, tmp_path: Path
) -> None:
    # Issue 14: small files are known only by git SHA-1, so they are shared per exact source,
    # revision and path, never by SHA-1 alone (a crafted collision in another repo must not
    # reach these bytes): the same repo at the same commit links everything...
    files = sample_files()
    hub.add_repo("org/other", files)
    again = _second_cache(hub, tmp_path, files, "org/a", "a2")
    assert hub.bytes_served == 0 and again.bytes_from_origin == 0
    assert again.bytes_deduplicated == sum(len(v) for v in files.values())
    assert tree_of(tmp_path / "store" / "ns" / "a2") == files
    # ... while another repo with byte-identical small files still fetches them itself.
    hub.reset_counters()
    options = _store_options(hub, tmp_path)
    download(plan(_src("org/other"), options), tmp_path / "store" / "ns" / "other", options)
    assert hub.bytes_served == sum(len(v) for v in files.values() if len(v) <= 1024)


def test_pvc_mode_fills_an_existing_directory_in_place(hub: LocalHub, tmp_path: Path) -> None:
    files = sample_files()
    hub.add_repo("org/model", files)
    volume = tmp_path / "cache"
    volume.mkdir()
    options = options_for(hub)
    download(plan(_src(), options), volume, options)
    assert tree_of(volume) == files
    assert (volume / names.COMPLETE_FILE).is_file()
    assert not (volume / ".praesto-staging").exists()


def test_cancel_keeps_staging_and_the_next_run_resumes(hub: LocalHub, tmp_path: Path) -> None:
    big = os.urandom(12 * MiB)
    hub.add_repo("org/model", {"big.bin": big, "config.json": b"{}"})
    hub.faults.rate = 8 * MiB
    cancel = threading.Event()

    def progress(done: int, total: int) -> None:
        if done >= 5 * MiB:
            cancel.set()

    stage = tmp_path / "stage"
    options = options_for(hub, cancel=cancel, progress=progress, staging_dir=stage, checkpoint_seconds=0.0)
    resolved = plan(_src(), options)
    with pytest.raises(DownloadCancelled):
        download(resolved, tmp_path / "m", options)
    assert (stage / ".praesto-journal").exists() and not (tmp_path / "m").exists()
    hub.reset_counters()
    hub.faults.rate = 0
    again = Options(endpoint=hub.endpoint, part_size=MiB, concurrency=4, staging_dir=stage, egress=LOOPBACK)
    result = download(resolved, tmp_path / "m", again)
    assert (tmp_path / "m" / "big.bin").read_bytes() == big
    assert result.bytes_resumed >= 4 * MiB
    assert hub.bytes_served < len(big)


def test_the_hub_planner_refuses_object_store_sources() -> None:
    """Object stores are planned by their origin (tests/download/test_objstore_s3.py); the Hub's planner
    stays Hub-only."""
    from praesto.agent.download.origins.huggingface import plan as hfplan

    with pytest.raises(DownloadError) as info:
        hfplan.plan(Source("s3", "bucket/prefix"), Options())
    assert info.value.reason == "SourceUnavailable" and "not a Hugging Face source" in info.value.message


def test_planning_against_a_mirror_reaches_no_other_host(
    hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """huggingface_hub's telemetry fetches huggingface.co/api/agent-harnesses whatever the endpoint
    (once per process): behind a mirror the agent would wait on, and reach for, a host nobody set."""
    import socket

    from huggingface_hub import constants as hub_constants
    from huggingface_hub.utils import _detect_agent

    monkeypatch.setattr(_detect_agent, "_registry", None)  # as in a fresh agent process
    monkeypatch.setattr(hub_constants, "AGENT_HARNESSES_PATH", str(tmp_path / "none.json"))  # no cached copy
    resolved: list[str] = []
    real = socket.getaddrinfo

    def recording(host: str, *args: object, **kwargs: object) -> object:
        resolved.append(host)
        return real(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", recording)
    hub.add_repo("org/model", sample_files())
    planned = plan(_src(), options_for(hub))
    assert planned.files and resolved and set(resolved) == {"127.0.0.1"}, resolved
