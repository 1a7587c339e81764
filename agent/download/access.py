"""How one download reaches its plan's bytes: what an origin (download/origin.py) hands the engine.

Here, in the download core, so the engine reads it without knowing any origin or kind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from praesto.agent.download.api import ByteSource, OriginThrottle, RemoteFile

if TYPE_CHECKING:
    from praesto.agent.download.engine import Engine, FileJob


class WholeFileRoute(Protocol):
    """A second way to a whole file, taken before ranges when it may (Hugging Face's Xet CAS).

    It writes, hashes and journals through the engine as ranges do; the file is still verified by
    the plan's digest, and on any failure the route puts the file back on the range path.
    """

    def eligible(self, engine: Engine, job: FileJob) -> bool:
        """Whether `job`'s file goes this way (asked once per file, at prepare)."""
        ...

    def fetch_file(self, engine: Engine, job: FileJob) -> None:
        """The whole file, in order; on a failure, every part queued again for ranges."""
        ...

    def mismatch(self, engine: Engine, job: FileJob, why: str) -> None:
        """The file came this way but is not the plan's digest: count it and leave the route (the
        engine starts the file over through ranges)."""
        ...

    def close(self) -> None:
        """This fetch thread's connections (called by each engine worker as it ends)."""
        ...

    def behind(self, throttle: OriginThrottle) -> WholeFileRoute:
        """This route with its origin byte requests behind `throttle` (the origin budget), before the run."""
        ...


@dataclass(frozen=True)
class Access:
    """How one download reaches its plan's bytes (`Origin.open`); the engine asks nothing else."""

    endpoint: str  # the origin's base URL (a store: the source URI), as the platform configured it
    transport: ByteSource  # serves byte ranges of a located file; the origin budget wraps it
    locate: Callable[[RemoteFile], str]  # where `transport` finds a file's bytes (a URL or a key)
    whole_files: WholeFileRoute | None = None  # None: ranges only

    def behind(self, throttle: OriginThrottle) -> Access:
        """The same access with every origin byte request behind `throttle` (the cluster's origin
        budget): the byte source and the whole-file route; peers never are."""
        route = self.whole_files.behind(throttle) if self.whole_files is not None else None
        return replace(self, transport=throttle.wrap(self.transport), whole_files=route)
