"""The node agent: its collaborators wired together, started and stopped.

Each collaborator is the one owner of its state: `Copies` (copies.py: the
ModelCacheNodes as last seen, the per-copy memory, the one store lock),
`StatusWriter` (status_writer.py: every status write, throttled, with Events),
`DiskRoom` (room.py: reserve, reservations, eviction), `Removal` (removal.py:
deletion, the sweep, foreign copies), `JobRunner` (jobs.py: downloads on a pool,
with the credential policy built once here), `Reconciler` (reconcile.py: events
-> one step per copy) and `PodStartReporter` (coldstart_reporter.py). The watch feeds the
reconciler; the store's base path is locked before anything touches it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from praesto.agent import baselock, logs
from praesto.agent import status as st
from praesto.agent.budget.origin_budget import OriginBudget
from praesto.agent.coldstart_reporter import PodStartReporter
from praesto.agent.copies import CacheState, Copies, CopyKey, Obj, cache_of, deleting
from praesto.agent.copy_metrics import CopyCollector
from praesto.agent.credentials import CredentialPolicy
from praesto.agent.download import api as dlapi
from praesto.agent.download.origins.huggingface import xetstore
from praesto.agent.jobs import JobRunner
from praesto.agent.kube import KubeApi, short_error
from praesto.agent.metrics import AgentMetrics
from praesto.agent.peers.peering import Peering
from praesto.agent.reconcile import LoopTuning, Reconciler
from praesto.agent.removal import Removal
from praesto.agent.room import DiskRoom
from praesto.agent.scrub.scrubber import AgentSide, Scrubber
from praesto.agent.settings import AgentSettings
from praesto.agent.status_writer import StatusWriter

from praesto import names
from praesto.reflector import Reflector
from praesto.store import StoreLayout


class Agent:
    def __init__(
        self,
        settings: AgentSettings,
        kube: KubeApi,
        metrics: AgentMetrics | None = None,
        clock: Callable[[], float] = time.time,
        planner: dlapi.Planner | None = None,
        downloader: dlapi.Downloader | None = None,
        peering: Peering | None = None,
        budget: OriginBudget | None = None,
        credentials: CredentialPolicy | None = None,
        tuning: LoopTuning | None = None,
    ):
        from praesto.agent.download.fetch import download, plan  # the real one unless a caller injects one

        # `praesto-agent run`'s settings, whole (agent/settings.py); the loop's timing (tests shorten it)
        self.settings, self.tuning, self.kube = settings, tuning or LoopTuning(), kube
        tuning = self.tuning
        self.metrics = metrics or AgentMetrics.create()
        self.layout = StoreLayout(settings.base_path)
        self.peering = peering  # peer-to-peer (praesto.agent.peers); None: origin only
        self.budget = budget  # cluster-wide origin budget (praesto.agent.budget); None: ungated
        self.copies = Copies()
        self.metrics.registry.register(CopyCollector(self.copies))  # each copy's phase and bytes, per scrape
        self.status = StatusWriter(
            kube, self.copies, self.layout, clock, tuning.progress_seconds,
            peering.status_fields if peering is not None else dict, settings.node_name,
        )  # fmt: skip
        self.room = DiskRoom(self.layout, self.copies, settings.reserve, settings.quotas, self._evicted)
        self.removal = Removal(self.layout, self.copies, self.status, kube)
        self.jobs = JobRunner(
            self.layout, kube, self.room, self.status, self.metrics,
            # which credentials each download uses: the policy the process edge built (agent/settings.py);
            # none given: no cluster credentials for any namespace
            credentials or CredentialPolicy(),
            planner or plan, downloader or download, lambda outcome: self.reconciler.done(outcome),
            settings.downloads,  # the download settings section, whole, built once
            max_parallel=settings.max_parallel_caches, peering=peering, budget=budget,
        )  # fmt: skip
        self.reconciler = Reconciler(
            settings,
            tuning,
            kube,
            self.copies,
            self.status,
            self.room,
            self.removal,
            self.jobs,
            self.metrics,
            clock,
        )
        # cold-start accounting and prewarm (issue #15)
        self.pod_starts = PodStartReporter(
            self.copies, self.status, kube, settings.node_name, self.metrics.registry
        )
        # at-rest scrub and repair (issue #25 part 2): one Ready copy at a time, paced, idle I/O priority
        scrub_side = AgentSide(
            self.copies, cache_of, lambda obj: not deleting(obj) and st.phase_of(obj) == names.PHASE_READY,
            self.status.set, self.status.merge, kube.emit_event,
            lambda ns, cache, n: self.metrics.scrub_mismatches.labels(ns, cache).inc(n), short_error,
        )  # fmt: skip
        self.scrubber = Scrubber(
            self.layout, scrub_side, settings.scrub.interval_seconds, settings.scrub.bytes_per_second, clock,
            logs.logger("praesto.agent.scrub", node=settings.node_name),
            poll_seconds=min(10.0, tuning.tick_seconds * 10),  # when nothing was due: look again
            chunk_store=lambda pace, cancel: xetstore.verify_all(self.layout.xet_chunks_dir, pace, cancel),
        )  # fmt: skip
        self.stop_event = threading.Event()
        self.log = logs.logger("praesto.agent", node=settings.node_name)
        # this node's ModelCacheNodes -> the reconciler (SYNC after each relist, DELETED for vanished ones)
        self.watcher = Reflector(
            names.MODELCACHENODE_KIND, kube.list_nodes, kube.watch_nodes, on_event=self.reconciler.on_watch,
            on_relisted=self.reconciler.on_relisted, stop=self.stop_event, hang_up=kube.abort_watch,
            backoff=tuning.watch_backoff, logger=logs.logger("praesto.agent.kube", node=settings.node_name),
        )  # fmt: skip
        self._threads: list[threading.Thread] = []
        self._base_lock: int | None = None  # fd holding <base>/.praesto/agent.lock (baselock)
        self.fatal: str | None = None  # why the agent stopped on its own (another agent holds the store)

    @property
    def objects(self) -> dict[CopyKey, Obj]:
        return self.copies.objects

    @property
    def states(self) -> dict[CopyKey, CacheState]:
        return self.copies.states

    def reconcile(self, key: CopyKey) -> None:
        """One step for one copy, now (the loop does this for every copy each tick)."""
        self.reconciler.reconcile(key)

    def start(self) -> Agent:
        """Raises baselock.BasePathInUse when another agent holds this base path."""
        self._hold_base_lock()
        if self.peering is not None:
            self.peering.start()
        loop = lambda: self.reconciler.run(self.stop_event, self._hold_base_lock, self._fail)  # noqa: E731
        for target, name in ((self.watcher.run, "praesto-watch"), (loop, "praesto-reconcile")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        self.pod_starts.start()
        self.scrubber.start()
        self.log.info("agent started", extra={"basePath": str(self.settings.base_path)})
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.stop_event.set()
        self.kube.abort_watch()
        with self.copies.lock:
            for state in self.states.values():
                if state.job is not None:
                    state.job.cancel.set()
        self.reconciler.wake()
        self.scrubber.stop(timeout)
        for thread in self._threads:
            thread.join(timeout)
        self.reconciler.trust.stop()  # the trust material's watches (the loop that opens them has ended)
        self.pod_starts.stop(timeout)
        self.jobs.shutdown()
        if self.peering is not None:
            self.peering.stop()
        if self.budget is not None:
            self.budget.stop()
        if self._base_lock is not None:
            baselock.release(self._base_lock)
            self._base_lock = None

    def _hold_base_lock(self) -> bool:
        """Lock the store once it exists; False while it does not (the agent then writes nothing to it)."""
        if self._base_lock is None and self.layout.base.is_dir():
            self._base_lock = baselock.acquire(self.layout)
        return self._base_lock is not None

    def _fail(self, why: str) -> None:
        """The agent stops on its own (another agent holds the store)."""
        self.fatal = why
        self.log.error(why)
        self.stop_event.set()

    def _evicted(self, namespace: str, cache: str, cause: str) -> None:
        """The disk room took a copy off the node: counted, and every copy of it says so."""
        self.metrics.evictions.labels(cause).inc()
        self.status.evicted(namespace, cache, cause)
