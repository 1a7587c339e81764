"""A xorb's footer: its chunk hashes and boundaries, proven by the xorb's own hash.

xet_core_structures/src/xorb_object/xorb_object_format.rs (hf-xet 1.8.0) `XorbObjectInfoV1`:
a serialized xorb is its chunks, then this footer, then the footer's length (u32 LE, not counting
itself). Footer: "XETBLOB", version 1, xorb hash; "XBLBHSH", version 0, n (u32), n chunk hashes;
"XBLBBND", version 1, n, n stored end offsets (u32, headers included), n unpacked end offsets;
n, the two section offsets (u32 each) and a 16-byte buffer. The xorb hash is the merkle root of
(chunk hash, unpacked size), so chunk hashes read here are trusted exactly as far as the xorb
hash that names them: a later range of this xorb, from the origin, a peer or the chunk store, is
verified chunk by chunk against them as it arrives.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from praesto.agent.download.origins.huggingface.xet.errors import XetFormatError
from praesto.agent.download.origins.huggingface.xet.hashing import to_hex, xorb_hash
from praesto.agent.download.origins.huggingface.xet.limits import (
    MAX_CHUNK_SIZE,
    MAX_XORB_CHUNKS,
    MAX_XORB_STORED_BYTES,
)

IDENT = b"XETBLOB"
IDENT_HASHES = b"XBLBHSH"
IDENT_BOUNDARIES = b"XBLBBND"
BUFFER_LEN = 16


@dataclass(frozen=True)
class XorbFooter:
    xorb_hash: bytes
    chunk_hashes: tuple[bytes, ...]
    stored_ends: tuple[int, ...]  # chunk i is bytes [stored_ends[i-1], stored_ends[i]) of the xorb
    unpacked_ends: tuple[int, ...]

    def byte_range(self, start: int, end: int) -> tuple[int, int]:
        """[first byte, last byte + 1) of chunks [start, end) in the serialized xorb."""
        if not 0 <= start < end <= len(self.chunk_hashes):
            raise XetFormatError(
                f"chunk range [{start}, {end}) is outside the xorb's {len(self.chunk_hashes)} chunks"
            )
        return (self.stored_ends[start - 1] if start else 0), self.stored_ends[end - 1]


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise XetFormatError("xorb footer is truncated")
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    def u32s(self, n: int) -> tuple[int, ...]:
        return struct.unpack(f"<{n}I", self.take(4 * n))

    def expect(self, ident: bytes, version: int) -> None:
        got, ver = self.take(len(ident)), self.take(1)[0]
        if got != ident or ver != version:
            raise XetFormatError(f"xorb footer section {got!r} v{ver}; only {ident!r} v{version} is known")


def parse_footer(tail: bytes, expected_xorb: bytes) -> XorbFooter:
    """The footer at the end of `tail` (the xorb or any suffix of it holding the footer)."""
    if len(tail) < 4:
        raise XetFormatError("xorb footer is truncated")
    (info_length,) = struct.unpack("<I", tail[-4:])
    if info_length > len(tail) - 4 or info_length > 41 * MAX_XORB_CHUNKS + 128:
        raise XetFormatError(f"xorb footer claims {info_length} bytes, more than it could hold")
    r = _Reader(tail[-4 - info_length : -4])
    r.expect(IDENT, 1)
    stated = r.take(32)
    r.expect(IDENT_HASHES, 0)
    (n,) = r.u32s(1)
    if not 0 < n <= MAX_XORB_CHUNKS:
        raise XetFormatError(f"xorb footer claims {n} chunks, the format allows 1..{MAX_XORB_CHUNKS}")
    hashes = tuple(r.take(32) for _ in range(n))
    r.expect(IDENT_BOUNDARIES, 1)
    if r.u32s(1) != (n,):
        raise XetFormatError("xorb footer's chunk counts disagree")
    stored, unpacked = r.u32s(n), r.u32s(n)
    if r.u32s(1) != (n,):
        raise XetFormatError("xorb footer's chunk counts disagree")
    r.take(8 + BUFFER_LEN)
    sizes = [unpacked[i] - (unpacked[i - 1] if i else 0) for i in range(n)]
    stored_sizes = [stored[i] - (stored[i - 1] if i else 0) for i in range(n)]
    if any(not 0 < s <= MAX_CHUNK_SIZE for s in sizes) or any(s <= 0 for s in stored_sizes):
        raise XetFormatError("xorb footer's chunk boundaries are not increasing within the format's sizes")
    if stored[-1] > MAX_XORB_STORED_BYTES:
        raise XetFormatError(f"xorb footer claims {stored[-1]} bytes of chunks, over {MAX_XORB_STORED_BYTES}")
    computed = xorb_hash(list(zip(hashes, sizes, strict=True)))
    if computed != stated or stated != expected_xorb:
        raise XetFormatError(
            f"xorb footer of {to_hex(expected_xorb)} lists chunks hashing to {to_hex(computed)} "
            f"and states {to_hex(stated)}: refused"
        )
    return XorbFooter(stated, hashes, stored, unpacked)
