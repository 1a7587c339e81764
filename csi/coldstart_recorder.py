"""The CSI driver's half of per-Pod cold-start accounting (issue #15).

The driver is the only one that sees when a Pod first asks for a cache and when
it gets it, but it has no API access; so it writes a record
(`praesto.coldstart_record.PodStart`) under `<base>/.praesto/pods/` (`store.PODS`) through
the same symlink-safe directory fds as its other records (`CsiStore`), and the node agent
reports it.
Accounting never fails or delays a mount: a record that cannot be written is
logged and skipped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from praesto.csi.storefs import CsiStore
from praesto.csi.volume import CsiError, PublishRequest

from praesto import coldstart_record

log = logging.getLogger(__name__)


class PodStartRecorder:
    def __init__(self, fs: CsiStore, clock: Callable[[], float] = time.time) -> None:
        self.fs = fs
        self.clock = clock

    def waiting(self, req: PublishRequest, started: float) -> None:
        """The cache is not complete at this attempt: the first such attempt marks a miss."""
        self._record(req, started, mounted=False)

    def mounted(self, req: PublishRequest, started: float) -> None:
        """The mount succeeded: finish the record; without one, this first attempt was a hit."""
        self._record(req, started, mounted=True)

    def _record(self, req: PublishRequest, started: float, mounted: bool) -> None:
        if not req.pod_uid:
            return
        name = coldstart_record.record_name(req.pod_uid, req.namespace, req.name)
        try:
            old = coldstart_record.from_json(self.fs.read_pod_start(name))
            if old is not None and (old.mounted_at is not None or not mounted):
                return  # first attempt already known; a finished record is final
            record = coldstart_record.PodStart(
                req.pod_uid,
                req.pod_name,
                req.namespace,
                req.name,
                started if old is None else old.first_attempt_at,
                mounted if old is None else old.hit,
                self.clock() if mounted else None,
            )
            self.fs.write_pod_start(name, record.to_json())
        except (OSError, CsiError) as err:
            log.warning(
                "could not record the pod start of %s/%s for model cache %s: %s",
                req.namespace, req.pod_name, req.name, getattr(err, "message", err),
            )  # fmt: skip
