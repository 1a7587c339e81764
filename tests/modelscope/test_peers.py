"""ModelScope files come from other nodes' copies like any kind's: every file the hub's list
gives a sha256 (all of them), verified against it, so a lying peer costs time, never content.

Engine-level, with a peer that reads a finished copy (the wire and four real agents are
tests/peers' work; which files a peer may serve is the question here)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from praesto.agent.download.api import Options, PartSources, RemoteFile, Sink
from praesto.agent.download.fetch import download, plan

from praesto.spec import Source
from testkit.egress import LOOPBACK
from testkit.modelscope_hub import ModelScopeHub
from tests.modelscope.conftest import tree_of

MiB = 1 << 20


class CopyPeer:
    """Serves ranges from a published copy on "another node"; `lie` flips a byte of each range."""

    def __init__(self, copy: Path, *, lie: bool = False) -> None:
        self.copy, self.lie = copy, lie
        self.served = 0
        self.blamed: set[str] = set()

    def fetch(self, file: RemoteFile, start: int, end: int, sink: Sink, cancel: threading.Event) -> int:
        if file.path in self.blamed:  # as the agent's peers do: a blamed file comes from the origin only
            return 0
        data = bytearray((self.copy / file.path).read_bytes()[start:end])
        if self.lie and data:
            data[0] ^= 0xFF
        sink(start, memoryview(bytes(data)))
        self.served += len(data)
        return len(data)

    def blame(self, file: RemoteFile) -> bool:
        self.blamed.add(file.path)
        return True


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[ModelScopeHub]:
    with ModelScopeHub(tmp_path / "hub") as running:
        yield running


def _options(hub: ModelScopeHub, **kwargs: object) -> Options:
    return Options(modelscope_endpoint=hub.endpoint, egress=LOOPBACK, part_size=MiB,
                   concurrency=4, **kwargs)  # type: ignore[arg-type]  # fmt: skip


def _model(root: Path) -> dict[str, bytes]:
    return {k: v for k, v in tree_of(root).items() if not k.startswith(".praesto")}


def test_every_file_comes_from_a_peer_and_none_from_the_hub(hub: ModelScopeHub, tmp_path: Path) -> None:
    files = {"w.safetensors": os.urandom(3 * MiB), "configuration.json": b"{}"}
    hub.add_repo("org/model", files)
    planned = plan(Source("ms", "org/model"), _options(hub))
    download(planned, tmp_path / "first", _options(hub))
    hub.reset_counters()
    peer = CopyPeer(tmp_path / "first")
    result = download(planned, tmp_path / "second", _options(hub), PartSources(peers=peer))
    assert _model(tmp_path / "second") == files
    assert result.bytes_from_peers == sum(map(len, files.values())) and hub.bytes_served == 0


def test_a_lying_peer_is_caught_by_the_hubs_sha256(hub: ModelScopeHub, tmp_path: Path) -> None:
    files = {"w.safetensors": os.urandom(3 * MiB), "configuration.json": b'{"a": 1}'}
    hub.add_repo("org/model", files)
    planned = plan(Source("ms", "org/model"), _options(hub))
    download(planned, tmp_path / "first", _options(hub))
    peer = CopyPeer(tmp_path / "first", lie=True)
    download(planned, tmp_path / "second", _options(hub), PartSources(peers=peer))
    assert _model(tmp_path / "second") == files
    assert peer.blamed == set(files)  # both failed their sha256 and came again from the hub
