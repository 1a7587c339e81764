"""Issue 40 item 4 (d): `--nodes` nodes (default 8) via peers, on bench/xet_bench.py's models and doubles.

    python -m bench.xet_peers_bench [--nodes 8] [--size-mib 256] [--rounds 3] [--cap-mib-s 50] [--roll-seeder 0]

Each round: `--nodes` fresh nodes (own blob and chunk store, own peer server on loopback), all
selected at once as the agent's peering orders them (agent/peers/peering.py): one node fetches from
the origin (it seeds; its download in flight is offered to the others), the others ask every
other node and take from the origin only what no peer gives. node-0 seeds v1; node-`--roll-seeder`
seeds the roll: 0, the node that seeded v1 (the lowest name, which leads when no node is
downloading yet), or 1, a node that copied v1 from peers (a roll's leader is whichever node is
downloading first: `peering._leader`). The roll is published beside the served copy, which keeps
serving (agent/rolling.py), and its leader asks for Xet chunks only the nodes whose last download
went through Xet (peering.py `_chunk_source`, from status.xet.files). Two steps: (1) a first
download of the first repository at v1, (2) the roll to v2 (every shard rewrites 10 % of its
bytes); and, as a second contender, (3) the same roll on fresh nodes that each took v1 alone
through Xet first (not counted): a follower copies a first download whole from peers, which
leaves no chunks on it, so in (2) only node-0 holds v1's chunks: seeding the roll
(`--roll-seeder 0`) it takes only the changed chunks from the origin and the followers copy v2
whole from it; with `--roll-seeder 1` node-1 seeds v2 holding none of them, takes the unchanged
chunks from node-0 and only the changed ones from the origin. In (3) every node holds
them and only the changed chunks cross between peers. Per step:
seconds until every node holds the revision, the origin's bytes (the CAS's xorb ranges plus
`resolve/`) as a share of the *chunks needed* (what one node alone, with its own chunk store, takes
from the origin for the same step: measured once, before the rounds), and the bytes that crossed
between peers as a share of the model. Target (issue 40): the origin ≤ 1.0x the chunks needed.

All nodes run as threads of this process (one GIL, 2 CPUs, one disk): the seconds say little about a
cluster, the bytes are exact. Peer requests are not authenticated here (a stand-in authorizer and
unsigned requests): tests/peers and tests/xet/test_chunk_peers.py prove authentication against the
real API server; this figure counts bytes. The origin answers through one link of `--cap-mib-s`
(0: uncapped), as bench/xet_bench.py's capped rounds do.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from praesto.agent.download.api import Options, PartSources, Plan, Result
from praesto.agent.download.fetch import download, plan
from praesto.agent.download.origins.huggingface import xetmemory
from praesto.agent.peers.auth import Credentials
from praesto.agent.peers.identity import PeerAuthorizer
from praesto.agent.peers.server import Limits, PeerServer
from praesto.agent.peers.source import PeerSource

from bench.common import ROUNDS, interleaved, print_table
from bench.xet_bench import REPO, Link, MiB, served
from praesto import store
from praesto.spec import Source
from testkit.egress import LOOPBACK
from testkit.hub import LocalHub
from testkit.xet import XetDouble

NAMESPACE, CACHE = "bench", "m"
STEPS = ("first download", "revision roll")
WARM_ROLL = "revision roll, each node holding v1's chunks"  # v1 came through Xet on every node


class _Anyone:
    """The stand-in authorizer: every request is some bench node's, holding a copy of the cache."""

    def authenticate(self, method: str, path: str, headers: Any) -> str:
        return "bench"

    def authorise(self, node: str, namespace: str, cache: str) -> None:
        return None


@dataclass
class _Unsigned:
    """The stand-in credentials: requests go unsigned (the stand-in authorizer reads nothing)."""

    node: str

    def sign(self, target: str, method: str, path: str, headers: Mapping[str, str]) -> dict[str, str]:
        return {}


@dataclass
class Node:
    name: str
    root: Path
    server: PeerServer

    @property
    def layout(self) -> store.StoreLayout:
        return store.StoreLayout(self.root)

    def options(self, hub: LocalHub) -> Options:
        layout = self.layout
        return Options(
            endpoint=hub.endpoint,
            egress=LOOPBACK,
            xet=True,
            blobs_dir=layout.blobs_dir,
            staging_dir=layout.staging_dir(NAMESPACE, CACHE),
        )


def origin_bytes(hub: LocalHub, double: XetDouble) -> int:
    return double.store.counters.range_bytes_served + sum(hub.bytes_by_path.values())


def alone(work: Path, hub: LocalHub, double: XetDouble, commits: tuple[str, ...]) -> dict[str, int]:
    """The chunks needed: what one node with its own chunk store takes from the origin per step."""
    with tempfile.TemporaryDirectory(prefix="alone-", dir=work) as root:
        options = Options(
            endpoint=hub.endpoint,
            egress=LOOPBACK,
            xet=True,
            blobs_dir=store.StoreLayout(Path(root)).blobs_dir,
        )
        needed = {}
        for step, commit in zip(STEPS, commits, strict=False):
            before = origin_bytes(hub, double)
            download(
                plan(Source("hf", REPO, commit, (), ()), options),
                Path(root) / step.replace(" ", "-"),
                options,
            )
            needed[step] = origin_bytes(hub, double) - before
        return needed


def step(
    nodes: list[Node], hub: LocalHub, wanted: Plan, seed: int, indexed: set[str], roll: bool
) -> tuple[float, list[Result]]:
    """Every node downloads `wanted` at once: node-`seed` seeds, asking for Xet chunks only the
    nodes in `indexed` (whose last download went through Xet: status.xet.files, as
    Peering._chunk_source picks them), the others ask every other node first (as Peering.attach
    orders them). `roll`: published beside the served copy, which keeps serving its chunks (as
    agent/rolling.py does), else into the cache folder."""
    results: list[Result | BaseException | None] = [None] * len(nodes)
    seeder = nodes[seed].server.address

    def run(i: int, node: Node) -> None:
        options = node.options(hub)
        layout = node.layout
        dest = (layout.next_dir if roll else layout.cache_dir)(NAMESPACE, CACHE)
        staging = (layout.next_staging_dir if roll else layout.staging_dir)(NAMESPACE, CACHE)
        options = dataclasses.replace(options, staging_dir=staging)
        flight = node.server.inflight.register(NAMESPACE, CACHE, wanted, staging, options.part_size)
        unsigned = cast(Credentials, _Unsigned(node.name))
        if i == seed:
            node.server.inflight.seed(NAMESPACE, CACHE)
            holders = {n.server.address: n.name for n in nodes if n is not node and n.name in indexed}
            chunks = PeerSource(holders, unsigned, NAMESPACE, CACHE, wanted.revision, chunks_only=True)
            sources = PartSources(peers=chunks if holders else None, arrivals=flight.arrivals)
        else:
            others = {n.server.address: n.name for n in nodes if n is not node}
            peers = PeerSource(others, unsigned, NAMESPACE, CACHE, wanted.revision, seeders=[seeder])
            sources = PartSources(peers=peers, arrivals=flight.arrivals)
        try:
            results[i] = download(wanted, dest, options, sources)
        except BaseException as error:  # shown below
            results[i] = error
        finally:
            if isinstance(sources.peers, PeerSource):
                sources.peers.close()

    started = time.monotonic()
    threads = [threading.Thread(target=run, args=(i, n)) for i, n in enumerate(nodes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    took = time.monotonic() - started
    failed = [r for r in results if not isinstance(r, Result)]
    if failed:
        raise RuntimeError(f"a node failed: {failed[0]!r}")
    return took, [r for r in results if isinstance(r, Result)]


def swarm(
    work: Path,
    hub: LocalHub,
    double: XetDouble,
    commits: tuple[str, ...],
    count: int,
    needed: dict[str, int],
    size: int,
    warm: bool = False,
    roll_seeder: int = 0,
) -> dict[str, tuple[float, float, float]]:
    """One round: fresh nodes through both steps; step -> (seconds, origin / needed, peer bytes / model).
    `warm`: each node first takes v1 alone through Xet (not counted; its chunk store then holds v1's
    chunks, which a node that copied v1 whole from peers does not), then only the roll is measured."""
    with tempfile.TemporaryDirectory(prefix="swarm-", dir=work) as tmp:
        nodes = []
        for i in range(count):
            root = Path(tmp) / f"node-{i}"
            # every node asks from 127.0.0.1 here: the per-address share fits N nodes, not one
            limits = Limits(max_connections_per_client=Limits().max_connections)
            anyone = cast(PeerAuthorizer, _Anyone())
            server = PeerServer(store.StoreLayout(root), anyone, ("127.0.0.1", 0), limits).start()
            nodes.append(Node(f"node-{i}", root, server))
        try:
            out = {}
            steps = list(zip(STEPS, commits, strict=False))
            indexed: set[str] = set()  # nodes whose last download went through Xet (status.xet.files)
            if warm:
                for node in nodes:
                    first = plan(Source("hf", REPO, commits[0], (), ()), node.options(hub))
                    download(first, node.layout.cache_dir(NAMESPACE, CACHE), node.options(hub))
                    indexed.add(node.name)
                steps = [(WARM_ROLL, commits[1])]
            for name, commit in steps:
                wanted = plan(Source("hf", REPO, commit, (), ()), nodes[0].options(hub))
                before = origin_bytes(hub, double)
                roll = name != STEPS[0]
                took, results = step(nodes, hub, wanted, roll_seeder if roll else 0, indexed, roll)
                indexed = {n.name for n, r in zip(nodes, results, strict=True) if r.xet_files}
                moved = origin_bytes(hub, double) - before
                need = needed[STEPS[1] if name == WARM_ROLL else name]
                out[name] = (took, moved / need, sum(r.bytes_from_peers for r in results) / size)
            return out
        finally:
            for node in nodes:
                node.server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--size-mib", type=int, default=256, help="model size (4 shards)")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--cap-mib-s", type=int, default=50, help="the origin link's rate (0: uncapped)")
    parser.add_argument("--workdir", default="/var/tmp", help="on the disk to measure")
    parser.add_argument(
        "--roll-seeder",
        type=int,
        default=0,
        help="the node that seeds the roll (0 seeded v1; 1 copied it from peers)",
    )
    args = parser.parse_args()
    # Each node is an agent with its own Xet range budget (xetmemory.py is one per process): the
    # nodes here share one process, so it is theirs together.
    xetmemory.RANGES.limit = args.nodes * xetmemory.RANGE_MEMORY_BYTES
    size, link = args.size_mib * MiB, Link()
    link.rate = args.cap_mib_s * MiB
    with tempfile.TemporaryDirectory(prefix="praesto-xet-peers-", dir=args.workdir) as tmp:
        work = Path(tmp)
        with served(work, size, link) as (hub, double, commits):
            needed = alone(work, hub, double, commits)
            print(
                "chunks needed by one node: " + ", ".join(f"{k} {v / MiB:.1f} MiB" for k, v in needed.items())
            )
            n, seeder = args.nodes, args.roll_seeder
            samples = interleaved(
                {
                    f"{n} nodes": lambda: swarm(work, hub, double, commits, n, needed, size, False, seeder),
                    f"{n} nodes, v1 via Xet on each": lambda: swarm(
                        work, hub, double, commits, n, needed, size, True, seeder
                    ),
                },
                max(ROUNDS, args.rounds),
            )
            rate = f"{args.cap_mib_s} MiB/s" if args.cap_mib_s else "uncapped"
            title = f"Xet via peers, {n} nodes, a {args.size_mib} MiB model, origin {rate}"
            for name in (*STEPS, WARM_ROLL):
                per = {k: [s[name] for s in v] for k, v in samples.items() if name in v[0]}
                print_table(
                    f"{title}, {name}: seconds to all", {k: [t for t, _, _ in v] for k, v in per.items()}
                )
                print_table(
                    f"{title}, {name}: origin bytes, x the chunks one node needs",
                    {k: [o for _, o, _ in v] for k, v in per.items()},
                    unit="x",
                    digits=2,
                )
                print_table(
                    f"{title}, {name}: bytes between peers, x the model",
                    {k: [p for _, _, p in v] for k, v in per.items()},
                    unit="x",
                    digits=2,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
