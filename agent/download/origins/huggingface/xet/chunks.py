"""Split a xorb byte range into chunks and decompress each by its scheme, within the format's bounds.

xet_core_structures/src/xorb_object/xorb_chunk_format.rs (hf-xet 1.8.0): each chunk is an
8-byte header (version u8 = 0, compressed length u24 LE, scheme u8, uncompressed length u24 LE)
and then its compressed bytes. compression_scheme.rs: scheme 0 stores the bytes, 1 is an LZ4
*frame* (lz4_flex FrameEncoder), 2 ("ByteGrouping4LZ4") is an LZ4 frame of the bytes regrouped
4-way (byte_grouping/bg4.rs: every 4th byte from offset 0, then from 1, 2, 3; group k holds
len/4 bytes plus one if k < len % 4). https://huggingface.co/docs/xet/xorb describes the same.

LZ4 comes from PyPI `lz4` (python-lz4, bindings to the reference C library, frame format
included), not a hand-written decoder; it decodes with an output cap, so a frame that claims
little and expands a lot stops at the header's length plus one byte.
"""

from __future__ import annotations

from dataclasses import dataclass

import lz4.frame
from praesto.agent.download.origins.huggingface.xet.errors import XetFormatError
from praesto.agent.download.origins.huggingface.xet.hashing import chunk_hash
from praesto.agent.download.origins.huggingface.xet.limits import (
    CHUNK_HEADER_SIZE,
    CHUNK_HEADER_VERSION,
    MAX_CHUNK_SIZE,
    MAX_COMPRESSED_CHUNK_SIZE,
    MAX_XORB_BYTES,
    MAX_XORB_CHUNKS,
)

SCHEME_NONE = 0
SCHEME_LZ4 = 1
SCHEME_BG4_LZ4 = 2
SCHEME_NAMES = {SCHEME_NONE: "none", SCHEME_LZ4: "lz4", SCHEME_BG4_LZ4: "bg4-lz4"}


@dataclass(frozen=True)
class Chunk:
    """One decoded chunk: its index in the xorb, its bytes and their Xet chunk hash."""

    index: int
    data: bytes
    hash: bytes
    stored_size: int  # header + compressed bytes, as laid out in the xorb


def _lz4_frame(payload: bytes, expect: int, where: str) -> bytes:
    decoder = lz4.frame.LZ4FrameDecompressor()
    try:
        out: bytes = decoder.decompress(payload, max_length=expect + 1)
    except RuntimeError as err:  # python-lz4 raises RuntimeError for a corrupt frame
        raise XetFormatError(f"{where}: LZ4 frame does not decode ({err})") from None
    if len(out) != expect or not decoder.eof:
        raise XetFormatError(f"{where}: decodes to more or fewer bytes than its header's {expect}")
    return out


def regroup_bg4(grouped: bytes) -> bytes:
    """Undo the 4-way byte grouping (bg4.rs `bg4_regroup`)."""
    n = len(grouped)
    out = bytearray(n)
    start = 0
    for k in range(4):
        size = len(range(k, n, 4))
        out[k::4] = grouped[start : start + size]
        start += size
    return bytes(out)


def decode_chunk(payload: bytes, scheme: int, uncompressed: int, where: str) -> bytes:
    if scheme == SCHEME_NONE:
        if len(payload) != uncompressed:
            raise XetFormatError(
                f"{where}: stored plain but {len(payload)} bytes, header says {uncompressed}"
            )
        return payload
    if scheme == SCHEME_LZ4:
        return _lz4_frame(payload, uncompressed, where)
    if scheme == SCHEME_BG4_LZ4:
        return regroup_bg4(_lz4_frame(payload, uncompressed, where))
    raise XetFormatError(f"{where}: unknown compression scheme {scheme} (known: 0 none, 1 lz4, 2 bg4-lz4)")


def decode_range(data: bytes, first_index: int, count: int, xorb: str = "xorb") -> list[Chunk]:
    """Exactly `count` chunks from `data`, numbered from `first_index`; every header checked first.

    `data` is what a fetch of the byte range for chunks [first_index, first_index + count) of
    `xorb` returned: it must hold those chunks and nothing more.
    """
    if count <= 0 or count > MAX_XORB_CHUNKS or first_index < 0 or first_index + count > MAX_XORB_CHUNKS:
        raise XetFormatError(
            f"{xorb}: chunk range [{first_index}, {first_index + count}) is outside a xorb's bounds"
        )
    chunks: list[Chunk] = []
    offset = 0
    plain_total = 0  # what the headers claim so far: a range decodes to no more than a xorb holds
    for index in range(first_index, first_index + count):
        where = f"chunk {index} of xorb {xorb}"
        header = data[offset : offset + CHUNK_HEADER_SIZE]
        if len(header) < CHUNK_HEADER_SIZE:
            raise XetFormatError(f"{where}: the range ends inside its header ({len(data)} bytes fetched)")
        version, scheme = header[0], header[4]
        compressed = int.from_bytes(header[1:4], "little")
        uncompressed = int.from_bytes(header[5:8], "little")
        if version != CHUNK_HEADER_VERSION:
            raise XetFormatError(f"{where}: header version {version}, only {CHUNK_HEADER_VERSION} is known")
        if uncompressed > MAX_CHUNK_SIZE or uncompressed == 0:
            raise XetFormatError(
                f"{where}: claims {uncompressed} bytes, the format allows 1..{MAX_CHUNK_SIZE}"
            )
        if compressed > MAX_COMPRESSED_CHUNK_SIZE:
            raise XetFormatError(
                f"{where}: claims {compressed} stored bytes, over {MAX_COMPRESSED_CHUNK_SIZE}"
            )
        plain_total += uncompressed
        if plain_total > MAX_XORB_BYTES:
            raise XetFormatError(
                f"{where}: the range's chunks claim more than a xorb's {MAX_XORB_BYTES} bytes; "
                "refused before decoding it"
            )
        start = offset + CHUNK_HEADER_SIZE
        payload = data[start : start + compressed]
        if len(payload) < compressed:
            raise XetFormatError(f"{where}: the range ends inside its data ({len(data)} bytes fetched)")
        plain = decode_chunk(payload, scheme, uncompressed, where)
        chunks.append(Chunk(index, plain, chunk_hash(plain), CHUNK_HEADER_SIZE + compressed))
        offset = start + compressed
    if offset != len(data):
        raise XetFormatError(
            f"{xorb}: {len(data) - offset} bytes after chunk {first_index + count - 1}; "
            "the fetched range is longer than its chunks"
        )
    return chunks
