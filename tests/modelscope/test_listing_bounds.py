"""The ModelScope file list is tenant-influenced input: every field is checked before a plan exists.

The repo's owner writes the paths; any hub (a mirror, a hostile endpoint) writes the sizes,
digests and the body itself. Each refusal is one lasting reason naming the cause and the fix.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from praesto.agent.download.api import LastingDownloadError, Options
from praesto.agent.download.egress import REASON_EGRESS_REFUSED, EgressPolicy
from praesto.agent.download.fetch import download, plan
from praesto.agent.download.origins.modelscope import plan as ms_plan

from praesto.spec import parse_uri
from testkit.egress import LOOPBACK
from testkit.modelscope_hub import ModelScopeHub
from tests.modelscope.conftest import sample_files, tree_of

SHA = "ab" * 32


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[ModelScopeHub]:
    with ModelScopeHub(tmp_path / "hub") as running:
        yield running


def _options(hub: ModelScopeHub, **kwargs: Any) -> Options:
    defaults: dict[str, Any] = {"modelscope_endpoint": hub.endpoint, "egress": LOOPBACK,
                                "part_size": 1 << 20, "concurrency": 4}  # fmt: skip
    defaults.update(kwargs)
    return Options(**defaults)


def _plan(hub: ModelScopeHub, uri: str = "ms://org/model", **kwargs: Any) -> Any:
    source, errors = parse_uri(uri)
    assert source is not None, errors
    return plan(source, _options(hub, **kwargs))


def _refused(hub: ModelScopeHub, entry: dict[str, Any]) -> LastingDownloadError:
    hub.add_repo("org/model", {"a.txt": b"a"})
    hub.listing_extra["org/model"] = [entry]
    with pytest.raises(LastingDownloadError) as refused:
        _plan(hub)
    return refused.value


@pytest.mark.parametrize(
    "path", ["../escape", "/abs/olute", "a//b", ".praesto-complete", "dir/../../x", "a\\b"]
)
def test_unsafe_paths_in_the_file_list_are_refused(hub: ModelScopeHub, path: str) -> None:
    error = _refused(hub, {"Path": path, "Type": "blob", "Size": 1, "Sha256": SHA})
    assert error.reason == "InvalidRepoFile" and "escape" in error.message


@pytest.mark.parametrize(
    "entry",
    [
        {"Path": "x" * 300, "Type": "blob", "Size": 1, "Sha256": SHA},  # a name over NAME_MAX
        {"Path": "d/" * 600 + "x", "Type": "blob", "Size": 1, "Sha256": SHA},  # a path over 1024
        {"Path": "w.bin", "Type": "blob", "Size": -1, "Sha256": SHA},
        {"Path": "w.bin", "Type": "blob", "Size": True, "Sha256": SHA},
        {"Path": "w.bin", "Type": "blob", "Size": "12", "Sha256": SHA},
        {"Path": "w.bin", "Type": "blob", "Size": 1 << 60, "Sha256": SHA},
        {"Path": "w.bin", "Type": "blob", "Size": 1},  # no sha256: nothing to verify it by
        {"Path": "w.bin", "Type": "blob", "Size": 1, "Sha256": "not-a-digest"},
        {"Path": "a.txt", "Type": "blob", "Size": 1, "Sha256": SHA},  # a path listed twice
        {"Path": "m", "Type": "commit", "Size": 0, "Sha256": SHA},  # a submodule
        {"Path": 7, "Type": "blob", "Size": 1, "Sha256": SHA},
    ],
    ids=[
        "long-name",
        "long-path",
        "negative",
        "bool",
        "text-size",
        "past-1PiB",
        "no-sha",
        "bad-sha",
        "twice",
        "submodule",
        "path-not-text",
    ],
)
def test_hostile_entries_are_refused_naming_the_fix(hub: ModelScopeHub, entry: dict[str, Any]) -> None:
    error = _refused(hub, entry)
    assert error.reason == "InvalidRepoFile", error
    assert "ms://org/model: the hub's file list" in error.message and ";" in error.message


def test_a_listing_over_the_file_cap_is_refused_naming_the_count(hub: ModelScopeHub) -> None:
    hub.add_repo("org/model", {f"f{i}.txt": b"x" for i in range(5)})
    with pytest.raises(LastingDownloadError) as refused:
        _plan(hub, max_files=3)
    assert "5" in refused.value.message and "3" in refused.value.message


def test_a_list_the_hub_cuts_is_walked_folder_by_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hub cuts a list at its limit without saying so (3000: modelscope_hub constants.py
    REPO_FILES_TRUNCATION_LIMIT; scaled down to 4 here): a list that long is walked, as the
    client's `_walk_repo_files` does, and nothing is missed."""
    monkeypatch.setattr(ms_plan, "LISTING_LIMIT", 4)
    files = {"a/1.bin": b"a1", "a/2.bin": b"a2", "b/1.bin": b"b1", "b/c/2.bin": b"b2", "top.txt": b"t"}
    with ModelScopeHub(tmp_path / "hub", files_limit=4) as hub:
        hub.add_repo("org/model", files)
        planned = _plan(hub)
        download(planned, tmp_path / "out", _options(hub))
        roots = [path for _, path in hub.requests if path.endswith("/repo/files")]
    assert {k: v for k, v in tree_of(tmp_path / "out").items() if not k.startswith(".praesto")} == files
    assert len(roots) == 4  # the cut root, its children, then a/ and b/ whole


def test_a_folder_with_more_children_than_the_hub_lists_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ms_plan, "LISTING_LIMIT", 4)
    with ModelScopeHub(tmp_path / "hub", files_limit=4) as hub:
        hub.add_repo("org/model", {f"f{i}.txt": b"x" for i in range(6)})
        with pytest.raises(LastingDownloadError) as refused:
            _plan(hub)
    assert (
        refused.value.reason == "SourceUnavailable" and "folder '/' holds at least 4" in refused.value.message
    )


def test_a_huge_listing_body_is_cut_at_its_bound(hub: ModelScopeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ms_plan, "MAX_LISTING_BYTES", 64 << 10)
    hub.add_repo("org/model", {"a.txt": b"a"})
    hub.listing_extra["org/model"] = [{"Path": "pad", "Type": "tree", "Name": "p" * (256 << 10)}]
    with pytest.raises(LastingDownloadError) as refused:
        _plan(hub)
    assert refused.value.reason == "SourceUnavailable" and "is over 64" in refused.value.message


def test_allow_and_ignore_patterns_select_from_the_list(hub: ModelScopeHub) -> None:
    hub.add_repo("org/model", sample_files())
    source, _ = parse_uri("ms://org/model")
    assert source is not None
    picked = type(source)(
        source.scheme,
        source.location,
        "",
        (
            "*.json",
            "sub/",
        ),
        ("sub/dir/*.bin",),
    )
    planned = plan(picked, _options(hub))
    assert [f.path for f in planned.files] == ["configuration.json", "sub/dir/tokenizer.json"]
    assert all(f.sha256 for f in planned.files)  # every file carries the hub's sha256


def test_the_oss_redirect_passes_the_egress_rule(hub: ModelScopeHub, tmp_path: Path) -> None:
    """The configured hub is trusted as it is; where it redirects LFS objects is decided again."""
    hub.add_repo("org/model", sample_files())
    planned = _plan(hub, egress=EgressPolicy())
    with pytest.raises(LastingDownloadError) as refused:
        download(planned, tmp_path / "out", _options(hub, egress=EgressPolicy()))
    assert refused.value.reason == REASON_EGRESS_REFUSED
    result = download(planned, tmp_path / "ok", _options(hub))
    assert {
        k: v for k, v in tree_of(tmp_path / "ok").items() if not k.startswith(".praesto")
    } == sample_files()
    assert result.bytes_from_origin > 0
