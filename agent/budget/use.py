"""One download's use of the origin budget (gate.OriginBudget): its origin requests wait for the
node's places, share the origin's Retry-After and are paced; peers are never behind it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from praesto.agent.download.api import ByteSource, DownloadCancelled, Target
from praesto.agent.download.http import Transient

if TYPE_CHECKING:
    from praesto.agent.budget.origin_budget import OriginBudget

Sink = Callable[[int, memoryview], None]


class OriginUse:
    """One download's use of the budget: slots joined at its first origin request, left when it ends."""

    def __init__(
        self,
        budget: OriginBudget,
        host: str,
        namespace: str,
        report: Callable[[str], None],
        cancel: threading.Event,
    ) -> None:
        self.budget, self.host, self.namespace, self.report, self.cancel = (
            budget,
            host,
            namespace,
            report,
            cancel,
        )
        self._lock = threading.Lock()  # one fetch thread of this download waits; the others queue here
        self._joined = False

    def wrap(self, source: ByteSource) -> ByteSource:
        return GatedSource(source, self)

    def before(self) -> None:
        self.budget.wait_cooldown(self.host, self.cancel, self.report)
        with self._lock:
            self.budget.hold(self.host, self.namespace, self.cancel, self.report, join=not self._joined)
            self._joined = True

    def refused(self, error: Transient) -> None:
        if error.retry_after is not None:
            self.budget.record_cooldown(self.host, error.retry_after)

    def done(self) -> None:
        with self._lock:
            if self._joined:
                self._joined = False
                self.budget.leave(self.host)


class GatedSource:
    """The origin's `ByteSource`, behind the budget: slots first, shared Retry-After, paced bytes."""

    def __init__(self, inner: ByteSource, use: OriginUse) -> None:
        self.inner, self.use = inner, use

    def resolve(self, url: str) -> Target:
        self.use.before()
        try:
            return self.inner.resolve(url)
        except Transient as error:
            self.use.refused(error)
            raise
        finally:
            self.use.budget.request_done(self.use.host)

    def fetch(self, target: Target, start: int, end: int, sink: Sink, cancel: threading.Event) -> int:
        self.use.before()
        pace = self.use.budget.pace

        def paced(offset: int, chunk: memoryview) -> None:
            sink(offset, chunk)
            if (delay := pace.delay(len(chunk))) > 0 and cancel.wait(delay):
                raise DownloadCancelled()

        try:
            return self.inner.fetch(target, start, end, paced if pace.rate > 0 else sink, cancel)
        except Transient as error:
            self.use.refused(error)
            raise
        finally:
            self.use.budget.request_done(self.use.host)

    def close(self) -> None:
        self.inner.close()
