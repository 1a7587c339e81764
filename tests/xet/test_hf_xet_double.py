"""The double speaks Xet as Hugging Face's own client does: hf_xet uploads a repository to it and
downloads it back byte-identical, dedups a file sharing half its chunks, and refreshes tokens."""

from __future__ import annotations

import hashlib
import json
import random
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from testkit.xet import HfXet, running_double
from tests.xet.conftest import MIB, Repo


def test_hf_xet_uploads_a_repository_and_downloads_it_back_byte_identical(repo: Repo, tmp_path: Path) -> None:
    assert repo.double.store.unexpected == []
    for name, data in repo.files.items():
        assert repo.uploaded[name].size == len(data)
        assert repo.uploaded[name].sha256 == hashlib.sha256(data).hexdigest()
    # The 8 MiB file of one repeated block is stored once: hf_xet deduplicated it, the double kept it.
    assert repo.double.store.counters.xorb_bytes_posted < sum(map(len, repo.files.values())) - 7 * MIB

    fresh = HfXet(repo.double, tmp_path / "other-machine")
    fresh.download([(u.hash, u.size, tmp_path / name) for name, u in repo.uploaded.items()])
    for name, data in repo.files.items():
        assert (tmp_path / name).read_bytes() == data, name
    assert repo.double.store.counters.range_requests > 0
    assert repo.double.store.unexpected == []


def test_a_second_upload_sharing_half_its_chunks_sends_about_half_the_bytes(
    repo: Repo, tmp_path: Path
) -> None:
    shard_a = repo.files["shard-a.bin"]
    shard_b = shard_a[: 1 * MIB] + random.Random(41).randbytes(1 * MIB)
    (tmp_path / "shard-b.bin").write_bytes(shard_b)
    before = repo.double.store.counters.xorb_bytes_posted
    [uploaded] = repo.client.upload([tmp_path / "shard-b.bin"])
    sent = repo.double.store.counters.xorb_bytes_posted - before
    assert sent < 0.65 * len(shard_b), f"{sent} bytes sent for a {len(shard_b)}-byte file sharing half"
    HfXet(repo.double, tmp_path / "reader").download([(uploaded.hash, uploaded.size, tmp_path / "back.bin")])
    assert (tmp_path / "back.bin").read_bytes() == shard_b


def test_a_token_about_to_expire_is_refreshed_and_an_expired_one_gets_401(tmp_path: Path) -> None:
    (tmp_path / "f.bin").write_bytes(random.Random(42).randbytes(300_000))
    with running_double() as double:
        # hf_xet refreshes a token within 30 s of expiry (xet_client/src/cas_client/auth.rs
        # REFRESH_BUFFER_SEC) through token_refresh_url, before it sends a request with it.
        [up] = HfXet(double, tmp_path / "cache", token_ttl=5).upload([tmp_path / "f.bin"])
        assert double.store.counters.tokens_issued >= 2
        assert double.store.counters.unauthorized == 0

        token, _ = double.token()
        request = urllib.request.Request(
            f"{double.url}/v2/reconstructions/{up.hash}", headers={"Authorization": f"Bearer {token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert json.load(answer)["terms"]
        double.store.expire_tokens()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 401
