"""Peer discovery through ModelCacheNode status, and who fetches from the origin first.

No new control plane: each agent publishes `status.peer.address` (`<podIP>:<port>`)
on its ModelCacheNodes. Before a download, the agent watches the ModelCacheNodes
of the same cache (label `praesto.io/model-cache`, same namespace; directory.py: one
list, then a watch, until the download ends) and:

* some are Ready at the same resolved revision with an address: fetch from them
  (`PeerSource`), the origin only for what they cannot give;
* none are, but other peer-capable agents are also about to download it: the one
  on the lowest node name goes to the origin, unless one of them already shows
  `Downloading` this revision, whatever its name (an agent whose watch lagged
  must join, not seed a second copy); the others copy from it while it
  downloads, as soon as it shows `Downloading` with the same `resolvedRevision`
  (published when its download starts): its server hands out the parts its
  journal records as written (inflight.py), and asks for parts not written yet
  wait for them rather than going to the origin (so N nodes starting together
  cost the origin one copy, and the copies overlap the download). A leader whose
  phase and progress do not move for `stall_seconds`, that fails, or that
  disappears is skipped (before the download) or dropped (during it, by
  `PeerSource`), so waiting never outlives a broken leader long.

A node has up to two copies of a cache (`_views`): the one it serves (status) and, during a
rolling update, the next revision fetched beside it (status.next: agent/rolling.py), which keeps
its served copy Ready meanwhile. Both count above, so rolling nodes elect one leader and copy from
it, and a node that rolls later copies from the copies held beside (held.py serves them). The
leader has no one at its revision to ask, so it asks for Xet chunks only the nodes whose last
download went through Xet (status.xet.files, whatever revision they serve: `_chunk_source`), so
the changed chunks alone come from the origin even when the leader copied the previous revision
whole (docs/xet.md, "Peers").

Waiting costs the API server nothing per look: a waiting agent reads the watched
copies from memory, woken by each change of them, and at least every `poll_seconds`
(a stalled leader changes nothing, so the time has to be looked at too).

A swarm, not a star: a follower asks every peer of the same revision that is
Ready or Downloading (found again while it runs), each for the parts it holds
(swarm.py: the least busy holder of each part), and a download in flight sends
each part only a few times (once from the leader, which seeds from the origin,
twice from a follower), so followers copy most parts from each other and no
node's upload carries N copies. A part is offered as soon as its first bytes
are written, and passed on while it arrives (download/arrivals.py, the
server's prefix answers), so each hop adds moments, not a part's transfer.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from praesto.agent.download.api import DownloadCancelled, Options, PartSources, Plan
from praesto.agent.peers.auth import Credentials, Pod, TokenMinter
from praesto.agent.peers.directory import PeerDirectory
from praesto.agent.peers.identity import Identities, PeerAuthorizer
from praesto.agent.peers.server import Limits, PeerServer
from praesto.agent.peers.source import PeerSource, Tuning

from praesto import names
from praesto.kubeerrors import Groups
from praesto.store import StoreLayout
from praesto.watched import SYNC_SECONDS, WatchedSet

log = logging.getLogger("praesto.peers")
REASON_WAITING_FOR_PEER = "WaitingForPeer"
Obj = dict[str, Any]
Report = Callable[[str], None]  # why the download waits, for the copy's status


@dataclass(frozen=True)
class PeerConfig:
    address: str  # host:port other agents reach this one on (status.peer.address); "" = where it binds
    pod: Pod  # this agent's own Pod: every peer token it mints is bound to it (auth.TokenMinter)
    service_account: str  # "<namespace>/<name>" of the agent ServiceAccount: the only peers accepted
    bind: tuple[str, int] = ("0.0.0.0", 0)  # where the server listens
    limits: Limits = field(default_factory=Limits)
    tuning: Tuning = field(default_factory=Tuning)
    poll_seconds: float = 2.0  # how often a waiting agent looks again at its (watched) leader unchanged
    stall_seconds: float = 60.0  # a leader whose status does not move this long is skipped


class Peering:
    """The agent's side of peer-to-peer: its server, its published address, `attach` for downloads."""

    def __init__(self, config: PeerConfig, api: Groups, node_name: str, layout: StoreLayout) -> None:
        self.config = config
        self.node_name = node_name
        self.credentials = Credentials(node_name, TokenMinter(api, config.pod))
        self.directory = PeerDirectory(api, node_name)  # the copies of caches downloading here
        self.authorizer = PeerAuthorizer(
            Identities(api, config.service_account, node_name, directory=self.directory)
        )
        self.server = PeerServer(layout, self.authorizer, config.bind, config.limits)
        self.address = config.address or self.server.address
        self._held = threading.local()  # the caches this download thread watches (attach .. detach)

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        self.server.stop()
        self.directory.stop()

    def detach(self) -> None:
        """The download on this thread ended (however): stop watching the copies it watched."""
        for namespace, cache in getattr(self._held, "keys", []):
            self.directory.release(namespace, cache)
        self._held.keys = []

    def _watch(self, namespace: str, cache: str) -> WatchedSet:
        """The copies of `namespace`/`cache`, watched until this thread's `detach` (one download
        runs on one pool thread, from `attach` to its end: jobs.py)."""
        held: list[tuple[str, str]] = getattr(self._held, "keys", [])
        self._held.keys = held
        if (namespace, cache) in held:
            watched = self.directory.watched(namespace, cache)
            if watched is not None:
                return watched
            held.remove((namespace, cache))
        watched = self.directory.acquire(namespace, cache)
        held.append((namespace, cache))
        return watched

    def status_fields(self) -> dict[str, Any]:
        return {"peer": {"address": self.address}}

    def attach(
        self, namespace: str, cache: str, plan: Plan, options: Options, *, report: Report
    ) -> PartSources:
        """This download's peers, when peers hold `plan` of `namespace`/`cache` or are fetching it,
        and its arrivals, when other nodes may copy its written parts; waits while a leader plans."""
        arrivals = None
        if options.staging_dir is not None:  # other nodes may copy this download's written parts
            flight = self.server.inflight.register(
                namespace, cache, plan, options.staging_dir, options.part_size
            )
            arrivals = flight.arrivals
        skipped: set[str] = set()
        watched: tuple[str, Any, float] | None = None  # (leader, what it showed, since when)
        copies = self._watch(namespace, cache)
        while True:
            seen = copies.version
            others = self._others(namespace, cache, copies, options.cancel)
            ready = [_address(o) for o in others if _view(o, names.PHASE_READY, plan.revision) is not None]
            ready = [a for a in ready if a]
            if ready:
                peers = self._source(copies, plan, self._holders(others, plan), [], options)
                log.info("fetching %s/%s from peers %s", namespace, cache, ",".join(ready))
                return PartSources(peers=peers, arrivals=arrivals)
            active = {
                _node(o): o
                for o in others
                if _address(o) and _node(o) not in skipped and _fetching(o, plan.revision) is not None
            }
            leader = _leader(self.node_name, active, plan.revision)
            if leader == self.node_name:
                self.server.inflight.seed(namespace, cache)
                return PartSources(peers=self._chunk_source(copies, plan, others, options), arrivals=arrivals)
            view = _fetching(active[leader], plan.revision)
            assert view is not None
            if view.phase == names.PHASE_DOWNLOADING and view.revision == plan.revision:
                seeder = _address(active[leader])
                holders = {seeder: leader, **self._holders(others, plan)}
                peers = self._source(copies, plan, holders, [seeder], options)
                log.info("copying %s/%s from node %s while it downloads", namespace, cache, leader)
                return PartSources(peers=peers, arrivals=arrivals)
            shows = (view.phase, view.done, view.message)
            now = time.monotonic()
            if watched is None or watched[:2] != (leader, shows):
                watched = (leader, shows, now)
            elif now - watched[2] > self.config.stall_seconds:
                log.warning(
                    "leader %s made no progress for %.0fs; not waiting for it", leader, now - watched[2]
                )
                skipped.add(leader)
                continue
            report(
                f"waiting for node {leader}, which is fetching this model from the origin; "
                "it is copied from there once Ready",
            )
            if copies.wait(seen, self.config.poll_seconds, options.cancel):  # a change of any copy wakes it
                raise DownloadCancelled()

    def _chunk_source(
        self, copies: WatchedSet, plan: Plan, others: list[Obj], options: Options
    ) -> PeerSource | None:
        """The leader's peers for Xet chunks only (issue 40 item 3): the nodes whose last download
        went through Xet (status.xet.files), whatever revision they hold, so a roll led by a node
        that copied the previous revision whole still takes the unchanged chunks from a node that
        indexed them, and only the changed ones from the CAS. None when no node shows any."""
        holders = {_address(o): _node(o) for o in others if _address(o) and _indexed_chunks(o)}
        return self._source(copies, plan, holders, [], options, chunks_only=True) if holders else None

    def _source(
        self,
        copies: WatchedSet,  # the cache's copies, watched until the download ends (`detach`)
        plan: Plan,
        addresses: dict[str, str],
        seeders: list[str],
        options: Options,
        *,
        chunks_only: bool = False,  # peers at other revisions, asked for Xet chunks only (found once)
    ) -> PeerSource:
        tuning = dataclasses.replace(self.config.tuning, stall_seconds=self.config.stall_seconds)
        namespace, cache = copies.key
        return PeerSource(
            addresses,
            self.credentials,
            namespace,
            cache,
            plan.revision,
            tuning,
            seeders=seeders,
            discover=None
            if chunks_only
            else lambda: self._holders(self._others(namespace, cache, copies), plan),  # from memory
            proxies=options.proxies,
            chunks_only=chunks_only,
        )

    @staticmethod
    def _holders(others: list[Obj], plan: Plan) -> dict[str, str]:
        """Address -> node of other nodes that hold (Ready) or are fetching (Downloading) this
        revision, served or beside; only a node's own agent may write its copy's status (the
        own-node policy)."""
        return {
            _address(o): _node(o)
            for o in others
            if _address(o)
            and (
                _view(o, names.PHASE_READY, plan.revision) is not None
                or _view(o, names.PHASE_DOWNLOADING, plan.revision) is not None
            )
        }

    def _others(
        self, namespace: str, cache: str, copies: WatchedSet, cancel: threading.Event | None = None
    ) -> list[Obj]:
        """Other nodes' ModelCacheNodes of this cache, from the watch; one direct list when the
        watch cannot be trusted (not listed yet, or unanswered: then it is what the API says now);
        [] when the API cannot say (origin then)."""
        items: list[Obj]
        if copies.fresh(SYNC_SECONDS, cancel):
            items = copies.items()
        else:
            try:
                items = self.directory.list_now(namespace, cache)
            except Exception as err:  # peers are an optimisation: never fail a download on them
                log.warning("listing peers of %s/%s failed: %s", namespace, cache, type(err).__name__)
                return []
        return [o for o in items if _node(o) != self.node_name and _node(o)]


def _leader(me: str, active: dict[str, Obj], revision: str) -> str:
    """Whom to copy from, or `me` to fetch from the origin: a node already downloading this
    revision (the seeder or one copying it) whatever its name, so an agent that comes late (its
    watch lagged, it restarted) joins the swarm rather than seeding a second copy from the
    origin; else the lowest node name among those about to download, which all of them agree on."""
    downloading = [
        node for node, obj in active.items() if _view(obj, names.PHASE_DOWNLOADING, revision) is not None
    ]
    return min(downloading) if downloading else min([me, *active])


@dataclass(frozen=True)
class _View:
    """One copy of a cache on a node as its ModelCacheNode shows it: the served one (status), or
    the next revision fetched beside it during a rolling update (status.next, agent/rolling.py)."""

    phase: str  # Pending, Downloading, Ready, ... (a beside download not started yet: Pending)
    revision: str  # its resolvedRevision ("" until its download started)
    done: object  # progress.bytesDone: a leader whose copy does not move is stalled
    message: object


def _views(obj: Obj) -> list[_View]:
    status = obj.get("status") or {}
    served = _View(
        str(status.get("phase") or ""),
        str(status.get("resolvedRevision") or ""),
        (status.get("progress") or {}).get("bytesDone"),
        status.get("message"),
    )
    beside = status.get("next")
    if not isinstance(beside, dict) or beside.get("phase") not in (names.NEXT_DOWNLOADING, names.NEXT_READY):
        return [served]
    revision = str(beside.get("resolvedRevision") or "")
    phase = names.PHASE_READY if beside["phase"] == names.NEXT_READY else names.PHASE_DOWNLOADING
    started = revision or phase == names.PHASE_READY
    view = _View(
        phase if started else names.PHASE_PENDING,
        revision,
        (beside.get("progress") or {}).get("bytesDone"),
        beside.get("message"),
    )
    return [served, view]


def _view(obj: Obj, phase: str, revision: str) -> _View | None:
    """The node's copy in `phase` at `revision`, served or beside, if it has one."""
    return next((v for v in _views(obj) if v.phase == phase and v.revision == revision), None)


def _fetching(obj: Obj, revision: str) -> _View | None:
    """The node's copy, served or beside, about to download (Pending) or downloading `revision`
    (or a revision not said yet); a node fetching another revision is no one to wait for."""
    found = [
        v
        for v in _views(obj)
        if v.phase == names.PHASE_PENDING
        or (v.phase == names.PHASE_DOWNLOADING and v.revision in ("", revision))
    ]
    return found[-1] if found else None


def _indexed_chunks(obj: Obj) -> bool:
    """Its last download went through Xet, so its chunk store indexes that revision's chunks."""
    files = ((obj.get("status") or {}).get("xet") or {}).get("files")
    return isinstance(files, int) and files > 0


def _node(obj: Obj) -> str:
    return str((obj.get("spec") or {}).get("nodeName") or "")


def _address(obj: Obj) -> str:
    return str(((obj.get("status") or {}).get("peer") or {}).get("address") or "")
