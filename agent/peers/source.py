"""`PeerSource`: the downloader's `PartSource` backed by other nodes' copies, Ready or in flight.

Per byte range it asks the peer `swarm.pick_peer` names among those whose
`/parts` offer holds that part (offers polled every `Tuning.offer_seconds`,
peers found again every `Tuning.discover_seconds` through `discover`), so a
swarm of followers copies from each other, not all from the seeder. Senders of
each file are remembered, so bad bytes are blamed on exactly who sent them. It
moves on to another peer when one is busy (503 with Retry-After), waits while
every peer that may have the part is busy, and gives the rest of the range back
to the origin when
peers are gone, refuse (401/404/416), answer wrongly, or are slower than
`Tuning.min_rate` over the range. A peer that fails, or is slow `strikes` times,
or sent bytes that failed verification is dropped for the rest of the download.
Nothing a peer says is trusted: hashes come from the origin's plan.

A peer still downloading the file answers 425 for ranges it has not written yet
(server.py): the range waits for it (backoff up to Retry-After) rather than going
to the origin. Nothing a peer claims is trusted to mean progress (its offer, its
written count, its Retry-After), so waiting is bounded twice (issue 21 item 10):
a range waits on "not yet" at most `Tuning.stall_seconds` beyond its own time
(then the origin takes the rest and the peer is dropped), and a peer that answers
only "busy", or only "not yet" for one range of a part its offer claims, without
delivering a byte for `stall_seconds` is dropped. (The seeder rightly says "not
yet" to every follower asking early for a part it has not begun, or already sent
to others: counted per range and only for claimed parts, that does not drop it.
"Busy" is the node's state, so it counts whatever the range.)
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from praesto.agent.download.api import DownloadCancelled, DownloadError, RemoteFile, Sink, Target
from praesto.agent.download.http import Expired, Redirect, Transient
from praesto.agent.download.origins.huggingface.xet import FetchRange
from praesto.agent.peers import auth
from praesto.agent.peers.protocol import file_path, parts_path
from praesto.agent.peers.swarm import MAX_PEERS, Offer, neighbours, pick_peer
from praesto.agent.peers.transport import NotYet, PeerTransport, Slow
from praesto.agent.peers.xorbsource import XorbPeers

log = logging.getLogger("praesto.peers")


@dataclass(frozen=True)
class Tuning:
    min_rate: int = 4 << 20  # bytes/s a peer must sustain over a range, else the origin takes over
    min_seconds: float = 3.0  # every range gets at least this long
    timeout: float = 5.0  # socket timeout: a peer that stops sending is gone
    strikes: int = 2  # slow ranges before a peer is dropped
    busy_pause: float = 0.2  # all peers busy: wait this long, until the range's deadline
    stall_seconds: float = 60.0  # a peer answering only "not yet" or "busy" this long is dropped
    not_yet_pause: float = 0.25  # longest wait between asks for a range not written yet (a hop's lag)
    offer_seconds: float = 0.25  # how old peers' offers (what parts they hold) may get
    discover_seconds: float = 2.0  # how often peers are looked for again (new followers)
    max_peers: int = MAX_PEERS  # peers asked besides the seeders (swarm.neighbours): bounded polling


class PeerSource:
    def __init__(
        self,
        peers: dict[str, str],
        credentials: auth.Credentials,
        namespace: str,
        cache: str,
        revision: str,
        tuning: Tuning | None = None,
        *,
        seeders: list[str] | None = None,
        discover: Callable[[], dict[str, str]] | None = None,
        proxies: Mapping[str, str] | None = None,
        chunks_only: bool = False,
    ) -> None:
        """`peers` and what `discover` returns: address -> the node it serves (from its
        ModelCacheNode, whose status only that node's agent may write): tokens are minted for it.
        `proxies`: the download's Options.proxies (a NO_PROXY that leaves out the Pod network
        sends peer requests through the proxy, as it sends the origin's). `chunks_only`: peers
        holding other revisions, asked for Xet chunks and nothing else (peering.py, a roll's
        leader): no file parts, and a range they say "not yet" for is not waited on (they may
        well be waiting for this very download)."""
        self.tuning = tuning or Tuning()
        self.chunks_only = chunks_only
        self.offers_files = not chunks_only  # xetfetch.ChunkPeers: files are copied whole from these
        self.node = credentials.node
        self.seeders = list(seeders or [])  # peers fetching from the origin: asked for parts nobody has
        self.discover = discover
        self.offers: dict[str, Offer] = {}
        self._polled = 0.0
        self._discovered = time.monotonic()
        self._polling = threading.Lock()
        self.prefix = (namespace, cache, revision)
        self.nodes = dict(peers)
        self.transport = PeerTransport(
            credentials, self.tuning.timeout, lambda address: self.nodes[address], proxies
        )
        asked = neighbours(self.node, list(peers), self.tuning.max_peers)
        self.alive = list(dict.fromkeys([*self.seeders, *asked]))
        self.dropped: dict[str, str] = {}  # address -> why
        self._lock = threading.Lock()
        self._load = dict.fromkeys(self.alive, 0)
        self._sent: dict[str, set[str]] = {}  # file path -> peers that delivered bytes of it
        self._origin_only: set[str] = set()
        self._strikes = dict.fromkeys(self.alive, 0)
        # (peer, file, range start) -> since when the peer answered only "not yet" for that range, or
        # (peer, "", -1): only "busy" (its upload slots are the node's, whatever the range)
        self._waiting: dict[tuple[str, str, int], float] = {}
        self.xorbs = XorbPeers(self)  # Xet xorb ranges from the same peers (xorbsource.py)

    # ---- PartSource ------------------------------------------------------------
    def fetch(self, file: RemoteFile, start: int, end: int, sink: Sink, cancel: threading.Event) -> int:
        if file.path in self._origin_only or self.chunks_only:
            return 0
        budget = max(self.tuning.min_seconds, (end - start) / self.tuning.min_rate)
        deadline = time.monotonic() + budget
        latest = deadline + self.tuning.stall_seconds  # "not yet" never stretches a range beyond this
        delivered, tried, waits = 0, set[str](), 0
        follow: str | None = None  # the peer that just passed a prefix: it has the next bytes first
        while start + delivered < end:
            peer = self._again(follow) or self._choose(file.path, start + delivered, tried)
            follow = None
            if peer is None:
                if not self.alive or time.monotonic() >= deadline:  # every one that may have it is busy
                    break
                if cancel.wait(self.tuning.busy_pause):
                    raise DownloadCancelled()
                tried.clear()
                continue
            try:
                got, arriving = self._from(peer, file, start + delivered, end, sink, cancel, deadline, tried)
                delivered += got
            except NotYet as early:
                # a peer that does not claim the part (the seeder, before it began it) honestly says
                # "not yet": only `latest` bounds waiting there. One claiming it has `stall_seconds`.
                claimed = self._claims(peer, file.path, start + delivered)
                key, said = (peer, file.path, start), f"answered only 'not yet' ({early})"
                if claimed and not self._still_waiting(key, said):
                    continue
                if time.monotonic() >= latest:
                    stall = self.tuning.stall_seconds
                    self._drop(peer, f"claimed a part it had not sent {stall:g}s after it was due")
                    break
                waits += 1
                pause = min(self.tuning.not_yet_pause, 0.05 * 2**waits, early.retry_after or 1.0)
                if cancel.wait(pause):
                    raise DownloadCancelled() from None
                # the range's time starts when its bytes exist, up to `latest`
                deadline = min(time.monotonic() + budget, latest)
                continue
            if arriving:  # the peer passes the range on as it arrives there: the rest's time starts now
                waits = 0
                follow = peer
                rest = max(self.tuning.min_seconds, (end - start - delivered) / self.tuning.min_rate)
                deadline = min(time.monotonic() + rest, latest)
            if time.monotonic() >= deadline:
                break
        return delivered

    def blame(self, file: RemoteFile) -> bool:
        with self._lock:
            senders = self._sent.pop(file.path, set())
            self._origin_only.add(file.path)
        for peer in senders:
            self._drop(peer, f"sent bytes of {file.path} that failed verification against the origin's hash")
        return bool(senders)

    # ---- Xet chunks (xetfetch.ChunkPeers; xorbsource.py asks, xorbserve.py answers) ------------
    def xorb_range(self, cas: str, sha256: str, source: FetchRange, cancel: threading.Event) -> bytes | None:
        return self.xorbs.fetch(cas, sha256, source, cancel, wait=not self.chunks_only)

    def blame_chunks(self, sha256: str) -> bool:
        return self.xorbs.blame(sha256)

    # ---- internals ---------------------------------------------------------------
    def _from(
        self,
        peer: str,
        file: RemoteFile,
        pos: int,
        end: int,
        sink: Sink,
        cancel: threading.Event,
        deadline: float,
        tried: set[str],
    ) -> tuple[int, bool]:
        """Bytes `peer` delivered from `pos`, and whether it sent all it has written of a range still
        arriving there (a prefix: ask again for the rest)."""
        got = [0]
        prefix = False

        def counted(offset: int, chunk: memoryview) -> None:
            if time.monotonic() > deadline:
                raise Slow()
            if not got[0]:
                with self._lock:
                    self._sent.setdefault(file.path, set()).add(peer)
                    for key in [k for k in self._waiting if k[0] == peer]:
                        del self._waiting[key]  # it delivers: its clocks start again
            sink(offset, chunk)
            got[0] += len(chunk)

        path = file_path(*self.prefix, quote(file.path))
        try:
            sent = self.transport.fetch_by(
                deadline, Target(f"http://{peer}{path}", False), pos, end, counted, cancel
            )
            prefix = 0 < sent < end - pos
        except Slow:
            self._strike(peer)
        except Transient as err:
            if err.retry_after is not None:  # busy: it said when to come back
                tried.add(peer)
                self._still_waiting((peer, "", -1), "answered only 'busy'")  # the node's, not the range's
            else:
                self._drop(peer, str(err))
        except (DownloadError, Expired, Redirect) as err:
            self._drop(peer, str(err))
        finally:
            with self._lock:
                self._load[peer] = self._load.get(peer, 1) - 1
        return got[0], prefix

    def _choose(self, path: str, pos: int, tried: set[str]) -> str | None:
        """`swarm.pick_peer` over the alive peers' offers; peers without an offer count as seeders."""
        self._refresh()
        with self._lock:
            offers = {p: o for p, o in self.offers.items() if p in self.alive}
            size = next((o.part_size for o in offers.values() if o.part_size), 0)
            seeders = [p for p in self.seeders if p in self.alive] or [
                p for p in self.alive if p not in offers
            ]
            if not seeders and not any(o.complete for o in offers.values()):
                seeders = list(self.alive)  # every offer is partial: wait at whoever may get the part
            part = (path, pos // size if size else 0)
            peer = pick_peer(part, offers, self._load, self.node, seeders=seeders, exclude=tried, offset=pos)
            if peer is not None:
                self._load[peer] = self._load.get(peer, 0) + 1
            return peer

    def _again(self, peer: str | None) -> str | None:
        """`peer` again, for the rest of a range it is passing on as it arrives there, while it is
        alive. Not chosen afresh: its offer, up to `offer_seconds` old, shows it written only up to
        where the asker now is, so `pick_peer` would send the asker to the seeder for a "not yet" and
        a pause; its server instead waits for the next bytes. Each hop of the swarm lagged its sender
        by about a pause and an offer's age (bench/p2p_bench.py: followers Ready 0.4-1.4 s after the
        seeder); the simulation's copy follows its sender to the part's end (bench/swarm_sim.py)."""
        if peer is None:
            return None
        with self._lock:
            if peer not in self.alive:
                return None
            self._load[peer] = self._load.get(peer, 0) + 1
            return peer

    def _claims(self, peer: str, path: str, pos: int) -> bool:
        """Whether `peer`'s last offer says it holds, or is receiving beyond `pos`, the part at `pos`."""
        with self._lock:
            offer = self.offers.get(peer)
        if offer is None:
            return False
        part = (path, pos // offer.part_size if offer.part_size else 0)
        return offer.holds(part) or offer.receiving(part, pos)

    def _refresh(self) -> None:
        """Poll every alive peer's offer when they are older than `offer_seconds` (one thread at a time)."""
        now = time.monotonic()
        if now - self._polled < self.tuning.offer_seconds or not self._polling.acquire(blocking=False):
            return
        try:
            if self.discover is not None and now - self._discovered >= self.tuning.discover_seconds:
                self._discovered = now
                self._add(self.discover())
            with self._lock:
                peers = list(self.alive)
            offers = {p: o for p in peers if (o := self._offer(p)) is not None}
            with self._lock:
                self.offers = offers
            self._polled = time.monotonic()
        finally:
            self._polling.release()

    def _add(self, peers: dict[str, str]) -> None:
        with self._lock:
            for address, node in peers.items():
                self.nodes.setdefault(address, node)
            addresses = list(peers)
            known = set(self.alive) | set(self.dropped)
            room = self.tuning.max_peers + len(self.seeders) - len(self.alive)
            for peer in neighbours(self.node, [a for a in addresses if a not in known], max(0, room)):
                if peer not in self.alive and peer not in self.dropped:
                    self.alive.append(peer)
                    self._load.setdefault(peer, 0)
                    self._strikes.setdefault(peer, 0)

    def _offer(self, peer: str) -> Offer | None:
        """What `peer` says it holds, or None when it cannot say (then it is asked like a seeder)."""
        try:
            resp = self.transport.request("GET", f"http://{peer}{parts_path(*self.prefix)}", authorized=False)
            body = resp.read()
            if resp.status != 200:
                return None
            data = json.loads(body)
            busy = int(data.get("busy") or 0)
            if data.get("complete"):
                return Offer(complete=True, busy=busy)
            files = data.get("files") or {}
            whole = [path for path, held in files.items() if held == "all"]
            size = int(data.get("partSize") or 0)
            return Offer(
                parts=_parts_of(files),
                whole=frozenset(whole),
                part_size=size,
                busy=busy,
                arriving=_arriving(data.get("arriving") or {}),
            )
        except (NotYet, Transient, OSError, ValueError, http.client.HTTPException):
            return None

    def _still_waiting(self, key: tuple[str, str, int], answered: str) -> bool:
        """False (and the peer dropped) once, for one range, it gave no byte for `stall_seconds` of
        answers that are not bytes: what it says about its own progress (written count, Retry-After)
        may be a lie. Per range, not per peer: a seeder that rightly says "not yet" to each follower
        for the parts it already sent to others (swarm.Fanout) is not stalling any one of them."""
        peer = key[0]
        now = time.monotonic()
        with self._lock:
            since = self._waiting.setdefault(key, now)
        if now - since <= self.tuning.stall_seconds:
            return True
        self._drop(peer, f"{answered} and sent nothing for {self.tuning.stall_seconds:g}s")
        return False

    def _strike(self, peer: str) -> None:
        with self._lock:
            self._strikes[peer] = self._strikes.get(peer, 0) + 1
            out = self._strikes[peer] >= self.tuning.strikes
        if out:
            self._drop(peer, f"slower than {self.tuning.min_rate >> 20} MiB/s {self.tuning.strikes} times")

    def _drop(self, peer: str, why: str) -> None:
        with self._lock:
            if peer not in self.alive:
                return
            self.alive.remove(peer)
            self.dropped[peer] = why
        log.warning("peer %s dropped for this download: %s", peer, why)

    def close(self) -> None:
        self.transport.close()


def _parts_of(files: dict[str, Any]) -> frozenset[tuple[str, int]]:
    """(path, index) of every part listed in a `/parts` answer's per-file lists."""
    return frozenset((path, int(i)) for path, held in files.items() if isinstance(held, list) for i in held)


def _arriving(files: dict[str, Any]) -> dict[tuple[str, int], int]:
    """(path, index) -> offset written up to, of every part a `/parts` answer lists as arriving."""
    return {
        (path, int(index)): int(upto)
        for path, held in files.items()
        if isinstance(held, list)
        for index, upto in (pair for pair in held if isinstance(pair, list) and len(pair) == 2)
    }
