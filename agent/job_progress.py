"""PVC mode's live progress, the thin edge: one thread that patches the download Job's annotation.

The cadence and the value are praesto/jobprogress.py's (pure). Here: the Job reference from the
environment, a client authenticated by the projected token the sync hook mounts
(names.PROGRESS_CREDENTIALS_DIR, re-read as the kubelet rotates it), and the thread. Reporting
is best effort: a refused or failed patch (the RoleBinding not there yet, the API server away)
is logged once and never slows or fails the download.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from praesto import jobprogress, names

log = logging.getLogger("praesto.agent.download")
Patcher = Callable[[str], None]


def parse_job_ref(text: str) -> tuple[str, str]:
    """`namespace/name` of the Job to report on; ValueError naming the fix otherwise."""
    namespace, _, name = text.partition("/")
    if not namespace or not name or "/" in name:
        raise ValueError(
            f"--progress-job {text[:100]!r} (from ${names.ENV_PROGRESS_JOB}) is not NAMESPACE/NAME; "
            "give the download Job as namespace/name, or leave it out to report no live progress"
        )
    return namespace, name


def job_patcher(namespace: str, name: str, credentials_dir: Path, env: Mapping[str, str]) -> Patcher:
    """A patch of the Job's one annotation, as the Job's ServiceAccount (the chart's
    ValidatingAdmissionPolicy lets that identity change nothing else)."""
    from praesto.agent.kube import job_patch_call

    patch_job = job_patch_call(credentials_dir, env)

    def patch(value: str) -> None:
        body = {"metadata": {"annotations": {names.ANNOTATION_DOWNLOAD_PROGRESS: value}}}
        patch_job(name, namespace, body, _request_timeout=10)

    return patch


class ProgressSender:
    """Feeds a jobprogress.Reporter from the download's callback and writes what it says is due."""

    def __init__(
        self,
        patch: Patcher,
        reporter: jobprogress.Reporter,
        tick: float = 1.0,
    ) -> None:
        self.patch, self.reporter, self.tick = patch, reporter, tick
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.failure: str | None = None  # the last failure logged, so each kind is logged once
        self.thread = threading.Thread(target=self._run, name="job-progress", daemon=True)

    def record(self, done: int, total: int) -> None:
        with self.lock:
            self.reporter.record(done, total)

    def start(self) -> ProgressSender:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=15)

    def send_due(self) -> None:
        """One step of the thread: write the value the reporter says is due, if any."""
        with self.lock:
            value = self.reporter.due()
        if value is None:
            return
        try:
            self.patch(value)
        except Exception as err:  # display only: never the download's failure
            kind = f"{type(err).__name__}: {getattr(err, 'status', '') or str(err)[:200]}"
            if kind != self.failure:
                self.failure = kind
                log.warning("could not write live progress on the Job (%s); the download goes on", kind)
            return
        self.failure = None

    def _run(self) -> None:
        while not self.stopped.wait(self.tick):
            self.send_due()


def sender_from_env(
    job: str, credentials_dir: Path, env: Mapping[str, str], **reporter: Any
) -> ProgressSender | None:
    """The started sender for `job` (NAMESPACE/NAME, already checked), or None with one warning
    when the credentials are not mounted (an older Job, or run outside a Pod): progress only."""
    if not (credentials_dir / "token").is_file():
        log.warning(
            "no live progress: %s holds no token (the sync hook mounts one in the download Job)",
            credentials_dir,
        )
        return None
    namespace, name = parse_job_ref(job)
    try:
        patch = job_patcher(namespace, name, credentials_dir, env)
    except Exception as err:  # e.g. KUBERNETES_SERVICE_HOST unset: not in a Pod
        log.warning("no live progress: %s", str(err)[:200])
        return None
    clock = jobprogress.Reporter(monotonic=time.monotonic, wall=lambda: datetime.now(UTC), **reporter)
    return ProgressSender(patch, clock).start()
