"""The job runner: one download of one copy, run on a pool thread: token, plan, room, bytes.

`JobRunner` holds what every job shares, built once at start: the credential
policy, the disk room, the planner and downloader, peers and the origin budget,
and a pool of `max_parallel_caches` threads. A `Job` reports its progress
(Downloading) through the status writer while it runs; the reconciler owns the
copy's status otherwise. It ends as an `Outcome`, handed to the runner's `done`,
and gives its disk reservation back however it ended.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from praesto.agent import logs
from praesto.agent.budget.origin_budget import OriginBudget
from praesto.agent.copies import CacheRef, Outcome
from praesto.agent.credentials import CredentialPolicy, signature_policy
from praesto.agent.download import api as dlapi
from praesto.agent.kube import KubeApi, SecretUnavailable
from praesto.agent.metrics import AgentMetrics
from praesto.agent.peers.peering import REASON_WAITING_FOR_PEER, Peering
from praesto.agent.room import DiskRoom
from praesto.agent.status_writer import StatusWriter

from praesto import names
from praesto.quantity import format_bytes
from praesto.store import StoreLayout

# Before the bytes: the download's peers, arrivals and origin budget (or wait first, saying why)
Attach = Callable[[CacheRef, dlapi.Plan, dlapi.Options], dlapi.PartSources]


def check_request(ref: CacheRef, plan: dlapi.Plan) -> None:
    """Node mode: spec.storage.size is a limit, checked before any byte is written or evicted.

    Otherwise one cache (on every node, with an empty nodeSelector) could take far
    more than its owner declared, and the webhook's namespace quota would count
    nothing real.

    Counted as the copy lands on disk (Plan.disk_bytes: archive layers and what they unpack to, the
    whole limit for an archive that does not say), the number the room reserves and unpacking is
    stopped at (the download's `max_bytes` is this limit).
    """
    limit = ref.size_bytes
    if limit is not None and plan.disk_bytes(limit) > limit:
        need = plan.disk_bytes(None)
        raise dlapi.LastingDownloadError(
            "SizeExceedsRequest",
            f"the model is {plan.describe_size()} on disk, more than "
            f"spec.storage.size {format_bytes(limit)} ({limit} bytes), the most one node copy may take; "
            "nothing was written; raise storage.size on the ModelCache (delete and create it again) to at "
            f"least {format_bytes(need)}, or narrow it with allowPatterns/ignorePatterns",
        )


class Job:
    """Runs `plan` + `download` for one cache; reports progress through `on_progress`."""

    def __init__(
        self,
        ref: CacheRef,
        layout: StoreLayout,
        kube: KubeApi,
        settings: dlapi.EngineSettings,
        room: DiskRoom,
        on_started: Callable[[CacheRef, dlapi.Plan], None],
        on_progress: Callable[[CacheRef, int, int], None],
        planner: dlapi.Planner,
        downloader: dlapi.Downloader,
        credentials: CredentialPolicy,
        attach: Attach | None = None,
    ):
        self.ref, self.layout, self.kube, self.settings, self.room = ref, layout, kube, settings, room
        self.cancel = threading.Event()  # set to stop the download (agent/reconcile.py)
        self.on_started, self.on_progress = on_started, on_progress
        self.planner, self.downloader = planner, downloader
        self.attach = attach
        self.credentials = credentials  # the agent's policy, built once at start
        self.log = logs.cache_logger(ref.namespace, ref.cache, modelCacheNode=ref.name)

    def run(self) -> Outcome:
        out = Outcome(self.ref)
        try:
            token, credentials, where = self.credentials.credentials(self.kube, self.ref)
            signature = signature_policy(self.kube, self.ref, self.credentials.cluster_trust)
            options = dlapi.Options.of(
                self.settings,  # the agent's download settings, whole (agent/settings.py)
                token=token,
                credentials=credentials,
                credentials_from=where,
                identity_allowed=self.credentials.identity_allowed(self.ref),
                blobs_dir=self.layout.blobs_dir,
                dedup_scope=self.ref.namespace,
                staging_dir=(self.layout.next_staging_dir if self.ref.beside else self.layout.staging_dir)(
                    self.ref.namespace, self.ref.cache
                ),
                progress=lambda done, total: self.on_progress(self.ref, done, total),
                cancel=self.cancel,
                cache_uid=self.ref.cache_uid,
                signature=signature,
                max_bytes=self.ref.size_bytes,  # archives stop unpacking there (download/unpack.py)
            )
            plan = self.planner(self.ref.source, options)
            self.log.info(
                "planned",
                extra={"revision": plan.revision, "files": len(plan.files), "bytes": plan.total_bytes},
            )
            check_request(self.ref, plan)
            out.evicted = self.room.make_room(self.ref, plan)
            # no room for Xet chunks above the reserve: this download keeps none (agent/room.py)
            if not self.room.stores_chunks((self.ref.namespace, self.ref.cache)):
                options = replace(options, xet_chunks=False)
            sources = self.attach(self.ref, plan, options) if self.attach is not None else dlapi.NO_SOURCES
            self.on_started(self.ref, plan)
            # a rolling update publishes beside the served copy (agent/rolling.py switches them)
            dest = (self.layout.next_dir if self.ref.beside else self.layout.cache_dir)(
                self.ref.namespace, self.ref.cache
            )
            out.result = self.downloader(plan, dest, options, sources)
            self.log.info(
                "downloaded",
                extra={
                    "revision": plan.revision,
                    "fromOrigin": out.result.bytes_from_origin,
                    "deduplicated": out.result.bytes_deduplicated,
                    "resumed": out.result.bytes_resumed,
                    "fromXet": out.result.bytes_from_xet,
                    "xetFallbacks": out.result.xet_fallbacks,
                    "seconds": round(out.result.seconds, 3),
                    "size": format_bytes(plan.total_bytes),
                },
            )
        except SecretUnavailable as err:
            out.waiting = err.message
        except dlapi.DownloadCancelled:
            out.cancelled = True
        except dlapi.DownloadError as err:
            if self.cancel.is_set():
                out.cancelled = True
            elif err.reason == "WaitingForCredentials":  # no crash loop: wait with backoff, say why
                out.waiting, out.waiting_reason = err.message, err.reason
            else:
                out.error = err
        except Exception as err:  # a bug or an OS error: report it as a temporary failure, never crash
            if self.cancel.is_set():
                out.cancelled = True
            else:
                self.log.exception("download crashed")
                out.error = dlapi.TemporaryDownloadError(
                    "SourceUnavailable", f"download failed unexpectedly: {type(err).__name__}"
                )
        finally:
            self.room.release((self.ref.namespace, self.ref.cache))  # however it ended
        return out


class JobRunner:
    """Starts one `Job` per copy to download on a pool of `max_parallel` threads; `done` gets each outcome."""

    def __init__(
        self,
        layout: StoreLayout,
        kube: KubeApi,
        room: DiskRoom,
        status: StatusWriter,
        metrics: AgentMetrics,
        credentials: CredentialPolicy,
        planner: dlapi.Planner,
        downloader: dlapi.Downloader,
        done: Callable[[Outcome], None],
        settings: dlapi.EngineSettings,
        *,
        max_parallel: int,
        peering: Peering | None = None,
        budget: OriginBudget | None = None,
    ) -> None:
        self.layout, self.kube, self.room, self.status, self.metrics = layout, kube, room, status, metrics
        self.credentials, self.planner, self.done = credentials, planner, done
        # every download's settings section, whole (AgentSettings.downloads): endpoints, CA, egress,
        # Xet, write mode, and what they take from the environment the agent started with (proxies,
        # OCI mirrors, the object-store clients' variables)
        self.settings = settings
        self.peering, self.budget = peering, budget
        # each download gives its share of the origin slots back when it ends
        self.downloader = budget.releasing(downloader) if budget is not None else downloader
        self.pool = ThreadPoolExecutor(max_parallel, thread_name_prefix="praesto-download")

    def start(self, ref: CacheRef) -> Job:
        """Queue a download of `ref`; it runs once a pool thread is free."""
        job = Job(
            ref, self.layout, self.kube, self.settings, self.room, self._started, self.status.progress,
            self.planner, self.downloader, self.credentials,
            None if self.peering is None and self.budget is None else self._attach,
        )  # fmt: skip
        self.pool.submit(self._run, job)
        return job

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

    def _run(self, job: Job) -> None:
        self.metrics.in_flight.inc()
        try:
            outcome = job.run()
        finally:
            self.metrics.in_flight.dec()
            if self.peering is not None:  # the download ended: its watch of the cache's copies closes
                self.peering.detach()
        self.done(outcome)

    def _started(self, ref: CacheRef, plan: dlapi.Plan) -> None:
        # resolvedRevision while Downloading: peers copy this download's written parts (agent/peers)
        self.status.started(ref, plan.total_bytes, plan.revision)

    def _attach(self, ref: CacheRef, plan: dlapi.Plan, options: dlapi.Options) -> dlapi.PartSources:
        """Before the bytes: the origin budget gates the origin (`throttle`), peers and arrivals not."""

        def waiting(reason: str) -> Callable[[str], None]:  # why the download waits, on the copy's status
            if ref.beside:  # a rolling update: the served copy stays Ready; status.next says it waits
                beside = {"revision": ref.source.version, "phase": names.NEXT_DOWNLOADING, "reason": reason}
                return lambda message: self.status.set_next(ref.key, {**beside, "message": message})
            return lambda message: self.status.set_key(ref.key, names.PHASE_PENDING, reason, message)

        throttle = None
        if self.budget is not None:
            report = waiting(names.REASON_WAITING_FOR_ORIGIN_BUDGET)
            throttle = self.budget.attach(ref.namespace, plan, options, report=report)
        if self.peering is None:
            return dlapi.PartSources(throttle=throttle)
        report = waiting(REASON_WAITING_FOR_PEER)
        peers = self.peering.attach(ref.namespace, ref.cache, plan, options, report=report)
        return dlapi.PartSources(peers=peers.peers, arrivals=peers.arrivals, throttle=throttle)
