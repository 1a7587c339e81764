"""What the double must read of the bytes hf_xet uploads: xorb chunk boundaries and shards.

Written apart from the product's format core (agent/download/origins/huggingface/xet) on purpose: the double is proven
by the real hf_xet client, so sharing code would let one bug hide in both. Sources, hf-xet 1.8.0
(PyPI sdist; xet-core paths): xet_core_structures/src/xorb_object/xorb_chunk_format.rs (8-byte
chunk headers), xorb_object_format.rs (footer + trailing u32 length, idents "XETBLOB"...),
metadata_shard/shard_format.rs, file_structs.rs, xorb_structs.rs (shard layout: a 48-byte header
"HFRepoMetaData\\0..." + version u64 + footer size u64; file section: per file a 48-byte header
{hash, flags u32, n u32, u64} + n entries {xorb hash, flags, unpacked bytes, chunk start, chunk
end} + n verification entries if flags bit 31 + one metadata entry if bit 30, ended by an
all-0xFF hash; xorb section: per xorb {hash, flags, n, bytes in xorb, bytes on disk} + n entries
{chunk hash, byte start, unpacked bytes, flags, u32}, ended likewise). The upload carries no
footer or lookup tables (shard_file_handle.rs `read_shard_to_bytes_remove_footer`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

SHARD_TAG = b"HFRepoMetaData\x00" + bytes(
    [85, 105, 103, 69, 106, 123, 129, 87, 131, 165, 189, 217, 92, 205, 209, 74, 169]
)
BOOKEND = b"\xff" * 32
ENTRY = 48
FLAG_VERIFICATION = 1 << 31
FLAG_METADATA_EXT = 1 << 30


def hash_hex(raw: bytes) -> str:
    """Xet's hex form: four little-endian u64 words (merklehash/data_hash.rs `hex`)."""
    return "".join(raw[i : i + 8][::-1].hex() for i in range(0, 32, 8))


def hex_raw(text: str) -> bytes:
    return b"".join(bytes.fromhex(text[i : i + 16])[::-1] for i in range(0, 64, 16))


def chunk_boundaries(xorb: bytes) -> list[int]:
    """Stored offsets [0, end of chunk 0, ...]: hf_xet uploads a xorb's chunks only, no footer
    (xet_data/src/processing/file_upload_session.rs: "XORBs are sent without footer")."""
    offsets, at = [0], 0
    while at < len(xorb):
        compressed = int.from_bytes(xorb[at + 1 : at + 4], "little")
        at += 8 + compressed
        offsets.append(at)
    if at != len(xorb):
        raise ValueError("xorb chunks overrun the body")
    return offsets


def xorb_footer(
    xorb: str, chunk_hashes: tuple[str, ...], stored: list[int], unpacked: tuple[int, ...]
) -> bytes:
    """The footer the CAS keeps after a xorb's chunks (xorb_object_format.rs `XorbObjectInfoV1::
    serialize` + trailing u32 length), built from the shard's chunk list as the server does."""
    n = len(chunk_hashes)
    ends = [sum(unpacked[: i + 1]) for i in range(n)]
    hashes = b"".join(hex_raw(h) for h in chunk_hashes)
    head = b"XETBLOB" + b"\x01" + hex_raw(xorb)
    hash_section = b"XBLBHSH" + b"\x00" + struct.pack("<I", n) + hashes
    boundary_section = b"XBLBBND" + b"\x01" + struct.pack(f"<I{n}I{n}I", n, *stored[1:], *ends)
    tail_len = 4 * 3 + 16
    boundary_from_end = len(boundary_section) + tail_len
    hashes_from_end = len(hash_section) + boundary_from_end
    info = (
        head
        + hash_section
        + boundary_section
        + struct.pack("<III", n, hashes_from_end, boundary_from_end)
        + bytes(16)
    )
    return info + struct.pack("<I", len(info))


@dataclass(frozen=True)
class Segment:
    xorb: str
    unpacked: int
    start: int
    end: int


@dataclass(frozen=True)
class XorbChunks:
    xorb: str
    chunk_hashes: tuple[str, ...]
    unpacked_sizes: tuple[int, ...]


@dataclass(frozen=True)
class Shard:
    files: dict[str, tuple[Segment, ...]]
    xorbs: tuple[XorbChunks, ...]


def parse_shard(data: bytes) -> Shard:
    if data[:32] != SHARD_TAG:
        raise ValueError("not a shard (wrong tag)")
    at = 48
    files: dict[str, tuple[Segment, ...]] = {}
    while data[at : at + 32] != BOOKEND:
        file_hash = hash_hex(data[at : at + 32])
        flags, n = struct.unpack("<II", data[at + 32 : at + 40])
        at += ENTRY
        segments = []
        for _ in range(n):
            xorb = hash_hex(data[at : at + 32])
            _flags, unpacked, start, end = struct.unpack("<IIII", data[at + 32 : at + 48])
            segments.append(Segment(xorb, unpacked, start, end))
            at += ENTRY
        at += ENTRY * (n if flags & FLAG_VERIFICATION else 0) + ENTRY * (
            1 if flags & FLAG_METADATA_EXT else 0
        )
        files[file_hash] = tuple(segments)
    at += ENTRY
    xorbs = []
    while at < len(data) and data[at : at + 32] != BOOKEND:
        xorb = hash_hex(data[at : at + 32])
        _flags, n = struct.unpack("<II", data[at + 32 : at + 40])
        at += ENTRY
        hashes, sizes = [], []
        for _ in range(n):
            hashes.append(hash_hex(data[at : at + 32]))
            sizes.append(struct.unpack("<I", data[at + 36 : at + 40])[0])
            at += ENTRY
        xorbs.append(XorbChunks(xorb, tuple(hashes), tuple(sizes)))
    return Shard(files, tuple(xorbs))
