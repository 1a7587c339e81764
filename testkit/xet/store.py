"""The double's state: xorbs, files, tokens and the counters tests read. One lock, no globals."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass, field

from testkit.xet.formats import Segment, Shard, chunk_boundaries, xorb_footer


@dataclass
class Counters:
    xorbs_posted: int = 0
    xorb_bytes_posted: int = 0  # bodies of POST /v1/xorbs, new or not: what a client sent
    xorbs_inserted: int = 0
    shards_posted: int = 0
    reconstructions: int = 0
    range_requests: int = 0
    range_bytes_served: int = 0
    unauthorized: int = 0
    tokens_issued: int = 0
    dedup_queries: int = 0


@dataclass
class Faults:
    """Knobs for a downloader's fallback tests: a CAS that fails or stalls."""

    status: int = 0  # every reconstruction and xorb request answers this (0: none)
    # xorb ranges send their headers and half their bytes, then wait for this (set: go on)
    stall: threading.Event | None = None


@dataclass
class CasStore:
    """Content-addressed xorbs (hex hash -> bytes) and file reconstructions (file hash -> segments)."""

    url_secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    xorbs: dict[str, bytes] = field(default_factory=dict)
    boundaries: dict[str, list[int]] = field(default_factory=dict)
    files: dict[str, tuple[Segment, ...]] = field(default_factory=dict)
    tokens: dict[str, float] = field(default_factory=dict)
    counters: Counters = field(default_factory=Counters)
    faults: Faults = field(default_factory=Faults)
    unexpected: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    # -- tokens ------------------------------------------------------------------------------
    def issue_token(self, ttl: float) -> tuple[str, int]:
        token = secrets.token_urlsafe(24)
        exp = time.time() + ttl
        with self.lock:
            self.tokens[token] = exp
            self.counters.tokens_issued += 1
        return token, int(exp)

    def token_ok(self, authorization: str | None) -> bool:
        token = (authorization or "").removeprefix("Bearer ").strip()
        with self.lock:
            ok = self.tokens.get(token, 0.0) > time.time()
            if not ok:
                self.counters.unauthorized += 1
        return ok

    def expire_tokens(self) -> None:
        """Every token issued so far stops working now (the next request with one gets 401)."""
        with self.lock:
            self.tokens = dict.fromkeys(self.tokens, 0.0)

    # -- presigned xorb URLs --------------------------------------------------------------------
    def sign(self, xorb: str, exp: int) -> str:
        return hmac.new(self.url_secret, f"{xorb}:{exp}".encode(), hashlib.sha256).hexdigest()

    def signature_ok(self, xorb: str, exp: int, sig: str) -> bool:
        return exp > time.time() and hmac.compare_digest(self.sign(xorb, exp), sig)

    # -- content ------------------------------------------------------------------------------
    def put_xorb(self, xorb: str, body: bytes) -> bool:
        offsets = chunk_boundaries(body)
        with self.lock:
            self.counters.xorbs_posted += 1
            self.counters.xorb_bytes_posted += len(body)
            if xorb in self.xorbs:
                return False
            self.xorbs[xorb] = body
            self.boundaries[xorb] = offsets
            self.counters.xorbs_inserted += 1
            return True

    def put_shard(self, shard: Shard) -> None:
        with self.lock:
            self.counters.shards_posted += 1
            for info in shard.xorbs:  # the CAS keeps each xorb with its footer, built from the shard
                bounds = self.boundaries.get(info.xorb)
                if bounds is not None and len(self.xorbs[info.xorb]) == bounds[-1]:
                    if len(bounds) - 1 != len(info.chunk_hashes):
                        raise ValueError(
                            f"shard lists {len(info.chunk_hashes)} chunks for xorb {info.xorb}, it has {len(bounds) - 1}"
                        )
                    footer = xorb_footer(info.xorb, info.chunk_hashes, bounds, info.unpacked_sizes)
                    self.xorbs[info.xorb] += footer
            for file_hash, segments in shard.files.items():
                missing = [s.xorb for s in segments if s.xorb not in self.xorbs]
                if missing:
                    raise ValueError(f"shard names xorbs never uploaded: {missing[:3]}")
                self.files[file_hash] = segments

    def flip_byte(self, xorb: str, offset: int) -> None:
        """Corrupt one stored byte of a xorb (a disk or wire fault the reader must catch)."""
        with self.lock:
            data = bytearray(self.xorbs[xorb])
            data[offset] ^= 0xFF
            self.xorbs[xorb] = bytes(data)
