"""Praesto's downloader fetches Hugging Face files through Xet from the double the real hf_xet client
uploaded to (tests/xet/conftest.py), behind the local Hub (testkit/hub.py + hub_xet.py): byte-
identical, origin bytes from the CAS's xorb ranges, not resolve/. Every Xet failure (a corrupt range,
a CAS answering 500 or stalling, a reconstruction naming ranges outside the xorb, a CAS or xorb URL
on a refused address) falls back to resolve/ for that file, and the file is still exactly right."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from huggingface_hub import get_hf_file_metadata, hf_hub_url
from huggingface_hub.utils._xet import parse_xet_connection_info_from_headers
from praesto.agent.download.api import DownloadCancelled, Options, Result
from praesto.agent.download.fetch import download, plan
from praesto.agent.download.origins.huggingface import xetfetch
from praesto.agent.download.origins.huggingface.xetfetch import (
    CAUSE_CAS,
    CAUSE_CHECKSUM,
    CAUSE_EGRESS,
    CAUSE_FORMAT,
    CAUSE_STALL,
)
from praesto.agent.download.origins.huggingface.xetmemory import RangeMemory

from praesto.spec import Source
from testkit.hub import LocalHub
from testkit.hub_xet import HubXet
from tests.download.conftest import options_for, tree_of
from tests.xet.conftest import MIB, Repo

REPO = "org/xet-model"
STALL_SECONDS = 1.0
FALLBACK_DEADLINE = 30.0  # seconds a stalled CAS may cost before the file is through resolve/


@pytest.fixture
def hub(repo: Repo, tmp_path: Path) -> Iterator[LocalHub]:
    """A Hub serving the repository hf_xet uploaded, its LFS files marked as stored in the double."""
    with LocalHub(tmp_path / "hub") as server:
        server.add_repo(REPO, repo.files)
        server.xet = HubXet(repo.double)
        server.xet.add(repo.uploaded.values())
        yield server


def fetch(hub: LocalHub, tmp_path: Path, **kwargs: Any) -> Result:
    options: Options = options_for(hub, xet=True, xet_stall_seconds=STALL_SECONDS, **kwargs)
    resolved = plan(Source("hf", REPO, "main", (), ()), options)
    return download(resolved, tmp_path / "dest", options)


def xet_files(repo: Repo) -> set[str]:
    return {name for name, data in repo.files.items() if len(data) > 1024}  # the hub's LFS files


def test_a_model_hf_xet_uploaded_comes_through_xet_byte_identical(
    repo: Repo, hub: LocalHub, tmp_path: Path
) -> None:
    served = repo.double.store.counters.range_bytes_served
    result = fetch(hub, tmp_path)
    assert tree_of(tmp_path / "dest") == repo.files
    assert (result.xet_files, result.xet_fallbacks) == (len(xet_files(repo)), {})
    # Origin bytes are the xorb ranges the CAS served; resolve/ served only the small, non-Xet file.
    assert result.bytes_from_xet == repo.double.store.counters.range_bytes_served - served > 0
    assert set(hub.bytes_by_path) == {"config.json"}
    assert result.bytes_from_origin == result.bytes_from_xet + len(repo.files["config.json"])
    # 8 MiB of one repeated block: Xet fetched its chunks once, resolve/ would have sent 8 MiB.
    assert result.bytes_from_xet < sum(len(repo.files[n]) for n in xet_files(repo)) - 6 * MIB
    assert repo.double.store.unexpected == []


def test_xet_off_keeps_every_file_on_resolve(repo: Repo, hub: LocalHub, tmp_path: Path) -> None:
    served = repo.double.store.counters.range_bytes_served
    options = options_for(hub)  # Options.xet defaults to False
    result = download(plan(Source("hf", REPO, "main", (), ()), options), tmp_path / "dest", options)
    assert tree_of(tmp_path / "dest") == repo.files
    assert (result.xet_files, result.bytes_from_xet) == (0, 0)
    assert repo.double.store.counters.range_bytes_served == served
    assert hub.xet is not None and hub.xet.tokens == 0


def test_the_hub_double_speaks_xet_as_huggingface_hub_reads_it(repo: Repo, hub: LocalHub) -> None:
    """huggingface_hub's own parsers find the Xet hash, the token route and the CAS connection."""
    commit = hub.repos[REPO].refs["main"]
    meta = get_hf_file_metadata(hf_hub_url(REPO, "shard-a.bin", revision=commit, endpoint=hub.endpoint))
    assert meta.xet_file_data is not None
    assert meta.xet_file_data.file_hash == repo.uploaded["shard-a.bin"].hash
    token_url = meta.xet_file_data.refresh_route
    assert token_url == f"{hub.endpoint}/api/models/{REPO}/xet-read-token/{commit}"
    small = get_hf_file_metadata(hf_hub_url(REPO, "config.json", revision=commit, endpoint=hub.endpoint))
    assert small.xet_file_data is None
    answer = httpx2.get(token_url)
    info = parse_xet_connection_info_from_headers(answer.headers)
    assert info is not None and info.endpoint == repo.double.url
    assert answer.json() == {
        "casUrl": info.endpoint,
        "accessToken": info.access_token,
        "exp": info.expiration_unix_epoch,
    }


def test_a_corrupt_xorb_range_falls_back_and_the_file_is_still_right(
    repo: Repo, hub: LocalHub, tmp_path: Path
) -> None:
    name = "weights.f32"
    doc = repo.double.reconstruction(repo.uploaded[name].hash)
    xorb = doc["terms"][0]["hash"]
    offset = doc["xorbs"][xorb][0]["ranges"][0]["bytes"]["start"] + 200
    repo.double.store.flip_byte(xorb, offset)
    try:
        result = fetch(hub, tmp_path)
    finally:
        repo.double.store.flip_byte(xorb, offset)
    assert tree_of(tmp_path / "dest") == repo.files
    assert result.xet_fallbacks.get(CAUSE_FORMAT, 0) >= 1
    assert name in hub.bytes_by_path  # fetched again through resolve/


def test_a_xet_file_that_is_not_the_hubs_sha256_falls_back(repo: Repo, hub: LocalHub, tmp_path: Path) -> None:
    """The listing names another file's Xet hash (same size): Xet assembles and verifies that file,
    the Hub's sha256 refuses it, and the file comes through resolve/: nothing is trusted before it."""
    notes = repo.files["notes.txt"]
    (tmp_path / "impostor.txt").write_bytes(notes[::-1])
    [impostor] = repo.client.upload([tmp_path / "impostor.txt"])
    assert hub.xet is not None
    hub.xet.hashes[repo.uploaded["notes.txt"].sha256] = impostor.hash
    result = fetch(hub, tmp_path)
    assert tree_of(tmp_path / "dest") == repo.files
    assert result.xet_fallbacks == {CAUSE_CHECKSUM: 1}
    assert result.xet_files == len(xet_files(repo)) - 1
    assert set(hub.bytes_by_path) == {"config.json", "notes.txt"}


def test_a_cas_answering_500_falls_back(
    repo: Repo, hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(repo.double.store.faults, "status", 500)
    result = fetch(hub, tmp_path)
    assert tree_of(tmp_path / "dest") == repo.files
    assert (result.xet_files, result.xet_fallbacks) == (0, {CAUSE_CAS: len(xet_files(repo))})


def test_a_stalled_cas_falls_back_within_the_deadline(
    repo: Repo, hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    monkeypatch.setattr(repo.double.store.faults, "stall", release)
    started = time.monotonic()
    try:
        result = fetch(hub, tmp_path)
    finally:
        release.set()
    assert time.monotonic() - started < FALLBACK_DEADLINE
    assert tree_of(tmp_path / "dest") == repo.files
    assert result.xet_fallbacks.get(CAUSE_STALL, 0) >= 1
    assert set(result.xet_fallbacks) == {CAUSE_STALL}


def test_a_token_the_cas_refuses_is_refreshed(repo: Repo, hub: LocalHub, tmp_path: Path) -> None:
    assert hub.xet is not None
    hub.xet.stale_tokens = 1  # the first token's `exp` says an hour, the CAS says 401
    refused = repo.double.store.counters.unauthorized
    result = fetch(hub, tmp_path)
    assert tree_of(tmp_path / "dest") == repo.files
    assert (result.xet_files, result.xet_fallbacks) == (len(xet_files(repo)), {})
    assert repo.double.store.counters.unauthorized > refused
    assert hub.xet.tokens == 2


@pytest.mark.parametrize(
    ("chunks", "cause"),
    [
        ({"start": 0, "end": 9000}, CAUSE_FORMAT),  # past any xorb: refused by the format core unfetched
        ("past-the-end", CAUSE_CAS),  # past this xorb's chunks: the CAS refuses the range (416)
    ],
)
def test_a_reconstruction_naming_ranges_outside_the_xorb_is_refused_then_falls_back(
    repo: Repo,
    hub: LocalHub,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    chunks: Any,
    cause: str,
) -> None:
    target = repo.uploaded["notes.txt"].hash
    honest = repo.double.reconstruction

    def outside(file_hash: str, version: int = 2, byte_range: Any = None) -> Any:
        doc = honest(file_hash, version, byte_range)
        if file_hash != target or not isinstance(doc, dict):
            return doc
        term = doc["terms"][0]
        xorb = term["hash"]
        n = len(repo.double.store.boundaries[xorb]) - 1
        count = term["range"]["end"] - term["range"]["start"]  # the same chunks, moved past the end
        wrong = chunks if isinstance(chunks, dict) else {"start": n, "end": n + count}
        size = len(repo.double.store.xorbs[xorb])
        term["range"] = wrong
        doc["xorbs"][xorb] = [
            {
                **doc["xorbs"][xorb][0],
                "ranges": [{"chunks": wrong, "bytes": {"start": size + 10, "end": size + 10 + count}}],
            }
        ]
        return doc

    monkeypatch.setattr(repo.double, "reconstruction", outside)
    result = fetch(hub, tmp_path)
    assert tree_of(tmp_path / "dest") == repo.files
    assert result.xet_fallbacks == {cause: 1}
    assert set(hub.bytes_by_path) == {"config.json", "notes.txt"}


@pytest.mark.parametrize("where", ["cas", "xorb"])
def test_a_cas_or_xorb_url_on_a_refused_address_is_refused_then_falls_back(
    repo: Repo, hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """The tests allow loopback (testkit/egress.py); the metadata address stays refused."""
    assert hub.xet is not None
    if where == "cas":
        hub.xet.cas_url = "http://169.254.169.254"
    else:
        honest = repo.double.reconstruction

        def elsewhere(file_hash: str, version: int = 2, byte_range: Any = None) -> Any:
            doc = honest(file_hash, version, byte_range)
            for entries in doc["xorbs"].values():
                for entry in entries:
                    entry["url"] = "http://169.254.169.254/latest/meta-data/" + entry["url"].split("/")[-1]
            return doc

        monkeypatch.setattr(repo.double, "reconstruction", elsewhere)
    result = fetch(hub, tmp_path)
    assert tree_of(tmp_path / "dest") == repo.files
    assert result.xet_fallbacks == {CAUSE_EGRESS: len(xet_files(repo))}


def test_a_xet_hash_that_is_not_one_is_ignored_and_the_file_comes_through_resolve(
    repo: Repo, hub: LocalHub, tmp_path: Path
) -> None:
    """The tree's `xetHash` goes into the CAS's URL path: anything but 64 hex digits is dropped."""
    assert hub.xet is not None
    sha256 = repo.uploaded["notes.txt"].sha256
    hub.xet.hashes[sha256] = "../../v1/xorbs/default/" + "0" * 40
    result = fetch(hub, tmp_path)
    assert tree_of(tmp_path / "dest") == repo.files
    assert (result.xet_files, result.xet_fallbacks) == (len(xet_files(repo)) - 1, {})
    assert set(hub.bytes_by_path) == {"config.json", "notes.txt"}
    assert not any("../" in path for _, path in hub.requests)


HF_HUB_DOWNLOAD = r"""
import sys
from huggingface_hub import hf_hub_download
from huggingface_hub.file_download import get_hf_file_metadata, hf_hub_url
repo, name, endpoint, dest = sys.argv[1:5]
meta = get_hf_file_metadata(hf_hub_url(repo, name, endpoint=endpoint), endpoint=endpoint)
assert meta.xet_file_data is not None, "no Xet metadata"
print(hf_hub_download(repo, name, endpoint=endpoint, local_dir=dest))
"""


def test_huggingface_hub_downloads_through_the_hub_double_with_hf_xet(
    repo: Repo, hub: LocalHub, tmp_path: Path
) -> None:
    """The real client pair (huggingface_hub + hf_xet) takes the Xet path through the Hub double:
    HEAD resolve/ (X-Xet-Hash, Link rel=xet-auth), the read token, the CAS; resolve/ sends no bytes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HTTP_PROXY", "HTTPS_PROXY"))}
    env |= {
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_XET_CACHE": str(tmp_path / "xet-cache"),
        "HF_XET_CHUNK_CACHE_SIZE_BYTES": "0",
        "HF_XET_TELEMETRY_ENABLED": "false",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "NO_PROXY": "127.0.0.1,localhost",
    }
    served = repo.double.store.counters.range_bytes_served
    done = subprocess.run(
        [sys.executable, "-c", HF_HUB_DOWNLOAD, REPO, "shard-a.bin", hub.endpoint, str(tmp_path / "out")],
        capture_output=True, text=True, env=env, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "out" / "shard-a.bin").read_bytes() == repo.files["shard-a.bin"]
    assert repo.double.store.counters.range_bytes_served > served
    assert hub.bytes_by_path == {}
    assert hub.xet is not None and hub.xet.tokens >= 1


def test_ranges_in_memory_stay_within_the_agents_budget_and_all_go_back(
    repo: Repo, hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every Xet file of the download runs at once (the engine's 32 workers), yet the ranges held in
    memory never pass the budget, but for one larger than it, which runs alone (xetmemory.py)."""
    budget = RangeMemory(512 * 1024)
    held: list[tuple[int, int]] = []  # (bytes held once a range was taken, that range)
    take = budget.take

    def watched(n: int, cancel: threading.Event) -> int:
        got = take(n, cancel)
        held.append((budget.held, n))
        return got

    monkeypatch.setattr(budget, "take", watched)
    monkeypatch.setattr(xetfetch, "RANGES", budget)
    result = fetch(hub, tmp_path)
    assert tree_of(tmp_path / "dest") == repo.files
    assert (result.xet_files, result.xet_fallbacks) == (len(xet_files(repo)), {})
    assert len(held) >= len(xet_files(repo))
    assert all(total <= budget.limit or total == n for total, n in held), held
    assert budget.held == 0


def test_a_range_waiting_for_memory_is_cancelled_with_its_download() -> None:
    budget = RangeMemory(100)
    budget.take(80, threading.Event())
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(DownloadCancelled):
        budget.take(40, cancel)
    assert budget.take(20, cancel) == 20  # what fits is taken, cancelled or not: it never waits
    budget.give(100)
    assert budget.held == 0
