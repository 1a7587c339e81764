"""Where each part comes from in a swarm: pure rules shared by the agent and bench/swarm_sim.py.

A star (every follower copies every part from the one node that fetches from the
origin) makes that node's upload carry N-1 copies of the model, so once its NIC is
the limit, time grows linearly with N. Three rules make it a swarm, and a fourth
keeps its tail short; none of them touches the downloader's part order (engine.py):

* `neighbours`: each node asks a bounded, stable, well-mixed set of peers (plus
  the seeder), so polling what peers hold stays cheap at a thousand nodes.
* `pick_peer` (asking side): for each part, among the peers whose offer (`/parts`:
  a Ready copy, or parts a download in flight has written) holds it, the one
  with the fewest uploads under way (what it said plus what this node asks of it);
  ties by a hash of (asker, peer), so askers spread instead of all picking the
  first. When nobody holds it whole yet, a peer receiving it (`Offer.arriving`);
  the seeder only when no other peer holds or receives the part.
* `Fanout` (serving side, every node whose download is in flight): a part goes
  out at most `copies` times per `window` seconds; more askers hear "not yet" and
  find it at a node that got it, which advertises it as soon as it is journaled.
  The seeder (copies=1) uploads about one copy of the model; each follower
  (copies=2) passes each part on twice, so holders of a part double per hop and
  every node's upload carries a bounded share, whatever N. After the window a
  part goes out again, so a receiver that died costs one window, never the
  download. Ready copies serve without this rule: their work is done.
* Cut-through: a part is passed on while it arrives. A node serves the bytes of
  a part it has written so far (download/arrivals.py) to askers that take a
  prefix, and they ask the same node again for the rest (source.py `_again`: its
  server waits for the next bytes), so a follower's copy of a part ends moments
  after its sender's instead of one part's transfer later at each hop.
  Without it the last parts the seeder fetches reach the Nth node only after
  log2(N) whole-part hops: the tail issue 24 measured (1.26x one node at 1,024
  nodes in bench/swarm_sim.py, 1.09-1.16x at 8 agents in bench/p2p_bench.py).

Hashes still come only from the origin's plan: these rules choose senders; the
receiver verifies every file (engine.py) and blames the senders of bad bytes.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

Part = tuple[str, int]  # (file path, part index)
SEEDER_COPIES = 1  # the node fetching from the origin uploads each part once per window
FOLLOWER_COPIES = 2  # a follower passes each part on twice: holders double per hop
FANOUT_WINDOW = 5.0  # seconds before a part already sent `copies` times goes out again
MAX_PEERS = 16  # peers a node asks besides the seeder (`neighbours`)


@dataclass(frozen=True)
class Offer:
    """What one peer can serve now: everything (a Ready copy), or whole files and parts (journaled)."""

    complete: bool = False
    parts: frozenset[Part] = frozenset()
    whole: frozenset[str] = frozenset()  # files verified there
    part_size: int = 0
    busy: int = 0  # uploads under way there when it answered
    # parts it is receiving -> the file offset written up to there: it serves what it wrote so far
    arriving: Mapping[Part, int] = field(default_factory=dict)

    def holds(self, part: Part) -> bool:
        return self.complete or part[0] in self.whole or part in self.parts

    def receiving(self, part: Part, offset: int = 0) -> bool:
        """It is receiving `part` and has written it beyond `offset` (what the asker needs next)."""
        return self.arriving.get(part, 0) > offset


def _spread(asker: str, peer: str) -> int:
    """A stable, well-mixed number per (asker, peer); blake2s: cheapest in hashlib for short keys."""
    return int.from_bytes(hashlib.blake2s(f"{asker}|{peer}".encode(), digest_size=4).digest(), "big")


def pick_peer(
    part: Part,
    offers: Mapping[str, Offer],
    load: Mapping[str, int],
    asker: str,
    *,
    seeders: Iterable[str] = (),
    exclude: Iterable[str] = (),
    offset: int = 0,
) -> str | None:
    """The peer to ask for `part`: the least busy holder that is not a seeder; else the least busy
    one receiving it that has written it beyond `offset`, the asker's next byte (it passes the bytes
    on as they arrive; one behind the asker has nothing for it); else the least busy seeder (it may not
    have the part yet, or have sent it already: it says "not yet"); else None."""
    skip, seeding = set(exclude), list(seeders)
    others = [p for p in offers if p not in skip and p not in seeding]
    holders = [p for p in others if offers[p].holds(part)] or [
        p for p in others if offers[p].receiving(part, offset)
    ]
    if not holders:
        holders = [p for p in seeding if p not in skip]
    if not holders:
        return None

    def busy(peer: str) -> tuple[int, int]:
        offer = offers.get(peer)
        return (offer.busy if offer is not None else 0) + load.get(peer, 0), _spread(asker, peer)

    return min(holders, key=busy)


@dataclass
class Fanout:
    """Serving side of a download in flight: may these parts go out to this asker now? (thread-safe)"""

    copies: int = FOLLOWER_COPIES
    window: float = FANOUT_WINDOW
    _sent: dict[Part, list[tuple[float, str]]] = field(default_factory=dict)  # part -> (when, to whom)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def claim(self, parts: Iterable[Part], asker: str, now: float) -> bool:
        """True (and the parts counted as sent to `asker`) when each went out fewer than `copies`
        times within `window` seconds, or already to this asker (a retry after a cut transfer)."""
        wanted = list(parts)
        with self._lock:
            recent = {p: [s for s in self._sent.get(p, []) if now - s[0] < self.window] for p in wanted}
            if any(len(s) >= self.copies and all(w != asker for _, w in s) for s in recent.values()):
                return False
            for p, sent in recent.items():
                self._sent[p] = [*[s for s in sent if s[1] != asker], (now, asker)]
            return True

    def spent(self, now: float) -> set[Part]:
        """Parts sent `copies` times within the window: not offered (askers go to who got them)."""
        with self._lock:
            return {p for p in self._sent if self._enough(p, now)}

    def sent_enough(self, part: Part, now: float) -> bool:
        with self._lock:
            return self._enough(part, now)

    def _enough(self, part: Part, now: float) -> bool:
        return sum(now - at < self.window for at, _ in self._sent.get(part, ())) >= self.copies


def neighbours(asker: str, peers: Iterable[str], k: int = MAX_PEERS) -> list[str]:
    """The `k` peers `asker` asks (rendezvous hashing): bounded, stable, and different per asker,
    so no peer is everyone's and a part still reaches the whole swarm in a few hops."""
    return sorted(set(peers) - {asker}, key=lambda p: _spread(asker, p))[:k]
