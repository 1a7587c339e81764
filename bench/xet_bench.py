"""Issue 40 item 4: origin bytes and time of the Xet path with the node's chunk store vs `resolve/`,
for (a) a first download, (b) a revision roll where ~10 % of a model's chunks changed, and (c) a
second repository sharing half of the first's chunks. (d), 8 nodes via peers, is
bench/xet_peers_bench.py (`python -m bench.xet_peers_bench`), on the same models and doubles.

The model is 2 GiB-shaped, scaled down: 4 safetensors-like shards (as a 2 GiB model is split),
`--size-mib` in all (default 256). (b): every shard of the new revision rewrites one contiguous
tensor of 10 % of its bytes, as a fine-tune of some layers does, so every file changed (what a roll
costs `resolve/` today) while ~10 % of the chunks did. (c): another repository whose every shard
is the first half of the first repository's shard and a new second half (a re-published base with
half its tensors replaced), so no file is shared and half the chunks are. Why scaled: Xet chunks
are content-defined, ~64 KiB whatever the file's size, so the share of bytes a step moves is the
share of chunks it needs and the node lacks, not a function of the model's size
(tests/xet/test_chunk_store.py shows it at 6 MiB); the time scales with the bytes; and the
revisions uploaded by the real hf_xet client into the in-memory Python CAS double would need
~5 GiB of memory at 2 GiB. Run it with `--size-mib 2048` where there is room.

Every file is uploaded once by the real hf_xet client (testkit/xet: it dedups chunks against what
the CAS holds, as the Hub does). Each round, each contender gets a fresh node (its own blob and
chunk store) and runs (a) the first repository at v1, (b) the roll to v2, (c) the second
repository, in that order; each step's wall seconds (page cache warm, no sync for either) and
origin bytes (the CAS's xorb ranges plus `resolve/`), as a share of the model, are recorded.

Uncapped loopback favours `resolve/` (the Xet path decodes and hashes every chunk on one thread
per file, while the origin is free), so the same rounds run again with every origin server's
responses sharing one link of `--cap-mib-s` (default 50 MiB/s; 0: uncapped only), as a real
link does.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from socketserver import BaseServer
from typing import Any

from praesto.agent.download.api import Options
from praesto.agent.download.fetch import download, plan

from bench.common import ROUNDS, interleaved, print_table
from praesto import store
from praesto.spec import Source
from testkit.egress import LOOPBACK
from testkit.hub import LocalHub
from testkit.hub_xet import HubXet
from testkit.xet import HfXet, XetDouble, running_double

MiB = 1024 * 1024
REPO = "org/rolled-model"
OTHER = "org/half-shared-model"
SHARDS = 4
CHANGED = 0.10  # of each shard: one contiguous tensor rewritten
PIECE = 64 * 1024  # the link's unit: concurrent responses interleave at this grain
STEPS = ("first download", "revision roll", "second repository")


def models(size: int) -> tuple[dict[str, bytes], dict[str, bytes], dict[str, bytes]]:
    """(v1, v2 of the first repository, the second repository): see the module's docstring."""
    rnd = random.Random(404)
    shard = size // SHARDS
    v1 = {f"model-{i + 1:05d}-of-{SHARDS:05d}.safetensors": rnd.randbytes(shard) for i in range(SHARDS)}
    v2, other = {}, {}
    for i, (name, data) in enumerate(v1.items()):
        at, length = int(shard * (0.2 + 0.15 * i)), int(shard * CHANGED)
        v2[name] = data[:at] + rnd.randbytes(length) + data[at + length :]
        other[name] = data[: shard // 2] + rnd.randbytes(shard - shard // 2)
    return v1, v2, other


class Link:
    """One link every origin response shares: `rate` bytes/s (0: uncapped), first come first sent."""

    def __init__(self) -> None:
        self.rate = 0
        self._free_at = 0.0
        self._lock = threading.Lock()

    def send(self, size: int) -> None:
        if not self.rate:
            return
        with self._lock:
            now = time.monotonic()
            self._free_at = max(now, self._free_at) + size / self.rate
            until = self._free_at
        time.sleep(max(0.0, until - now))


class _PacedWriter:
    """A handler's `wfile` that writes no faster than its link allows."""

    def __init__(self, raw: Any, link: Link) -> None:
        self._raw, self._link = raw, link

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        for offset in range(0, len(view), PIECE):
            piece = view[offset : offset + PIECE]
            self._link.send(len(piece))
            self._raw.write(piece)
        return len(view)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


def over(server: BaseServer, link: Link) -> None:
    """Make `server` answer through `link` (the test doubles' own pacing is per response; a link
    is shared by all of them, as the node's uplink is)."""
    base: Any = server.RequestHandlerClass

    class Paced(base):  # type: ignore[misc]
        wfile: Any

        def setup(self) -> None:
            super().setup()
            self.wfile = _PacedWriter(self.wfile, link)

    server.RequestHandlerClass = Paced


@contextmanager
def served(work: Path, size: int, link: Link) -> Iterator[tuple[LocalHub, XetDouble, tuple[str, ...]]]:
    """The Hub double (the first repository at two commits, the second at one), and the CAS double
    hf_xet uploaded every file to; all of them answer through `link`."""
    v1, v2, other = models(size)
    with running_double() as double, LocalHub(work / "hub") as hub:
        client = HfXet(double, work / "hf-xet-cache")
        xet = hub.xet = HubXet(double)
        for label, files in (("v1", v1), ("v2", v2), ("other", other)):
            folder = work / label
            folder.mkdir()
            for name, data in files.items():
                (folder / name).write_bytes(data)
            xet.add(client.upload([folder / name for name in files]))
        commits = (hub.add_repo(REPO, v1), hub.commit(REPO, v2), hub.add_repo(OTHER, other))
        for server in (double.server, hub._api, hub._cdn):
            over(server, link)
        yield hub, double, commits


def node(
    work: Path, hub: LocalHub, double: XetDouble, commits: tuple[str, ...], xet: bool, size: int
) -> dict[str, tuple[float, float]]:
    """One fresh node through the three steps: step -> (seconds, origin bytes / model)."""
    with tempfile.TemporaryDirectory(prefix="node-", dir=work) as root:
        layout = store.StoreLayout(Path(root))
        options = Options(endpoint=hub.endpoint, egress=LOOPBACK, xet=xet, blobs_dir=layout.blobs_dir)
        out = {}
        for step, repo, commit in zip(STEPS, (REPO, REPO, OTHER), commits, strict=True):
            cas, hub_bytes = double.store.counters.range_bytes_served, sum(hub.bytes_by_path.values())
            started = time.monotonic()
            wanted = plan(Source("hf", repo, commit, (), ()), options)
            download(wanted, Path(root) / step.replace(" ", "-"), options)
            took = time.monotonic() - started
            moved = (
                double.store.counters.range_bytes_served - cas + sum(hub.bytes_by_path.values()) - hub_bytes
            )
            out[step] = (took, moved / size)
        return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-mib", type=int, default=256, help=f"model size ({SHARDS} shards)")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--cap-mib-s", type=int, default=50, help="the capped link's rate (0: uncapped only)")
    parser.add_argument("--workdir", default="/var/tmp", help="on the disk to measure")
    args = parser.parse_args()
    size, link = args.size_mib * MiB, Link()
    links = {"origin uncapped": 0} | (
        {f"origin at {args.cap_mib_s} MiB/s": args.cap_mib_s * MiB} if args.cap_mib_s else {}
    )
    model = f"a {args.size_mib} MiB model in {SHARDS} shards"
    with tempfile.TemporaryDirectory(prefix="praesto-xet-", dir=args.workdir) as tmp:
        work = Path(tmp)
        with served(work, size, link) as (hub, double, commits):

            def contender(xet: bool) -> Callable[[], dict[str, tuple[float, float]]]:
                return lambda: node(work, hub, double, commits, xet, size)

            for label, rate in links.items():
                link.rate = rate
                samples = interleaved(
                    {"xet + chunk store": contender(True), "resolve/": contender(False)},
                    max(ROUNDS, args.rounds),
                )
                for step in STEPS:
                    title = f"Xet, {step} of {model}, {label}"
                    per = {k: [s[step] for s in v] for k, v in samples.items()}
                    print_table(f"{title}: seconds", {k: [s for s, _ in v] for k, v in per.items()})
                    print_table(
                        f"{title}: origin bytes, % of the model",
                        {k: [100 * b for _, b in v] for k, v in per.items()},
                        unit="%",
                        digits=1,
                    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
