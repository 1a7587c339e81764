"""The local ModelScope hub answers `modelscope.snapshot_download` (modelscope 1.40.2) like the hub.

The client is the authority on the API (testkit/modelscope_hub.py cites where it reads each
endpoint and field): if the double drifted from what it calls, these downloads would fail.
"""

from __future__ import annotations

from pathlib import Path

import modelscope_hub._legacy_api as legacy
import pytest
import requests
from modelscope import snapshot_download
from modelscope.hub.file_download import model_file_download
from modelscope_hub.config import set_default_config

from testkit.modelscope_hub import ModelScopeHub
from tests.modelscope.conftest import sample_files, tree_of


@pytest.fixture(autouse=True)
def _client_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the client's cache and credentials inside the test."""
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "ms-cache"))
    monkeypatch.setenv("MODELSCOPE_CREDENTIALS_PATH", str(tmp_path / "ms-credentials"))
    monkeypatch.delenv("MODELSCOPE_API_TOKEN", raising=False)
    monkeypatch.delenv("MODELSCOPE_ENDPOINT", raising=False)
    set_default_config(None)  # the client reads its environment once per process (config.py)


def _downloaded(root: Path) -> dict[str, bytes]:
    return {k: v for k, v in tree_of(root).items() if not k.startswith(".")}


def test_snapshot_download_is_byte_identical(tmp_path: Path) -> None:
    files = sample_files()
    with ModelScopeHub(tmp_path / "hub") as hub:
        hub.add_repo("org/model", files)
        out = snapshot_download("org/model", endpoint=hub.endpoint, local_dir=str(tmp_path / "snap"))
        assert _downloaded(Path(out)) == files
        paths = {path for _, path in hub.requests}
        assert "/api/v1/models/org/model/repo/files" in paths  # the listing it planned from
        assert "/api/v1/models/org/model/repo" in paths  # the per-file download
        assert any(span.cdn for span in hub.spans)  # LFS objects came from "OSS" after a 302


def test_endpoint_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MODELSCOPE_ENDPOINT is the client's own setting (modelscope_hub config.py ENV_ENDPOINT)."""
    with ModelScopeHub(tmp_path / "hub") as hub:
        hub.add_repo("org/model", {"a.txt": b"hello"})
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", hub.endpoint)
        set_default_config(None)
        out = snapshot_download("org/model", local_dir=str(tmp_path / "snap"))
        assert _downloaded(Path(out)) == {"a.txt": b"hello"}


def test_private_repo_needs_the_token(tmp_path: Path) -> None:
    files = sample_files()
    with ModelScopeHub(tmp_path / "hub") as hub:
        hub.add_repo("org/private", files, private=True)
        hub.tokens.add("ms-ok")
        with pytest.raises(requests.HTTPError):
            snapshot_download("org/private", endpoint=hub.endpoint, local_dir=str(tmp_path / "anon"))
        out = snapshot_download(
            "org/private", endpoint=hub.endpoint, token="ms-ok", local_dir=str(tmp_path / "snap")
        )
        assert _downloaded(Path(out)) == files


def test_pinned_revision_and_tag(tmp_path: Path) -> None:
    with ModelScopeHub(tmp_path / "hub") as hub:
        first = hub.add_repo("org/model", {"w.bin": b"v1" * 1000, "a.txt": b"one"})
        hub.tag("org/model", "v1.0", first)
        hub.commit("org/model", {"w.bin": b"v2" * 1000, "a.txt": b"two"})
        by_commit = snapshot_download("org/model", revision=first, endpoint=hub.endpoint,
                                      local_dir=str(tmp_path / "c"))  # fmt: skip
        by_tag = snapshot_download("org/model", revision="v1.0", endpoint=hub.endpoint,
                                   local_dir=str(tmp_path / "t"))  # fmt: skip
        head = snapshot_download("org/model", endpoint=hub.endpoint, local_dir=str(tmp_path / "h"))
        assert (
            _downloaded(Path(by_commit))
            == _downloaded(Path(by_tag))
            == {"w.bin": b"v1" * 1000, "a.txt": b"one"}
        )
        assert _downloaded(Path(head)) == {"w.bin": b"v2" * 1000, "a.txt": b"two"}


def test_single_file_download_resumes_with_a_range(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cut stream is resumed with `Range: bytes=N-` (modelscope_hub _download.py
    `_download_with_resume`), which the double honours. Without a revision, modelscope's
    model_file_download first picks one from `/revisions` with a default-endpoint client
    (modelscope/hub/file_download.py), so the endpoint comes from MODELSCOPE_ENDPOINT here."""
    payload = bytes(range(256)) * 400
    with ModelScopeHub(tmp_path / "hub") as hub:
        hub.add_repo("org/model", {"w.bin": payload})
        hub.faults.drop_after["w.bin"] = (30000, 1)
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", hub.endpoint)
        set_default_config(None)
        got = model_file_download("org/model", "w.bin", local_dir=str(tmp_path / "f"))
        assert Path(got).read_bytes() == payload
        assert hub.bytes_by_path["w.bin"] == len(payload)  # nothing fetched twice
        assert ("GET", "/api/v1/models/org/model/revisions") in hub.requests


def test_a_cut_listing_is_walked_by_the_client_with_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The double cuts answers as the hub does, and serves `Root` and `Recursive=False` the way
    the client's `_walk_repo_files` (modelscope_hub _legacy_api.py) reads them: scaled to 4."""
    monkeypatch.setattr(legacy, "REPO_FILES_TRUNCATION_LIMIT", 4)
    files = {"a/1.bin": b"a1", "a/2.bin": b"a2", "b/1.bin": b"b1", "b/c/2.bin": b"b2", "top.txt": b"t"}
    with ModelScopeHub(tmp_path / "hub", files_limit=4) as hub:
        hub.add_repo("org/model", files)
        out = snapshot_download("org/model", endpoint=hub.endpoint, local_dir=str(tmp_path / "snap"))
        assert _downloaded(Path(out)) == files
        assert sum(path.endswith("/repo/files") for _, path in hub.requests) > 1
