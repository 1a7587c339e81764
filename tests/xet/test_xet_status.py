"""A copy's status says what the Xet path did (issue 40 item 1): the agent, through its real status
writer and the real API server (whose CRD schema would prune an undeclared field), writes
`status.xet` on Ready: the files that came through the CAS, its bytes, and the files that fell back
to resolve/ by cause, as the metric counts them; a later download without Xet removes it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from praesto.agent.download.origins.huggingface import xetstore
from praesto.agent.download.origins.huggingface.xetfetch import CAUSE_CAS

from praesto import names, store
from testkit.agent_harness import Env, env_context, tree
from testkit.hub_xet import HubXet
from testkit.kube_real import RealKube
from tests.xet.conftest import Repo

CACHE = "xetty"


@pytest.fixture
def env(tmp_path: Path, kube: RealKube, repo: Repo) -> Iterator[Env]:
    """The agent's harness, its Hub serving the repository hf_xet uploaded, LFS files marked as in Xet."""
    for env in env_context(kube, tmp_path):
        env.add_model(CACHE, **repo.files)
        env.hub.xet = HubXet(repo.double)
        env.hub.xet.add(repo.uploaded.values())
        yield env


def xet_files(repo: Repo) -> int:
    return sum(1 for data in repo.files.values() if len(data) > 1024)  # the Hub's LFS files


def test_ready_says_how_many_files_came_through_xet(env: Env, repo: Repo) -> None:
    env.create_mcn(CACHE)
    env.start(xet=True)
    status = env.wait_phase(CACHE, names.PHASE_READY)
    assert tree(env.layout.cache_dir("team-a", CACHE)) == repo.files
    assert status["xet"]["files"] == xet_files(repo)
    assert status["xet"]["bytesFromCas"] > 0 and "fallbacks" not in status["xet"]
    assert xetstore.stored_bytes(env.layout.xet_chunks_dir) > 0  # room for them: the node keeps chunks


def test_fallbacks_to_resolve_show_on_the_copy_and_in_the_metric(
    env: Env, repo: Repo, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(repo.double.store.faults, "status", 500)  # every CAS request answers 500
    env.create_mcn(CACHE)
    env.start(xet=True)
    status = env.wait_phase(CACHE, names.PHASE_READY)
    assert tree(env.layout.cache_dir("team-a", CACHE)) == repo.files
    assert status["xet"] == {"files": 0, "bytesFromCas": 0, "fallbacks": {CAUSE_CAS: xet_files(repo)}}
    assert env.metric("praesto_agent_xet_fallbacks_total", cause=CAUSE_CAS) == xet_files(repo)


def test_a_download_without_xet_removes_the_report(env: Env, repo: Repo) -> None:
    """status.xet is the last download's: a copy fetched again with Xet off does not keep it."""
    env.create_mcn(CACHE)
    env.start(xet=True)
    env.wait_phase(CACHE, names.PHASE_READY)
    assert env.agent is not None
    env.agent.stop()
    marker = env.layout.complete_marker("team-a", CACHE)
    marker.unlink()  # no longer a complete copy: the next agent downloads it again
    env.start(xet=False)
    env.wait(lambda: marker.exists() and "xet" not in env.status(CACHE), "status.xet gone")
    assert env.status(CACHE)["phase"] == names.PHASE_READY
    assert env.metric("praesto_agent_xet_files_total") == 0


def test_the_agents_scrub_drops_a_flipped_chunk(env: Env) -> None:
    """The agent hands the chunk store to its scrubber (node_agent.py): once an interval, within the
    scrub's byte budget, a chunk whose bytes no longer hash to its name is found and dropped."""
    env.create_mcn(CACHE)
    env.start(xet=True, scrub_interval=600.0)
    env.wait_phase(CACHE, names.PHASE_READY)
    chunks = sorted(p for p in (env.layout.xet_chunks_dir / store.XET_CHUNK_DATA).rglob("*") if p.is_file())
    bad = chunks[len(chunks) // 2]
    data = bytearray(bad.read_bytes())
    data[-1] ^= 0xFF
    bad.write_bytes(bytes(data))
    env.skip(601)  # the chunk store's scrub is due once an interval has passed since the agent started
    env.wait(lambda: not bad.exists(), "the scrub dropped the flipped chunk")
    assert all(p.exists() for p in chunks if p != bad)
    assert "scrub dropped bad Xet chunks" in env.log.getvalue()
