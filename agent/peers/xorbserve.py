"""The peer server's Xet chunks: xorb ranges from this node's chunk store, per cache (issue 40 item 3).

    GET /v1/caches/<namespace>/<cache>/<revision>/xorbs/<CAS key>/<xorb>?chunks=<a>-<b>&file=<sha256>

answers chunks [a, b) of `xorb` exactly as a CAS range of them (each chunk's 8-byte header and its
stored bytes, in order: the xorb's own format, so the asker's format core decodes and checks it as
it would the CAS's), from the chunk store under the asker's CAS key (`xetstore.cas_key`, the
folder the asker's own reconstruction reaches locally). It passes the server's authorization first
(a signed, Pod-bound token of a node holding a ModelCacheNode of this cache, 401/403), and then
serves only chunks named by the indexes of files of *this cache* on this node: the sha256s its
complete copies' manifests list (held.py: the served one and the one beside it, whatever their
revision: chunks are content-addressed, and the asker checks every byte) or the plan of its download in flight at `revision`. Another cache's files,
on this node or not, reach nothing here. Each chunk is read back and hashed against its name before
it goes out (a bad one is dropped from the store and the answer cut short: the asker drops this
peer for the range and asks elsewhere).

Not held (no index of this cache's files names every chunk): 404, the asker's next source. The one
exception is cut-through: when this node is downloading `revision` and the asker's `file` is in its
plan and not verified yet, 425 (Too Early) with Retry-After, since its Xet path indexes the file's
chunks as soon as its Xet hash matches; the asker waits for it within the swarm's stall bound
(xorbsource.py). Chunks arriving in a file not yet verified are not served: their (xorb, index) ->
hash map is written only for a verified file, and nothing unverified leaves a node.

Bounded: at most a xorb's chunks (8192), and refused unread beyond `MAX_XORB_STORED_BYTES` (a
xorb's 64 MiB of chunk data and a header per chunk), sent a chunk at a time (≤ 256 KiB + 8 bytes
in memory), through the node's chunk upload cap (half its `max_uploads`, apart from the file
uploads: a roll's leader asks for chunks on the swarm's critical path, and must not queue behind
the parts followers copy), its bytes/s limit and the response deadline (conns.py).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from praesto.agent.download.origins.huggingface.xet.limits import MAX_XORB_CHUNKS, MAX_XORB_STORED_BYTES
from praesto.agent.download.origins.huggingface.xetstore import ChunkStore
from praesto.agent.peers.identity import Refused
from praesto.agent.peers.protocol import XORBS_QUERY

if TYPE_CHECKING:
    from praesto.agent.peers.server import PeerServer

_CAS = re.compile(r"[0-9a-f]{32}")
_HASH = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Ask:
    cas: str  # xetstore.cas_key of the asker's CAS
    xorb: str
    start: int
    end: int  # exclusive
    sha256: str  # the file the asker's reconstruction named these chunks for


def parse(cas: str, xorb: str, query: str) -> Ask:
    """The request's CAS key, xorb and chunk range; `Refused` (400) naming the field that is wrong."""
    if not _CAS.fullmatch(cas):
        raise Refused(400, f"{cas[:40]!r}: not a CAS key (32 hex digits, xetstore.cas_key)")
    if not _HASH.fullmatch(xorb):
        raise Refused(400, f"{xorb[:80]!r}: not a xorb hash (64 hex digits)")
    m = XORBS_QUERY.fullmatch(query)
    if m is None:
        raise Refused(400, "query: expected chunks=<first>-<end>&file=<sha256> (xorbsource.py sends it)")
    start, end = int(m[1]), int(m[2])
    if not 0 <= start < end <= MAX_XORB_CHUNKS:
        raise Refused(400, f"chunks {start}-{end}: not a range within a xorb's {MAX_XORB_CHUNKS} chunks")
    return Ask(cas, xorb, start, end, m[3])


class NotYet(Exception):
    """This node's download in flight will index the asker's file: ask again in a moment."""


def lookup(server: PeerServer, namespace: str, cache: str, revision: str, ask: Ask) -> list[str]:
    """The chunk hashes of the range, as this cache's indexes here name them; `NotYet`, or `Refused`
    (404) when they do not name every one."""
    files = server.held.digests(namespace, cache)
    flight = server.inflight.flight(namespace, cache, revision)
    if flight is not None:
        files.update(flight.digests)
    known = ChunkStore(server.layout.xet_chunks_dir).held_by(ask.cas, ask.xorb, files)
    hashes = [known.get(i) for i in range(ask.start, ask.end)]
    if all(h is not None for h in hashes):
        return [h for h in hashes if h is not None]
    if flight is not None and ask.sha256 in flight.digests:
        written = server.inflight.written(flight)
        if written is None or flight.digests[ask.sha256] not in written.verified:
            raise NotYet()
    raise Refused(
        404, f"chunks {ask.start}-{ask.end} of xorb {ask.xorb[:12]} are not held for {namespace}/{cache}"
    )


def serve(handler: Any, namespace: str, cache: str, revision: str, cas: str, xorb: str, query: str) -> None:
    """Answer one authorized xorb-range request on `handler` (server.py's `_Handler`)."""
    server: PeerServer = handler.server
    try:
        ask = parse(cas, xorb, query)
        hashes = lookup(server, namespace, cache, revision, ask)
    except Refused as refused:
        handler._error(refused.status, refused.message)
        return
    except NotYet:
        handler._not_yet(f"xorb {xorb[:12]}", 0)
        return
    store = ChunkStore(server.layout.xet_chunks_dir)
    sizes = []
    for chunk in hashes:
        try:
            sizes.append(os.stat(store.chunk_path(chunk)).st_size)
        except OSError:
            handler._error(404, f"a chunk of xorb {xorb[:12]} is gone from this node")
            return
    total = sum(sizes)
    if total > MAX_XORB_STORED_BYTES:
        handler._error(404, f"chunks {ask.start}-{ask.end} hold more than a xorb may ({total} bytes)")
        return
    if not server.chunk_uploads.acquire(blocking=False):
        handler._error(503, "chunk upload limit reached on this node; try another peer", retry_after="1")
        return
    server.count_busy(1)
    try:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/octet-stream")
        handler.send_header("Content-Length", str(total))
        handler.end_headers()
        _send(handler, store, ask, hashes, sizes, total)
    finally:
        server.count_busy(-1)
        server.chunk_uploads.release()


def _send(handler: Any, store: ChunkStore, ask: Ask, hashes: list[str], sizes: list[int], total: int) -> None:
    """Each chunk read back, checked against its hash, then sent within the node's rate and the
    response's deadline; a chunk that fails its check (or changed size) cuts the answer short."""
    server: PeerServer = handler.server
    conns, sock = server.conns, handler.connection
    allowance = server.limits.send_seconds(total)
    try:
        for index, chunk, size in zip(range(ask.start, ask.end), hashes, sizes, strict=True):
            found = store.read_raw(ask.xorb, index, chunk)
            if found is None or len(found[0]) != size:
                handler.close_connection = True
                return
            view = memoryview(found[0])
            while view:
                want = server.rate.take(len(view))
                began = time.monotonic()
                conns.expect(sock, allowance, f"xorb range of {total} bytes")
                handler.wfile.write(view[:want])
                conns.expect(sock, None)
                if allowance is not None:
                    allowance -= time.monotonic() - began
                server.served(want)
                view = view[want:]
        handler.wfile.flush()
    except OSError:
        handler.close_connection = True  # the asker went away or stopped reading, or we are stopping
