"""The job runner: one download of one copy, run on a pool thread: token, plan, room, bytes.

While it runs the job reports progress (Downloading) through the callbacks it is
given; the reconciler owns the copy's status otherwise. It reports how it ended as
an `Outcome`, and gives its disk reservation back however it ended.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from praesto.agent import logs
from praesto.agent.copies import CacheRef, Outcome
from praesto.agent.credentials import CredentialPolicy
from praesto.agent.download import api as dlapi
from praesto.agent.kube import KubeApi, SecretUnavailable
from praesto.agent.room import DiskRoom

from praesto.quantity import format_bytes
from praesto.store import StoreLayout

Peering = Callable[[CacheRef, dlapi.Plan, dlapi.Options], None]  # may set options.peers (or wait first)


def check_request(ref: CacheRef, plan: dlapi.Plan) -> None:
    """Node mode: spec.storage.size is a limit, checked before any byte is written or evicted.

    Otherwise one cache (on every node, with an empty nodeSelector) could take far
    more than its owner declared, and the webhook's namespace quota would count
    nothing real.
    """
    limit = ref.size_bytes
    if limit is not None and plan.total_bytes > limit:
        raise dlapi.DownloadError(
            "SizeExceedsRequest",
            f"the model is {format_bytes(plan.total_bytes)} ({plan.total_bytes} bytes), more than "
            f"spec.storage.size {format_bytes(limit)} ({limit} bytes), the most one node copy may take; "
            "nothing was written; raise storage.size on the ModelCache (delete and create it again) to at "
            f"least {format_bytes(plan.total_bytes)}, or narrow it with allowPatterns/ignorePatterns",
        )


class Job:
    """Runs `plan` + `download` for one cache; reports progress through `on_progress`."""

    def __init__(
        self,
        ref: CacheRef,
        layout: StoreLayout,
        kube: KubeApi,
        options: dlapi.Options,
        room: DiskRoom,
        on_started: Callable[[CacheRef, dlapi.Plan], None],
        on_progress: Callable[[CacheRef, int, int], None],
        planner: dlapi.Planner,
        downloader: dlapi.Downloader,
        credentials: CredentialPolicy,
        peering: Peering | None = None,
    ):
        self.ref, self.layout, self.kube, self.options, self.room = ref, layout, kube, options, room
        self.on_started, self.on_progress = on_started, on_progress
        self.planner, self.downloader = planner, downloader
        self.peering = peering
        self.credentials = credentials  # the agent's policy, built once at start
        self.log = logs.cache_logger(ref.namespace, ref.cache, modelCacheNode=ref.name)

    @property
    def cancel(self) -> threading.Event:
        return self.options.cancel

    def run(self) -> Outcome:
        out = Outcome(self.ref)
        try:
            token, credentials, where = self.credentials.credentials(self.kube, self.ref)
            options = dlapi.Options(
                endpoint=self.options.endpoint,
                token=token,
                credentials=credentials,
                credentials_from=where,
                identity_allowed=self.credentials.identity_allowed(self.ref),
                concurrency=self.options.concurrency,
                blobs_dir=self.layout.blobs_dir,
                dedup_scope=self.ref.namespace,
                staging_dir=self.layout.staging_dir(self.ref.namespace, self.ref.cache),
                progress=lambda done, total: self.on_progress(self.ref, done, total),
                cancel=self.options.cancel,
                cache_uid=self.ref.cache_uid,
            )
            plan = self.planner(self.ref.source, options)
            self.log.info(
                "planned",
                extra={"revision": plan.revision, "files": len(plan.files), "bytes": plan.total_bytes},
            )
            check_request(self.ref, plan)
            out.evicted = self.room.make_room(self.ref, plan)
            if self.peering is not None:
                self.peering(self.ref, plan, options)
            self.on_started(self.ref, plan)
            dest = self.layout.cache_dir(self.ref.namespace, self.ref.cache)
            out.result = self.downloader(plan, dest, options)
            self.log.info(
                "downloaded",
                extra={
                    "revision": plan.revision,
                    "fromOrigin": out.result.bytes_from_origin,
                    "deduplicated": out.result.bytes_deduplicated,
                    "resumed": out.result.bytes_resumed,
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
        except Exception as err:  # a bug or an OS error: report it as a retryable failure, never crash
            if self.cancel.is_set():
                out.cancelled = True
            else:
                self.log.exception("download crashed")
                out.error = dlapi.DownloadError(
                    "SourceUnavailable", f"download failed unexpectedly: {type(err).__name__}", retryable=True
                )
        finally:
            self.room.release((self.ref.namespace, self.ref.cache))  # however it ended
        return out
