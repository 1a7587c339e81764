"""The local hub answers the real `huggingface_hub` client the way the Hub does."""

from __future__ import annotations

from pathlib import Path

import pytest
from huggingface_hub import HfApi, hf_hub_download, snapshot_download
from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

from testkit.hub import LocalHub
from tests.download.conftest import sample_files, tree_of


def test_snapshot_download_and_metadata_through_the_real_client(tmp_path: Path) -> None:
    files = sample_files()
    with LocalHub(tmp_path / "hub", page_size=7) as hub:  # several tree pages
        commit = hub.add_repo("org/model", files)
        api = HfApi(endpoint=hub.endpoint, token=False)
        info = api.model_info("org/model", files_metadata=True)
        assert info.sha == commit
        assert {s.rfilename for s in info.siblings or []} == set(files)
        listed = {e.path for e in api.list_repo_tree("org/model", recursive=True) if hasattr(e, "blob_id")}
        assert listed == set(files)
        out = snapshot_download("org/model", endpoint=hub.endpoint, local_dir=tmp_path / "snap", token=False)
        assert {k: v for k, v in tree_of(Path(out)).items() if not k.startswith(".cache")} == files
        assert any(path.startswith("/api/models/org/model/tree/") for _, path in hub.requests)


def test_real_client_sees_private_gated_and_missing_like_on_the_hub(tmp_path: Path) -> None:
    with LocalHub(tmp_path / "hub") as hub:
        hub.add_repo("org/private", {"w.bin": b"x" * 5000}, private=True)
        hub.add_repo("org/gated", {"w.bin": b"y" * 5000}, gated=True)
        hub.tokens.add("hf_ok")
        end, cache = hub.endpoint, tmp_path / "cache"
        with pytest.raises(RepositoryNotFoundError):
            hf_hub_download("org/private", "w.bin", token=False, endpoint=end, cache_dir=cache)
        got = hf_hub_download("org/private", "w.bin", token="hf_ok", endpoint=end, cache_dir=cache)
        assert Path(got).read_bytes() == b"x" * 5000
        with pytest.raises(GatedRepoError):
            hf_hub_download("org/gated", "w.bin", token="hf_ok", endpoint=end, cache_dir=cache)
        with pytest.raises(RevisionNotFoundError):
            HfApi(endpoint=hub.endpoint, token=False).model_info("org/gated", revision="nope")
