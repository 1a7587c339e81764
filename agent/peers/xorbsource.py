"""Asking peers for Xet xorb ranges (issue 40 item 3): the follower's side of xorbserve.py.

The Xet path (xetfetch.py `file_pieces`) asks for each range the node's chunk store lacks, with
exactly the CAS key, xorb, chunk range and file its own reconstruction named: that reconstruction
came from its own CAS for its tenant's token, so it only asks for chunks that CAS would serve it
(the chunk store's tenancy rule, kept over the wire). Per range, each alive peer of the download
(`PeerSource`) in turn, followers first in an order of their own per asker (rendezvous, as
swarm.neighbours), the seeder last (every follower's first choice otherwise), until one answers:

* 200 with exactly the CAS range's length, read within the range's deadline (the swarm's:
  `Tuning.min_rate`, at least `min_seconds`), whose bytes decode as exactly those chunks (the
  format core's `decode_range`): used. Too slow: a strike (`Tuning.strikes` drop it, as for
  whole-file ranges) and the next peer. Anything else (a wrong length, a short body, bytes that
  do not decode, an error status) drops the peer for the download, and the next one or the CAS
  serves the range. Bytes that decode yet are not the file's fail its Xet hash:
  `blame` drops every peer that sent ranges of it and the file is assembled again without them.
* 404: not held there; the next peer.
* 425: a peer downloading this revision will index the file shortly (its Xet hash not checked
  yet): when no peer has the range, the range waits, polling every `Tuning.not_yet_pause`, at
  most `Tuning.stall_seconds` from the first such answer; then the CAS serves it (the peers are
  not dropped: a seeder honestly saying "not yet" is not lying, and its other ranges may come).
* 503 or 429 (its uploads, or this node's share of its connections, are all taken): the next
  peer, without dropping it; when none served the range, asked again every `Tuning.busy_pause`
  within the range's own time (as whole-file ranges wait for busy peers), also where "not yet" is
  not waited on.

None when no peer served the range: the CAS serves it.
"""

from __future__ import annotations

import http.client
import logging
import threading
import time
from typing import TYPE_CHECKING

from praesto.agent.download.api import DownloadCancelled, DownloadError
from praesto.agent.download.http import Expired, Redirect, Transient
from praesto.agent.download.origins.huggingface.xet import FetchRange, XetFormatError, decode_range
from praesto.agent.peers.protocol import xorbs_path
from praesto.agent.peers.swarm import neighbours
from praesto.agent.peers.transport import NotYet, Slow

if TYPE_CHECKING:
    from praesto.agent.peers.source import PeerSource

log = logging.getLogger("praesto.peers")


class _Missing(Exception):
    """404: the peer does not hold the range."""


class _Busy(Exception):
    """503: the peer's uploads are all taken."""


class XorbPeers:
    """One download's asks for xorb ranges, over its `PeerSource`'s peers and transport."""

    def __init__(self, peers: PeerSource) -> None:
        self.peers = peers
        self._lock = threading.Lock()
        self._sent: dict[str, set[str]] = {}  # file sha256 -> peers that sent ranges of it

    def fetch(
        self, cas: str, sha256: str, source: FetchRange, cancel: threading.Event, *, wait: bool = True
    ) -> bytes | None:
        """`source`'s bytes from a peer; `wait`: a range peers said "not yet" or busy for is asked
        again within the stall bound (else None at once)."""
        tuning = self.peers.tuning
        missing: set[str] = set()
        first_not_yet: float | None = None
        # "busy" is the peer's upload slots, not the range: asked again within the range's own time
        # even when "not yet" is not waited on (a roll's leader asking nodes that serve the swarm)
        busy_until = time.monotonic() + max(tuning.min_seconds, source.length / tuning.min_rate)
        while True:
            with self.peers._lock:  # followers first (spread per asker), the seeder last: it is everyone's
                alive = [p for p in self.peers.alive if p not in missing]
            seeders = [p for p in alive if p in self.peers.seeders]
            others = [p for p in alive if p not in seeders]
            asked = neighbours(self.peers.node, others, len(others)) + seeders
            waiting = busy = False
            for peer in asked:
                try:
                    raw = self._ask(peer, cas, sha256, source, cancel)
                except _Missing:
                    missing.add(peer)
                    continue
                except NotYet:
                    waiting = True
                    continue
                except _Busy:
                    busy = True
                    continue
                except Slow:
                    self.peers._strike(peer)  # as for whole-file ranges: dropped at its second
                    continue
                except (
                    Transient,
                    DownloadError,
                    Expired,
                    Redirect,
                    OSError,
                    http.client.HTTPException,
                ) as err:
                    self.peers._drop(peer, f"xorb range: {type(err).__name__}: {err}")
                    continue
                try:
                    decode_range(raw, source.start, source.end - source.start, source.xorb)
                except XetFormatError as err:
                    self.peers._drop(peer, f"sent a xorb range that is not its chunks: {err}")
                    continue
                with self._lock:
                    self._sent.setdefault(sha256, set()).add(peer)
                return raw
            now = time.monotonic()
            if busy and not wait and now < busy_until:
                if cancel.wait(tuning.busy_pause):
                    raise DownloadCancelled()
                continue
            waiting = waiting or busy
            if not waiting or not wait:
                return None
            first_not_yet = first_not_yet or now
            if now - first_not_yet >= tuning.stall_seconds:
                log.info(
                    "xorb %s: peers said 'not yet' for %gs; the CAS serves it",
                    source.xorb[:12],
                    tuning.stall_seconds,
                )
                return None
            if cancel.wait(tuning.not_yet_pause):
                raise DownloadCancelled()

    def _ask(self, peer: str, cas: str, sha256: str, source: FetchRange, cancel: threading.Event) -> bytes:
        """The range from `peer`, read whole within its deadline; raises for anything else."""
        tuning = self.peers.tuning
        namespace, cache, revision = self.peers.prefix
        path = xorbs_path(namespace, cache, revision, cas, source.xorb, source.start, source.end, sha256)
        url = f"http://{peer}{path}"
        transport = self.peers.transport
        resp = transport.request("GET", url, authorized=False)  # NotYet on 425
        if resp.status in (404, 429, 503):
            resp.read(64 * 1024)
            raise _Missing() if resp.status == 404 else _Busy()
        length = resp.getheader("Content-Length", "")
        if resp.status != 200 or length != str(source.length):
            transport._drop(url)
            raise Transient(f"HTTP {resp.status}, {length or '?'} bytes for a {source.length}-byte range")
        deadline = time.monotonic() + max(tuning.min_seconds, source.length / tuning.min_rate)
        buf = bytearray()
        while len(buf) < source.length:
            if time.monotonic() > deadline or cancel.is_set():
                transport._drop(url)
                if cancel.is_set():
                    raise DownloadCancelled()
                raise Slow()
            data = resp.read1(min(1 << 20, source.length - len(buf)))
            if not data:
                transport._drop(url)
                raise Transient(f"the answer ended after {len(buf)} of {source.length} bytes")
            buf += data
        resp.read()  # b"", and the response marked done: the connection serves the next request
        return bytes(buf)

    def blame(self, sha256: str) -> bool:
        """Drop every peer that sent ranges of the file `sha256` (its Xet hash refused them)."""
        with self._lock:
            senders = self._sent.pop(sha256, set())
        for peer in senders:
            self.peers._drop(peer, "sent xorb ranges of a file that then failed its Xet hash")
        return bool(senders)
