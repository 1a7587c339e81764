"""The Xet chunk store's room counts against the node's reserve (issue 40 item 2): a download's chunk
writes are reserved beside its files before any byte is written; when they would cross the reserve
the chunk store is emptied first, and when even that leaves no room for them the download keeps no
chunks (no copy is evicted for them) while its files still come through Xet. The unit cases use
the disk room as the agent does; the last runs the agent, its real job and status writer, against
the real API server and the CAS double hf_xet uploaded to."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from praesto.agent import capacity
from praesto.agent.copies import CacheRef, Copies
from praesto.agent.download import api as dlapi
from praesto.agent.download.origins.huggingface import xetstore
from praesto.agent.download.origins.huggingface.xetstore import chunk_store_bytes
from praesto.agent.room import DiskRoom

from praesto import names, store
from testkit.agent_harness import Env, env_context, tree
from testkit.hub_xet import HubXet
from testkit.kube_real import RealKube
from tests.agent.test_disk_room import _copy, _plan
from tests.agent.test_xet_chunk_store import CAS_A, fill
from tests.xet.conftest import Repo

KIB = 1024
TOTAL = 1024 * KIB  # the small disk of the unit cases


def small_disk(base: Path, monkeypatch: pytest.MonkeyPatch, total: int) -> None:
    """A disk of `total` bytes on which whatever the base holds is used (a hard link once)."""

    def disk(_: Path) -> capacity.Disk:
        held: dict[int, int] = {}
        for path in base.rglob("*"):
            with contextlib.suppress(OSError):  # a file renamed meanwhile is counted where it went
                if path.is_file():
                    held[path.stat().st_ino] = path.stat().st_size
        return capacity.Disk(total, total - sum(held.values()))

    monkeypatch.setattr(capacity, "disk_usage", disk)


def xet_plan(cache: str, size: int) -> tuple[CacheRef, dlapi.Plan]:
    ref, plan = _plan(cache, size)
    return ref, replace(plan, files=tuple(replace(f, xet_hash="c" * 64) for f in plan.files))


def held_chunks(layout: store.StoreLayout) -> int:
    return xetstore.stored_bytes(layout.xet_chunks_dir)


def test_chunk_writes_are_reserved_beside_the_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    layout, copies = store.StoreLayout(tmp_path), Copies()
    small_disk(tmp_path, monkeypatch, TOTAL)
    room = DiskRoom(layout, copies, "0")
    ref, plan = xet_plan("asking", 300 * KIB)
    assert chunk_store_bytes(plan) >= 300 * KIB and chunk_store_bytes(_plan("plain", 300 * KIB)[1]) == 0
    assert room.make_room(ref, plan) == []
    assert room.reservations.held[(ref.namespace, ref.cache)] == 300 * KIB + chunk_store_bytes(plan)
    assert room.stores_chunks((ref.namespace, ref.cache))
    # a second plan counts the first one's chunks as spent: 300 KiB of files + chunks leave < 400 KiB
    other, other_plan = _plan("plain", 450 * KIB)
    with pytest.raises(dlapi.LastingDownloadError, match=r"600\.3 KiB of it promised") as refused:
        room.make_room(other, other_plan)
    assert refused.value.reason == "InsufficientDiskSpace"


def test_chunk_writes_that_would_cross_the_reserve_empty_the_chunk_store_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout, copies = store.StoreLayout(tmp_path), Copies()
    small_disk(tmp_path, monkeypatch, TOTAL)
    fill(layout.xet_chunks_dir, CAS_A, "5" * 64, [os.urandom(100 * KIB) for _ in range(4)])
    room = DiskRoom(layout, copies, "0")
    ref, plan = xet_plan("asking", 400 * KIB)  # the file fits beside the store; with its chunks not
    assert room.make_room(ref, plan) == []
    assert held_chunks(layout) == 0  # emptied at plan time, before any byte of the download
    assert room.stores_chunks((ref.namespace, ref.cache))


def test_no_copy_is_evicted_for_chunks_the_download_keeps_none_instead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout, copies = store.StoreLayout(tmp_path), Copies()
    small_disk(tmp_path, monkeypatch, TOTAL)
    _copy(layout, copies, "idle", 200 * KIB, used=time.time() - 100)
    room = DiskRoom(layout, copies, "0")
    ref, plan = xet_plan("asking", 600 * KIB)  # fits; with its chunks only by evicting "idle"
    assert room.make_room(ref, plan) == []
    assert layout.is_complete(ref.namespace, "idle")
    key = (ref.namespace, ref.cache)
    assert not room.stores_chunks(key) and room.reservations.held[key] == 600 * KIB
    room.release(key)
    assert room.stores_chunks(key)  # the next download asks again


@pytest.fixture
def env(tmp_path: Path, kube: RealKube, repo: Repo) -> Iterator[Env]:
    for env in env_context(kube, tmp_path):
        env.add_model("xetty", **repo.files)
        env.hub.xet = HubXet(repo.double)
        env.hub.xet.add(repo.uploaded.values())
        yield env


def test_an_agent_short_of_room_for_chunks_fetches_through_xet_and_keeps_none(
    env: Env, repo: Repo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy fits above the reserve, its chunks would not: Ready through Xet, no chunk written."""
    model = sum(len(data) for data in repo.files.values())
    small_disk(env.base, monkeypatch, total=model + model // 2)
    env.create_mcn("xetty")
    env.start(xet=True)
    status = env.wait_phase("xetty", names.PHASE_READY)
    assert tree(env.layout.cache_dir("team-a", "xetty")) == repo.files
    assert status["xet"]["files"] > 0 and "fallbacks" not in status["xet"]
    assert held_chunks(env.layout) == 0
