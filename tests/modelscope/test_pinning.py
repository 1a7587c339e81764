"""A branch or tag is pinned to one commit whether or not the hub's revisions list names it.

The client never pins (modelscope_hub 0.5.1 _download.py passes the ref through) and never reads
a ref's `CommitId`; what it reads as a commit is each file entry's `Revision`, the file's own last
commit (modelscope 1.40.2 hub/info.py `RepoSibling.sha`, hub/utils/caching.py). So the planner
takes `CommitId` when the hub gives one, else the commit every file names, and refuses, in one
line naming the fix, a ref it cannot pin. The local hub plays each answer (its `commit_ids` and
`entry_revisions` knobs).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from praesto.agent.download.api import LastingDownloadError, Options, Plan
from praesto.agent.download.fetch import download, plan

from praesto.spec import parse_uri
from testkit.egress import LOOPBACK
from testkit.modelscope_hub import EntryRevisions, ModelScopeHub
from tests.modelscope.conftest import tree_of

V1 = {"a.txt": b"one", "w.bin": b"1" * 4000}


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[ModelScopeHub]:
    with ModelScopeHub(tmp_path / "hub") as running:
        yield running


def _options(hub: ModelScopeHub) -> Options:
    return Options(modelscope_endpoint=hub.endpoint, egress=LOOPBACK, part_size=1 << 20, concurrency=4)


def _plan(hub: ModelScopeHub, uri: str = "ms://org/model") -> Plan:
    source, errors = parse_uri(uri)
    assert source is not None, errors
    return plan(source, _options(hub))


def _refusal(hub: ModelScopeHub, uri: str = "ms://org/model") -> str:
    with pytest.raises(LastingDownloadError) as refused:
        _plan(hub, uri)
    assert refused.value.reason == "RevisionNotFound"
    message = refused.value.message
    assert "\n" not in message and "give a 40-hex commit instead (ms://org/model:<commit>)" in message
    return message


def _listings(hub: ModelScopeHub) -> int:
    return sum(path.endswith("/repo/files") for _, path in hub.requests)


def test_the_commit_id_pins_a_branch_whose_files_name_different_last_commits(hub: ModelScopeHub) -> None:
    hub.add_repo("org/model", V1)
    head = hub.commit("org/model", {**V1, "a.txt": b"two"})  # w.bin's last commit stays the first
    assert _plan(hub).revision == head
    assert _listings(hub) == 1  # at the commit only: the ref's own list is not needed


@pytest.mark.parametrize("ref", ["master", "v1.0"])
def test_without_commit_id_a_ref_pins_to_the_commit_its_files_share(
    hub: ModelScopeHub, tmp_path: Path, ref: str
) -> None:
    first = hub.add_repo("org/model", V1)
    hub.tag("org/model", "v1.0", first)
    head = hub.commit("org/model", {"a.txt": b"two", "w.bin": b"2" * 4000})  # every file rewritten
    hub.commit_ids = False
    planned = _plan(hub, f"ms://org/model:{ref}")
    assert planned.revision == (head if ref == "master" else first)
    assert _listings(hub) == 2  # at the ref (to learn the commit), then at the commit (what every node lists)
    download(planned, tmp_path / "out", _options(hub))
    want = V1 if ref == "v1.0" else {"a.txt": b"two", "w.bin": b"2" * 4000}
    assert {k: v for k, v in tree_of(tmp_path / "out").items() if not k.startswith(".praesto")} == want


def test_without_commit_id_files_naming_different_commits_are_refused(hub: ModelScopeHub) -> None:
    hub.add_repo("org/model", V1)
    head = hub.commit("org/model", {**V1, "a.txt": b"two"})
    hub.commit_ids = False
    assert "its files name 2 different commits" in _refusal(hub)
    assert _plan(hub, f"ms://org/model:{head}").revision == head  # the fix: a pinned commit needs neither


@pytest.mark.parametrize(
    ("mode", "cause"),
    [("short", "not a 40-hex commit"), ("none", "a file entry names no Revision")],
)
def test_without_commit_id_files_naming_no_full_commit_are_refused(
    hub: ModelScopeHub, mode: EntryRevisions, cause: str
) -> None:
    hub.add_repo("org/model", V1)
    hub.commit_ids, hub.entry_revisions = False, mode
    assert cause in _refusal(hub)


def test_without_commit_id_a_ref_whose_last_commit_only_removed_files_is_refused(hub: ModelScopeHub) -> None:
    """Every file left names the first commit, whose tree still holds the removed one: not the ref's."""
    hub.add_repo("org/model", V1)
    hub.commit("org/model", {"a.txt": V1["a.txt"]})
    hub.commit_ids = False
    assert "differ from those at" in _refusal(hub)


def test_a_commit_id_that_is_not_a_commit_is_refused(hub: ModelScopeHub) -> None:
    hub.add_repo("org/model", V1)
    hub.repos["org/model"].refs["master"] = "not-a-commit"  # what the revisions list will name
    assert "'not-a-commit' as its CommitId" in _refusal(hub)


def test_the_double_gives_each_file_its_last_commit(hub: ModelScopeHub) -> None:
    """What the planner relies on when no CommitId comes: the entries' `Revision` as the hub writes it."""
    first = hub.add_repo("org/model", V1)
    head = hub.commit("org/model", {**V1, "a.txt": b"two"})
    revisions: dict[str, Any] = {}
    for mode in ("last-change", "listed", "short", "none"):
        hub.entry_revisions = mode
        answer = _files(hub)
        revisions[mode] = {e["Path"]: e.get("Revision") for e in answer}
    assert revisions["last-change"] == {"a.txt": head, "w.bin": first}
    assert revisions["listed"] == {"a.txt": head, "w.bin": head}
    assert revisions["short"] == {"a.txt": head[:8], "w.bin": first[:8]}
    assert revisions["none"] == {"a.txt": None, "w.bin": None}


def _files(hub: ModelScopeHub) -> list[dict[str, Any]]:
    url = f"{hub.endpoint}/api/v1/models/org/model/repo/files?Revision=master&Recursive=True"
    with urllib.request.urlopen(url, timeout=10) as answer:  # loopback: the local hub
        return list(json.load(answer)["Data"]["Files"])
