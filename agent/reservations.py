"""Disk promised to downloads in flight, so two plans at once cannot both spend the reserve.

Free space is read long before a download's bytes land; without a ledger two
downloads planned a moment apart both see the same free bytes and together eat
into the reserve (or fill the disk). `make_room` reserves a download's size at
plan time, under the room lock, and every later plan counts what the earlier
ones have not written yet as already gone. The job releases its reservation
however it ends (published, failed, cancelled). Pure: the caller says how much
each download has written so far.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

StoreKey = tuple[str, str]  # (namespace, cache): one store directory, one staging directory


@dataclass
class Reservations:
    """Bytes each download in flight was promised (its whole size); not thread-safe: hold the room lock."""

    held: dict[StoreKey, int] = field(default_factory=dict)

    def reserve(self, key: StoreKey, nbytes: int) -> None:
        self.held[key] = max(0, nbytes)

    def release(self, key: StoreKey) -> None:
        self.held.pop(key, None)

    def outstanding(self, written: Callable[[StoreKey], int], excluding: StoreKey | None = None) -> int:
        """Bytes promised but not on disk yet: they are free now and will not be soon."""
        return sum(max(0, total - written(key)) for key, total in self.held.items() if key != excluding)
