"""Swarm versus star at N = 16 ... 1024 nodes: a discrete-event simulation, no network.

(Just over 400 lines: the simulation and its report are one model read top to bottom.)

    python -m bench.swarm_sim [--model-gib 2] [--part-mib 16] [--origin-mbps 50] [--origin-conns 8]
                              [--upload-gbps 10] [--download-gbps 10] [--nodes 16,64,256,1024] [--field]

Every node fetches every part of one model, `concurrency` parts at a time in the
downloader's order (engine.py: the same order on every node). The seeder (the
node that fetches from the origin) gets each part over one of its connections
at `origin-mbps`. A follower asks, per part, the peer the agent's own rules name
(agent/peers/swarm.py, the code the agent runs): `pick_peer` over the offers of
its `neighbours` plus the seeder, where an in-flight node offers a part until
its `Fanout` sent it `copies` times; a node holding the whole model is Ready and
serves without that rule. A node has `max_uploads` upload slots (503 beyond, as
the peer server) and `concurrency` download slots, and a transfer runs at
min(upload / max_uploads, download / concurrency): a NIC's bandwidth shared by
its slots, never exceeded. With cut-through (the agent's rule since issue 24 item
2; `--no-cut-through` for the rule before) a part still arriving at a node is
offered and passed on: the copy ends at max(its own transfer time, when the part
is whole at the sender). A worker with no peer to ask waits until a part
appears at, or a slot frees on, a peer it asked (or the fan-out window passes).
"star" is the rule before the swarm: every follower copies every part from the
seeder, which then uploads N-1 copies of the model.

It prints per N: time until every node holds the model, origin bytes and the
seeder's upload as multiples of the model. Left out: TCP dynamics, disk and CPU,
request latency and the agent's polling lag, failing peers (tests/peers).

Run here 2026-12-06 (defaults: 2 GiB in 16 MiB parts, 8 x 50 MB/s origin, 10 GbE per node;
one node alone 5.4 s; 55 s on one AMD EPYC core), swarm / one node, with cut-through and
(`--no-cut-through`) without:

       N   star s  swarm s  swarm/1 node  without cut-through  origin  seeder upload star/swarm
      16     26.1      5.4         1.00x                1.14x   1.00x              15.0x/1.0x
      64    108.6      5.5         1.02x                1.16x   1.00x              63.0x/1.0x
     256    438.4      5.7         1.06x                1.22x   1.00x             255.0x/1.1x
    1024   1757.8      5.7         1.06x                1.26x   1.00x            1023.0x/1.1x

`--field` adds the shape users quote (#24 item 3), run 2026-12-06 with cut-through (2 min; before
it, 2026-12-04: 6.0 min, 1.01x one node, at both sizes):

    field shape: 140 GB model (522 parts of 256 MiB), origin 8 x 50 MB/s, 25 GbE per node; one node alone 5.9 min
         N  swarm min  swarm/1 node  origin swarm   star min  all-origin min  origin all-origin
        64        5.9         1.00x         1.00x       47.1             5.9                64x
      1024        5.9         1.00x         1.00x      764.5             5.9              1024x

How to read it, and what Dragonfly and KServe publish beside it: `FIELD_COMPARISON` below, also
printed on docs/benchmarks.md.

Without cut-through the swarm's time grows with the depth of the spread (hops of one
part's transfer each); with it, a hop costs only the moment the part is whole at the
sender, so the time stays near one node's. A tiny model (parts <= parts in flight)
shows a longer tail: nodes whose neighbours have all passed a part on twice wait for
the fan-out window.
"""

from __future__ import annotations

import argparse
import functools
import heapq
import math
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from praesto.agent.peers.swarm import (
    FANOUT_WINDOW,
    FOLLOWER_COPIES,
    MAX_PEERS,
    SEEDER_COPIES,
    Fanout,
    Offer,
    neighbours,
    pick_peer,
)

from bench.common import record

FILE = "model.safetensors"
SEEDER = "node-0000"


@dataclass(frozen=True)
class Setup:
    nodes: int
    parts: int = 128  # of `part_bytes`: 2 GiB
    part_bytes: int = 16 << 20
    origin: float = 50e6  # bytes/s per origin connection (a CDN's per-connection rate)
    upload: float = 1.25e9  # bytes/s per node: 10 GbE
    download: float = 1.25e9
    concurrency: int = 8  # parts in flight per download (connections)
    max_uploads: int = 8  # the peer server's concurrent uploads
    max_peers: int = MAX_PEERS
    swarm: bool = True
    cut_through: bool = True  # a part is passed on while it arrives (peers/server.py serves its prefix)


@dataclass(frozen=True)
class Outcome:
    seconds: float  # until every node holds the model
    origin_bytes: int
    seeder_upload: int  # bytes the seeder uploaded to peers
    model_bytes: int
    ready: int  # nodes holding the whole model


@dataclass
class _Wake:
    """A waiting worker's retry, run at most once whichever event comes first."""

    sim: _Sim
    action: Callable[[], None]
    fired: bool = False

    def __call__(self) -> None:
        if not self.fired:
            self.fired = True
            self.sim.at(self.sim.now, self.action)


@dataclass
class _Node:
    name: str
    fanout: Fanout
    peers: list[str]
    have: set[int] = field(default_factory=set)
    arriving: dict[int, float] = field(default_factory=dict)  # part -> when it will be whole here
    next: int = 0  # the next part a free worker takes
    uploads: int = 0
    uploaded: int = 0
    done_at: float | None = None
    waiting: dict[int, list[_Wake]] = field(default_factory=dict)  # part -> who waits for it here
    slot_waiting: deque[_Wake] = field(default_factory=deque)  # who found every slot busy, in turn


class _Sim:
    def __init__(self, s: Setup) -> None:
        self.s = s
        self.now = 0.0
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        names = [f"node-{i:04d}" for i in range(s.nodes)]
        followers = names[1:]
        self.nodes = {
            n: _Node(
                n,
                Fanout(SEEDER_COPIES if n == SEEDER else FOLLOWER_COPIES, FANOUT_WINDOW),
                (neighbours(n, followers, s.max_peers) if s.swarm else []),
            )
            for n in names
        }
        self.origin_bytes = 0
        self.peer_rate = min(s.upload / s.max_uploads, s.download / s.concurrency)

    def at(self, when: float, action: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._events, (when, self._seq, action))

    def run(self) -> Outcome:
        for node in self.nodes.values():
            for _ in range(self.s.concurrency):
                self.at(0.0, functools.partial(self._work, node))
        while self._events:
            self.now, _, action = heapq.heappop(self._events)
            action()
        done = [n.done_at for n in self.nodes.values() if n.done_at is not None]
        return Outcome(
            seconds=max(done, default=float("inf")) if len(done) == len(self.nodes) else float("inf"),
            origin_bytes=self.origin_bytes,
            seeder_upload=self.nodes[SEEDER].uploaded,
            model_bytes=self.s.parts * self.s.part_bytes,
            ready=len(done),
        )

    def _work(self, node: _Node) -> None:
        """A free worker takes the next part in order (the engine's queue)."""
        if node.next >= self.s.parts:
            return
        part, node.next = node.next, node.next + 1
        if node.name == SEEDER:
            seconds = self.s.part_bytes / min(self.s.origin, self.s.download / self.s.concurrency)
            self.origin_bytes += self.s.part_bytes
            self._arriving(node, part, self.now + seconds)
        else:
            self._ask(node, part)

    def _offers(self, node: _Node, part: int) -> dict[str, Offer]:
        """What the /parts answers of `node`'s peers say about `part` (the rest does not matter)."""
        offers = {}
        for name in node.peers:
            peer = self.nodes[name]
            if peer.done_at is not None:
                offers[name] = Offer(complete=True, busy=peer.uploads)
            elif peer.fanout.sent_enough((FILE, part), self.now):
                continue
            elif part in peer.have:
                offers[name] = Offer(parts=frozenset({(FILE, part)}), busy=peer.uploads)
            elif self.s.cut_through and part in peer.arriving:
                offers[name] = Offer(arriving={(FILE, part): 1}, busy=peer.uploads)  # askers start at 0
        return offers

    def _ask(self, node: _Node, part: int) -> None:
        asked = [SEEDER, *node.peers]
        offers = self._offers(node, part)
        tried: set[str] = set()
        while True:
            chosen = pick_peer((FILE, part), offers, {}, node.name, seeders=[SEEDER], exclude=tried)
            if chosen is None:
                break
            src = self.nodes[chosen]
            if src.uploads >= self.s.max_uploads:  # 503: try the next one
                tried.add(chosen)
                continue
            free = src.done_at is not None or not self.s.swarm  # a Ready copy, or the star's seeder
            there = part in src.have or (self.s.cut_through and part in src.arriving)
            if there and (free or src.fanout.claim([(FILE, part)], node.name, self.now)):
                self._transfer(src, node, part)
                return
            break  # 425: not there yet, or sent enough: wait
        retry = _Wake(self, lambda: self._ask(node, part))
        for name in asked:
            peer = self.nodes[name]
            peer.waiting.setdefault(part, []).append(retry)
            if name in tried:
                peer.slot_waiting.append(retry)
        self.at(self.now + FANOUT_WINDOW, retry)  # the window passes: the seeder sends it again

    def _transfer(self, src: _Node, dst: _Node, part: int) -> None:
        src.uploads += 1
        src.uploaded += self.s.part_bytes

        def finish() -> None:
            src.uploads -= 1
            while src.slot_waiting:  # the freed slot goes to the first still waiting
                wake = src.slot_waiting.popleft()
                if not wake.fired:
                    wake()
                    break
            self._arrived(dst, part)

        whole = self.now + self.s.part_bytes / self.peer_rate
        if part not in src.have:  # cut through: the last byte leaves src only once it arrived there
            whole = max(whole, src.arriving[part])
        self._arriving(dst, part, whole, finish)

    def _arriving(self, node: _Node, part: int, whole: float, then: Callable[[], None] | None = None) -> None:
        """`part` starts arriving at `node` and is whole at `whole`; with cut-through, askers
        waiting for it may copy it from here now."""
        node.arriving[part] = whole
        self.at(whole, then or (lambda: self._arrived(node, part)))
        if self.s.cut_through:
            for wake in node.waiting.pop(part, []):
                wake()

    def _arrived(self, node: _Node, part: int) -> None:
        node.have.add(part)
        node.arriving.pop(part, None)
        if len(node.have) == self.s.parts:
            node.done_at = self.now
        for wake in node.waiting.pop(part, []):
            wake()
        if node.done_at is not None:  # Ready: every waiter may come now
            for waiting in node.waiting.values():
                for wake in waiting:
                    wake()
            node.waiting.clear()
        self._work(node)


def simulate(setup: Setup) -> Outcome:
    return _Sim(setup).run()


# The shape users quote: a 70B model in fp16 to many GPU nodes on 25 GbE, from an origin giving
# 8 connections of 50 MB/s (a CDN's per-connection rate).
FIELD_MODEL_BYTES = 140 * 10**9
FIELD_NODES = (64, 1024)
FIELD_NIC_GBPS = 25.0
FIELD_PART_MIB = 256  # coarser than the agent's 16 MiB parts: 8,345 parts x 1,024 nodes is hours in Python
FIELD_COMPARISON = (
    "The star is bound by one seeder uploading N-1 copies; every node from the origin is as fast as "
    "one node only if the origin serves N x its per-node rate at once (1,024 nodes: 410 GB/s, 143 TB). "
    "Coarse parts lengthen the swarm's tail (a hop is one part), so its figure is pessimistic. "
    "What others publish, not measured here: the CNCF blog on Dragonfly (2026-04-06, "
    "https://www.cncf.io/blog/2026/04/06/peer-to-peer-acceleration-for-ai-model-distribution-with-dragonfly) "
    "puts a 130 GB model to 200 nodes at about 130 GB of origin traffic instead of 26 TB, the 1.00x the "
    "swarm shows here; the 70-80 % of node bandwidth quoted for Dragonfly we did not find in a source we "
    "could read. KServe's LocalModelCache is reported by secondary sources (not KServe's documentation) "
    "to take a Llama 3 70B start from 15-20 min to about 1 min: that is reading a copy already on the "
    "node (our warm-node and prewarm paths, bench.prewarm_bench), not distributing one."
)


def field_shapes(part_mib: int = FIELD_PART_MIB, nodes: tuple[int, ...] = FIELD_NODES) -> None:
    """Print the swarm (simulated) next to the star and "every node from the origin" (both exact
    without simulation: the star is bound by the seeder's upload of N-1 copies, every node from the
    origin by each node's own origin rate, if the origin can serve N times it at once).

    Coarser parts lengthen the swarm's tail (a hop is one part's transfer), so the swarm figure is
    pessimistic by at most a few hops of 0.7 s (256 MiB at 25 GbE / 8 slots)."""
    part = part_mib << 20
    base = Setup(
        nodes=1,
        parts=math.ceil(FIELD_MODEL_BYTES / part),
        part_bytes=part,
        upload=FIELD_NIC_GBPS * 1e9 / 8,
        download=FIELD_NIC_GBPS * 1e9 / 8,
    )
    model = base.parts * part
    alone = simulate(base).seconds
    print(f"field shape: {model / 1e9:.0f} GB model ({base.parts} parts of {part_mib} MiB), origin "
          f"{base.concurrency} x {base.origin / 1e6:g} MB/s, {FIELD_NIC_GBPS:g} GbE per node; one node alone "
          f"{alone / 60:.1f} min")  # fmt: skip
    print(f"{'N':>6} {'swarm min':>10} {'swarm/1 node':>13} {'origin swarm':>13} {'star min':>10} "
          f"{'all-origin min':>15} {'origin all-origin':>18}")  # fmt: skip
    rows: list[list[str]] = []
    for n in nodes:
        swarm = simulate(Setup(**{**base.__dict__, "nodes": n}))
        star = max(alone, (n - 1) * model / base.upload)
        print(f"{n:6d} {swarm.seconds / 60:10.1f} {swarm.seconds / alone:12.2f}x "
              f"{swarm.origin_bytes / model:12.2f}x {star / 60:10.1f} {alone / 60:15.1f} "
              f"{n:17d}x")  # fmt: skip
        rows.append([str(n), f"{swarm.seconds / 60:.1f} min ({swarm.seconds / alone:.2f}x one node)",
                     f"{swarm.origin_bytes / model:.2f}x", f"{star / 60:.1f} min", f"{alone / 60:.1f} min",
                     f"{n}x"])  # fmt: skip
    record(
        "field",
        f"field shape: {model / 1e9:.0f} GB to many nodes on {FIELD_NIC_GBPS:g} GbE, origin "
        f"{base.concurrency} x {base.origin / 1e6:g} MB/s (simulated, {part_mib} MiB parts)",
        {
            "columns": ["N", "swarm", "origin bytes, swarm", "star", "every node from the origin",
                        "origin bytes, every node from the origin"],
            "rows": rows,
            "note": FIELD_COMPARISON,
        },
    )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-gib", type=float, default=2.0)
    parser.add_argument("--part-mib", type=int, default=16)
    parser.add_argument("--origin-mbps", type=float, default=50.0, help="per origin connection, MB/s")
    parser.add_argument("--origin-conns", type=int, default=8, help="connections (= parts in flight)")
    parser.add_argument("--upload-gbps", type=float, default=10.0, help="per node NIC, Gbit/s")
    parser.add_argument("--download-gbps", type=float, default=10.0, help="per node NIC, Gbit/s")
    parser.add_argument("--nodes", default="16,64,256,1024")
    parser.add_argument(
        "--field",
        action="store_true",
        help="also print the field shape: 140 GB to 64 and 1,024 nodes on 25 GbE",
    )
    parser.add_argument(
        "--no-cut-through",
        action="store_true",
        help="parts passed on only once whole (the agent before it served a part's written prefix)",
    )
    args = parser.parse_args()
    part = args.part_mib << 20
    base = Setup(
        nodes=1,
        parts=max(1, round(args.model_gib * (1 << 30) / part)),
        part_bytes=part,
        origin=args.origin_mbps * 1e6,
        upload=args.upload_gbps * 1e9 / 8,
        download=args.download_gbps * 1e9 / 8,
        concurrency=args.origin_conns,
        cut_through=not args.no_cut_through,
    )
    model = base.parts * part
    alone = simulate(base).seconds
    print(f"model {model / 2**30:.2f} GiB in {base.parts} parts; origin {args.origin_conns} x "
          f"{args.origin_mbps:g} MB/s; per node upload {args.upload_gbps:g} Gbit/s, download "
          f"{args.download_gbps:g} Gbit/s; one node alone {alone:.1f} s")  # fmt: skip
    print(f"{'N':>6} {'star s':>9} {'swarm s':>9} {'swarm/1 node':>13} {'origin star':>12} "
          f"{'origin swarm':>13} {'seeder upload star':>19} {'swarm':>6}")  # fmt: skip
    series: dict[str, list[float]] = {"swarm": [], "star": [], "every node from the origin": []}
    counts = [int(v) for v in args.nodes.split(",")]
    for n in counts:
        star = simulate(Setup(**{**base.__dict__, "nodes": n, "swarm": False, "cut_through": False}))
        swarm = simulate(Setup(**{**base.__dict__, "nodes": n}))
        series["swarm"].append(swarm.seconds)
        series["star"].append(star.seconds)
        series["every node from the origin"].append(alone)
        print(f"{n:6d} {star.seconds:9.1f} {swarm.seconds:9.1f} {swarm.seconds / alone:12.2f}x "
              f"{star.origin_bytes / model:11.2f}x {swarm.origin_bytes / model:12.2f}x "
              f"{star.seeder_upload / model:18.1f}x {swarm.seeder_upload / model:5.1f}x")  # fmt: skip
    record(
        "series",
        f"seconds until every node holds a {model / 2**30:.0f} GiB model (simulated)",
        {"x": counts, "alone": alone, "series": series},
    )
    if args.field:
        field_shapes()
    return 0


if __name__ == "__main__":
    sys.exit(main())
