"""The node's Xet chunk store (agent/download/origins/huggingface/xetstore.py) against the double the
real hf_xet client uploaded to: a revision roll and a second repository fetch from the CAS only the
chunks the node does not hold (counted by the double's served bytes); a corrupt stored chunk is
refused and fetched again; a kill between the chunks and their index leaves a store that recovers;
eviction's garbage collection drops chunks no copy needs."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from praesto.agent import eviction
from praesto.agent.download.api import Options, Result
from praesto.agent.download.crashpoints import ENV as CRASH_ENV
from praesto.agent.download.crashpoints import XET_CHUNKS_WRITTEN
from praesto.agent.download.fetch import download, plan
from praesto.agent.download.origins.huggingface import xetstore
from praesto.agent.download.origins.huggingface.xet import XetFormatError, parse_reconstruction
from praesto.agent.download.origins.huggingface.xet.limits import MAX_XORB_STORED_BYTES

from praesto import store
from praesto.spec import Source
from testkit.egress import LOOPBACK_ENV
from testkit.hub import LocalHub
from testkit.hub_xet import HubXet
from testkit.xet import HfXet, Uploaded, XetDouble, running_double
from tests.download.conftest import options_for, tree_of
from tests.xet.conftest import MIB

REPO, OTHER = "org/rolled", "other-team/merged"
NAME = "model.safetensors"
SIZE = 6 * MIB
# A fine-tune rewrites whole tensors: two of them, 5 % of the file each, so ~10 % of the ~100
# chunks change (plus the chunks their edges fall in). Scattered 16-byte edits would change 10 %
# of the chunks too, but the chunks a random byte falls in are the larger ones (16.8 % of the
# bytes for 10 of 101 chunks, measured): what a roll costs is the bytes of the chunks it changes.
TENSORS = (0.2, 0.7)  # where each rewritten tensor starts, as a fraction of the file
TENSOR = SIZE // 20


def revisions() -> tuple[bytes, bytes, bytes]:
    """v1; v2 with ~10 % of its chunks changed; another repository's file sharing v1's first half."""
    rnd = random.Random(402)
    v1 = rnd.randbytes(SIZE)
    v2 = bytearray(v1)
    for start in TENSORS:
        at = int(SIZE * start)
        v2[at : at + TENSOR] = rnd.randbytes(TENSOR)
    other = v1[: SIZE // 2] + rnd.randbytes(SIZE // 2)
    return v1, bytes(v2), other


@dataclass
class Uploads:
    double: XetDouble
    files: dict[str, bytes]  # "v1", "v2", "other"
    uploaded: dict[str, Uploaded]


@pytest.fixture(scope="module")
def uploads(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Uploads]:
    folder = tmp_path_factory.mktemp("xet-revisions")
    files = dict(zip(("v1", "v2", "other"), revisions(), strict=True))
    for label, data in files.items():
        (folder / label).mkdir()
        (folder / label / NAME).write_bytes(data)
    with running_double() as double:
        client = HfXet(double, tmp_path_factory.mktemp("xet-cache"))
        uploaded = {label: client.upload([folder / label / NAME])[0] for label in files}  # in order: dedup
        yield Uploads(double, files, uploaded)


@pytest.fixture
def hub(uploads: Uploads, tmp_path: Path) -> Iterator[LocalHub]:
    with LocalHub(tmp_path / "hub") as server:
        server.add_repo(REPO, {NAME: uploads.files["v1"]})
        server.add_repo(OTHER, {NAME: uploads.files["other"]})
        server.xet = HubXet(uploads.double)
        server.xet.add(uploads.uploaded.values())
        yield server


def node_options(hub: LocalHub, base: Path) -> Options:
    layout = store.StoreLayout(base)
    return options_for(hub, xet=True, xet_stall_seconds=5.0, blobs_dir=layout.blobs_dir)


def fetch(hub: LocalHub, uploads: Uploads, repo: str, node: Path, dest: Path) -> tuple[Result, int]:
    """One download on the node at `node`; its result and the bytes the CAS served for it."""
    before = uploads.double.store.counters.range_bytes_served
    options = node_options(hub, node)
    result = download(plan(Source("hf", repo, "main", (), ()), options), dest, options)
    return result, uploads.double.store.counters.range_bytes_served - before


def chunks_root(node: Path) -> Path:
    return store.StoreLayout(node).xet_chunks_dir


def test_the_store_sits_beside_the_blob_store_under_its_literal_names(tmp_path: Path) -> None:
    """A rename would strand every node's chunks (tests/test_store_layout.py guards the rest)."""
    layout = store.StoreLayout(tmp_path)
    assert layout.xet_chunks_dir == tmp_path / ".praesto" / "blobs" / "xet"
    chunks = xetstore.ChunkStore(layout.xet_chunks_dir)
    assert chunks.chunk_path("ab" + "0" * 62) == layout.xet_chunks_dir / "chunks" / "ab" / ("ab" + "0" * 62)
    index = chunks.index_path("k", "e" * 64, "f" * 64)
    assert index == layout.xet_chunks_dir / "files" / "k" / ("e" * 64) / ("f" * 64)


def test_a_revision_roll_fetches_only_the_changed_chunks(
    uploads: Uploads, hub: LocalHub, tmp_path: Path
) -> None:
    node = tmp_path / "node"
    first, served_first = fetch(hub, uploads, REPO, node, tmp_path / "v1")
    assert tree_of(tmp_path / "v1") == {NAME: uploads.files["v1"]}
    assert served_first >= SIZE * 0.95 and first.xet_fallbacks == {}
    hub.commit(REPO, {NAME: uploads.files["v2"]})
    rolled, served = fetch(hub, uploads, REPO, node, tmp_path / "v2")
    assert tree_of(tmp_path / "v2") == {NAME: uploads.files["v2"]}
    assert (rolled.xet_files, rolled.xet_fallbacks) == (1, {})
    assert 0 < served <= 0.15 * SIZE, f"the roll took {served / SIZE:.1%} of the file from the CAS"
    assert rolled.bytes_from_xet == served
    # without the store (a node that never held v1), the same roll takes the whole file
    _, cold = fetch(hub, uploads, REPO, tmp_path / "cold", tmp_path / "v2-cold")
    assert cold >= SIZE * 0.95


def test_a_second_repository_fetches_only_the_chunks_it_does_not_share(
    uploads: Uploads, hub: LocalHub, tmp_path: Path
) -> None:
    node = tmp_path / "node"
    fetch(hub, uploads, REPO, node, tmp_path / "first")
    result, served = fetch(hub, uploads, OTHER, node, tmp_path / "second")
    assert tree_of(tmp_path / "second") == {NAME: uploads.files["other"]}
    assert result.xet_fallbacks == {}
    assert 0.4 * SIZE <= served <= 0.6 * SIZE, f"took {served / SIZE:.1%} for a file half of which is here"


def test_a_corrupt_stored_chunk_is_refused_and_fetched_again(
    uploads: Uploads, hub: LocalHub, tmp_path: Path
) -> None:
    clean, rotten = tmp_path / "clean", tmp_path / "rotten"
    for node in (clean, rotten):
        fetch(hub, uploads, REPO, node, node / "v1")
    # the file's first chunk (v2 keeps it: its first rewritten tensor starts 20 % in) flipped on one node
    [index] = [p for p in (chunks_root(rotten) / "files").rglob("*") if p.is_file()]  # v1: one xorb
    first_chunk = __import__("json").loads(index.read_text())["terms"][0][2][0]
    stored = xetstore.ChunkStore(chunks_root(rotten)).chunk_path(first_chunk)
    data = bytearray(stored.read_bytes())
    data[100] ^= 0xFF
    stored.write_bytes(bytes(data))
    hub.commit(REPO, {NAME: uploads.files["v2"]})
    _, served_clean = fetch(hub, uploads, REPO, clean, clean / "v2")
    result, served_rotten = fetch(hub, uploads, REPO, rotten, rotten / "v2")
    assert tree_of(rotten / "v2") == {NAME: uploads.files["v2"]}
    assert result.xet_fallbacks == {}  # a bad stored chunk is a miss, not a failure of the file
    assert served_rotten > served_clean  # its range came from the CAS again
    assert xetstore.verify_all(chunks_root(rotten)) == 0  # and the store holds it right again


def test_a_kill_between_the_chunks_and_their_index_leaves_a_store_that_recovers(
    uploads: Uploads, hub: LocalHub, tmp_path: Path
) -> None:
    node = tmp_path / "node"
    blobs = store.StoreLayout(node).blobs_dir
    args = [sys.executable, "-m", "praesto.agent.cli", "download", f"hf://{REPO}", "--dest", str(tmp_path / "d"),
            "--endpoint", hub.endpoint, "--xet", "true", "--blobs-dir", str(blobs), "--quiet"]  # fmt: skip
    env = {**os.environ, **LOOPBACK_ENV, "HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf")}
    killed = subprocess.run(
        args, env={**env, CRASH_ENV: XET_CHUNKS_WRITTEN}, capture_output=True, timeout=120
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    root = chunks_root(node)
    assert list((root / "chunks").rglob("*")) and not list(root.glob("files/*/*/*"))  # chunks, no index
    resumed = subprocess.run(args, env=env, capture_output=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert tree_of(tmp_path / "d") == {NAME: uploads.files["v1"]}
    assert indexed(root) == {uploads.uploaded["v1"].sha256}
    _age(root)
    eviction.gc_blobs(store.StoreLayout(node))  # the copy still links its blob: its chunks stay
    assert not list(root.rglob(f"{store.TEMP_PREFIX}*"))
    assert xetstore.verify_all(root) == 0
    hub.commit(REPO, {NAME: uploads.files["v2"]})
    _, served = fetch(hub, uploads, REPO, node, tmp_path / "v2")
    assert 0 < served <= 0.15 * SIZE  # the recovered store serves the roll


def test_eviction_drops_the_chunks_no_copy_needs(uploads: Uploads, hub: LocalHub, tmp_path: Path) -> None:
    node = tmp_path / "node"
    layout = store.StoreLayout(node)
    fetch(hub, uploads, REPO, node, tmp_path / "first")
    fetch(hub, uploads, OTHER, node, tmp_path / "second")
    root = layout.xet_chunks_dir
    both = xetstore.stored_bytes(root)
    _age(root)
    eviction.gc_blobs(layout)  # both copies link their blobs: nothing goes
    assert xetstore.stored_bytes(root) == both
    shutil.rmtree(tmp_path / "first")  # the first copy is gone: its blob's only link is the blob area
    eviction.gc_blobs(layout)
    left = xetstore.stored_bytes(root)
    assert 1.4 * SIZE <= both <= 1.6 * SIZE  # the shared half is stored once
    assert SIZE <= left <= 1.05 * SIZE, "the second repository's chunks stay, the first's alone go"
    assert indexed(root) == {uploads.uploaded["other"].sha256} and xetstore.verify_all(root) == 0
    shutil.rmtree(tmp_path / "second")
    eviction.gc_blobs(layout)
    assert xetstore.stored_bytes(root) == 0


def indexed(root: Path) -> set[str]:
    """The files (by sha256) the store holds an index of."""
    return {p.name for p in root.glob("files/*/*/*")}


def _age(root: Path) -> None:
    """Past the grace `collect` gives a download in flight."""
    past = time.time() - 2 * xetstore.GRACE_SECONDS
    for path in root.rglob("*"):
        os.utime(path, (past, past))


def test_a_xorb_of_incompressible_chunks_reaches_past_64_mib_by_its_headers() -> None:
    """hf_xet cuts a xorb at 64 MiB of chunk data; stored plain with a header each, its ranges end
    past 64 MiB (67,117,351 bytes for random data): accepted, and not a byte past the headers."""
    chunks, size = 1024, 64 * MIB
    xorb = "ab" * 32

    def doc(last_byte: int) -> dict[str, object]:
        ranges = [{"chunks": {"start": 0, "end": chunks}, "bytes": {"start": 0, "end": last_byte}}]
        return {
            "terms": [{"hash": xorb, "unpacked_length": size, "range": {"start": 0, "end": chunks}}],
            "xorbs": {xorb: [{"url": "https://cas.example/x", "ranges": ranges}]},
        }

    assert parse_reconstruction(doc(size + chunks * 8 - 1), size).size == size
    with pytest.raises(XetFormatError, match="outside a xorb"):
        parse_reconstruction(doc(MAX_XORB_STORED_BYTES), size)


def test_a_file_the_hubs_sha256_refuses_leaves_no_index(
    uploads: Uploads, hub: LocalHub, tmp_path: Path
) -> None:
    """The listing names another file's Xet hash (same size): Xet assembles and verifies that file,
    the Hub's sha256 refuses it, and the store must not index its chunks under this sha256."""
    assert hub.xet is not None
    hub.xet.hashes[uploads.uploaded["v1"].sha256] = uploads.uploaded["v2"].hash
    node = tmp_path / "node"
    result, _ = fetch(hub, uploads, REPO, node, tmp_path / "v1")
    assert tree_of(tmp_path / "v1") == {NAME: uploads.files["v1"]}
    assert set(result.xet_fallbacks) == {"checksum"}
    assert uploads.uploaded["v1"].sha256 not in indexed(chunks_root(node))
