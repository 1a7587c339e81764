"""The digests an origin publishes for a file, and which of them may let a peer supply its bytes.

Hugging Face lists a sha256 (LFS) or a git blob sha1 per file. Object stores keep their own:
an MD5 (a single-part S3 ETag, GCS `md5Hash`, Azure `Content-MD5`), S3's additional
checksums (SHA-256, SHA-1, CRC32, CRC32C, CRC64NVME) and GCS's CRC32C. Each is checked
against the bytes as they are hashed. Only a cryptographic digest lets a peer supply the
bytes: a CRC is trivially forged, so a file vouched for by a CRC alone still comes from the
origin only (the CRC then guards the transfer, not the source).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


class RunningDigest(Protocol):
    def update(self, data: bytes | memoryview, /) -> None: ...
    def hexdigest(self) -> str: ...


class _Crc:
    """A CRC as a hashlib-like object: `update` in order, `hexdigest` big-endian as stores print it."""

    def __init__(self, step: Callable[[bytes | memoryview, int], int], width: int) -> None:
        self.step, self.width, self.value = step, width, 0

    def update(self, data: bytes | memoryview, /) -> None:
        self.value = self.step(data, self.value)

    def hexdigest(self) -> str:
        return self.value.to_bytes(self.width, "big").hex()


def _crc32() -> RunningDigest:
    return _Crc(zlib.crc32, 4)


def _crc32c() -> RunningDigest:
    import google_crc32c  # imported when a file needs it: the Hub path never does

    def step(data: bytes | memoryview, value: int) -> int:
        chunk = bytes(data) if isinstance(data, memoryview) else data  # it takes bytes only (a 1 MiB copy)
        return int(google_crc32c.extend(value, chunk))

    return _Crc(step, 4)


def _crc64nvme() -> RunningDigest:
    from awscrt import checksums  # the implementation botocore itself uses for CRC64NVME

    return _Crc(lambda data, value: int(checksums.crc64nvme(data, value)), 8)


@dataclass(frozen=True)
class Algorithm:
    name: str
    new: Callable[[], RunningDigest]
    cryptographic: bool  # no accident makes other bytes match it (peers: sha256 only, api.RemoteFile)


ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        Algorithm("sha256", hashlib.sha256, True),
        Algorithm("sha1", lambda: hashlib.sha1(usedforsecurity=False), True),
        Algorithm(
            "md5", lambda: hashlib.md5(usedforsecurity=False), True
        ),  # second preimages stay infeasible
        Algorithm("crc32", _crc32, False),
        Algorithm("crc32c", _crc32c, False),
        Algorithm("crc64nvme", _crc64nvme, False),
    )
}


@dataclass(frozen=True)
class StoreDigest:
    """A digest the object store published for the whole object, before any byte was fetched."""

    algorithm: str  # a key of ALGORITHMS
    value: str  # lowercase hex, big-endian for CRCs
    header: str  # where the store said it (ETag, Content-MD5, x-goog-hash, x-amz-checksum-…)

    @property
    def cryptographic(self) -> bool:
        return ALGORITHMS[self.algorithm].cryptographic

    def describe(self) -> str:
        return f"{self.algorithm} {self.value} ({self.header})"


def from_base64(algorithm: str, value: str, header: str) -> StoreDigest | None:
    """A store's base64 digest (how GCS, Azure and S3's checksums print them), or None if malformed."""
    try:
        raw = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    size = {"md5": 16, "sha1": 20, "sha256": 32, "crc32": 4, "crc32c": 4, "crc64nvme": 8}[algorithm]
    return StoreDigest(algorithm, raw.hex(), header) if len(raw) == size else None
