"""A Hugging Face file through Xet, inside the engine: written, hashed and journaled as `resolve/`'s
parts are, verified by the Hub's sha256 the same way, and on any failure fetched again through
`resolve/`.

When: the plan found the file's Xet hash in the Hub's tree listing (an LFS file, so its sha256 is
known), Xet is on (`Options.xet`), and nothing of the file was journaled by an earlier run (a
resumed file finishes through `resolve/`). With peers at this revision (issue 40 item 3), a file
the node's chunk store holds nothing of is copied whole from them as a first download is (ranges
in parallel, passed on as they arrive, "not yet" waited on by the swarm's rules; what no peer
has, from `resolve/`): through Xet it would cross the wire whole anyway, slower, and would
concentrate on the few nodes holding chunks. A roll's leader has no peer at its revision; its
peers hold chunks only (`ChunkPeers.offers_files` false: agent/peers/peering.py), so every file
it fetches comes through Xet and only the chunks no peer holds come from the CAS. Any other
file comes through Xet too, each range the chunk store lacks asked of peers' chunk stores before
the CAS (`ChunkPeers`), and a file whose Xet hash fails after peers sent ranges of it is assembled once
more without them (they are dropped), before any fallback to `resolve/`. The file is one work item:
its terms come in file order (xetfetch.py fetches each range, the format core decodes and checks
it), its bytes are written and hashed in order, and each part is journaled as the bytes pass its
end, so a crash resumes it. Its last part verifies it by sha256 (engine `_verify`, which calls
`XetRoute.mismatch`); a mismatch there, or any `XetFallback` before, starts the file over through
`resolve/` (logged, counted in `Result.xet_fallbacks`, then the agent's
`praesto_agent_xet_fallbacks_total`).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from praesto.agent.download.api import OriginThrottle
from praesto.agent.download.http import CHUNK
from praesto.agent.download.origins.huggingface.xet import Reconstruction
from praesto.agent.download.origins.huggingface.xetfetch import (
    CAUSE_CHECKSUM,
    CAUSE_FORMAT,
    ChunkPeers,
    XetFallback,
    XetOrigin,
)

if TYPE_CHECKING:
    from praesto.agent.download.engine import Engine, FileJob

log = logging.getLogger("praesto.download")


class XetRoute:
    """The engine's whole-file route (access.WholeFileRoute) through one download's `XetOrigin`."""

    def __init__(self, xet: XetOrigin) -> None:
        self.xet = xet

    def eligible(self, engine: Engine, job: FileJob) -> bool:
        return job.file.xet_hash is not None and job.file.sha256 is not None and not job.resumed

    def fetch_file(self, engine: Engine, job: FileJob) -> None:
        """The whole file through Xet; on a failure, every part queued again for `resolve/`."""
        asked: object = engine.peers  # a PartSource; PeerSource also serves Xet chunks (ChunkPeers)
        peers = asked if isinstance(asked, ChunkPeers) and job.file.peers_may_supply else None
        try:
            recon = self.xet.reconstruction(job.file)
            if peers is not None and peers.offers_files and self.xet.held_bytes(recon) == 0:
                log.debug("file=%s: no chunks of it on the node: copied whole from peers", job.file.path)
                job.whole = False
                engine._enqueue([(job, i) for i in range(len(job.parts))])
                return
        except XetFallback as refused:
            fall_back(engine, job, refused.cause, str(refused), 0)
            return
        self._through_xet(engine, job, recon, peers)

    def _through_xet(
        self, engine: Engine, job: FileJob, recon: Reconstruction, peers: ChunkPeers | None
    ) -> None:
        """Assembled through Xet; once more without peers when their ranges failed its Xet hash;
        else through `resolve/`."""
        failed = self._assemble(engine, job, recon, peers)
        blamed = failed is not None and failed[1].cause == CAUSE_FORMAT and peers is not None
        if failed is not None and blamed and peers is not None and peers.blame_chunks(job.file.sha256 or ""):
            # their ranges decoded as chunks, the file's hash refused them: once more without peers
            log.warning("xet file=%s: %s; assembling it again without the peers that sent ranges of it",
                        job.file.path, failed[1])  # fmt: skip
            engine._start_over(job, failed[0])
            failed = self._assemble(engine, job, recon, None)
        if failed is not None:
            fall_back(engine, job, failed[1].cause, str(failed[1]), failed[0])

    def _assemble(
        self, engine: Engine, job: FileJob, recon: Reconstruction, peers: ChunkPeers | None
    ) -> tuple[int, XetFallback] | None:
        """Write the file's pieces, journaling its parts as they pass; None when all went, else the
        bytes written before the failure and the failure."""
        assert job.hasher is not None
        written = 0
        done_parts, last = 0, len(job.parts) - 1

        def from_peers(n: int) -> None:  # a peer's xorb range: what crossed the wire, like the CAS's
            with engine._cond:
                engine.result.bytes_from_peers += n

        try:
            pieces = self.xet.file_pieces(
                job.file, engine.options.cancel, engine.count_route_bytes,
                recon=recon, peers=peers, peer_wire=from_peers,
            )  # fmt: skip
            for piece in pieces:
                view = memoryview(piece)
                for at in range(0, len(view), CHUNK):
                    _write(engine, job, written + at, view[at : at + CHUNK])
                written += len(view)
                while done_parts < last and job.parts[done_parts][1] <= written:  # journaled as they pass
                    engine._part_done(job, done_parts)
                    done_parts += 1
        except XetFallback as failed:
            return written, failed
        for index in range(done_parts, last + 1):  # the last part verifies the file (engine._verify)
            engine._part_done(job, index)
        return None

    def mismatch(self, engine: Engine, job: FileJob, why: str) -> None:
        """Xet's own hashes passed, the Hub's sha256 did not: counted, and the engine starts the
        file over through `resolve/`; the chunk store drops the index it just wrote for it."""
        self.xet.forget_chunks(job.file)
        fall_back(engine, job, CAUSE_CHECKSUM, why, 0)

    def behind(self, throttle: OriginThrottle) -> XetRoute:
        """This route with its CAS range requests behind the origin budget (fetch/, before the run)."""
        return XetRoute(self.xet.behind(throttle))

    def close(self) -> None:
        self.xet.close()


def _write(engine: Engine, job: FileJob, offset: int, chunk: memoryview) -> None:
    """What the engine's sink does with a fetched chunk: written (O_DIRECT where it can), hashed in
    order, made known to peers copying the file as it arrives, counted for progress."""
    assert job.hasher is not None
    direct = job.direct
    written = len(chunk) if direct is not None and direct.write(offset, chunk) else 0
    while written < len(chunk):
        written += os.pwrite(job.fd, chunk[written:], offset + written)
    index = min(offset // engine.options.part_size, len(job.parts) - 1)
    if engine.arrivals is not None:
        engine.arrivals.reached(job.file.path, index, offset + len(chunk))
    job.hasher.feed(offset, chunk)
    engine._progress(len(chunk), wire=0)  # the origin's bytes are the xorb ranges (engine.count_route_bytes)


def fall_back(engine: Engine, job: FileJob, cause: str, why: str, counted: int) -> None:
    """Log and count the fallback, start the file over and queue its parts for `resolve/`."""
    log.warning("xet fallback file=%s cause=%s: %s; fetching it through resolve/", job.file.path, cause, why)
    job.whole = False
    with engine._cond:
        fallbacks = engine.result.xet_fallbacks
        fallbacks[cause] = fallbacks.get(cause, 0) + 1
    if cause != CAUSE_CHECKSUM:  # a checksum mismatch is already being started over by _verify
        engine._start_over(job, counted)
        engine._enqueue([(job, i) for i in range(len(job.parts))])
