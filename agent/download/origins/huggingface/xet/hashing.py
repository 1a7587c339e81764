"""Xet hashes: chunk, xorb and file hashes, and their hex form.

xet_core_structures/src/merklehash/data_hash.rs (hf-xet 1.8.0): a chunk's hash is BLAKE3 keyed
with DATA_KEY over its bytes; an inner node is BLAKE3 keyed with INTERNAL_NODE_HASH over lines
"<child hex> : <child size>\\n". aggregated_hashes.rs: children are merged in groups cut after a
hash whose last 64-bit word is 0 mod 4 (from the third entry on, at most 9 per group) until one
node is left; a xorb's hash is that root, a file's hash is the root keyed again with 32 zero
bytes. The hex form prints the four little-endian 64-bit words, each as 16 hex digits (so each
8-byte group appears byte-reversed). https://huggingface.co/docs/xet/hashing says the same.

BLAKE3 comes from PyPI `blake3` (the official Rust crate's Python binding, the same code hf_xet
runs), not a hand-written one.
"""

from __future__ import annotations

import blake3
from praesto.agent.download.origins.huggingface.xet.errors import XetFormatError

DATA_KEY = bytes(
    [102, 151, 245, 119, 91, 149, 80, 222, 49, 53, 203, 172, 165, 151, 24, 28,
     157, 228, 33, 16, 155, 235, 43, 88, 180, 208, 176, 75, 147, 173, 242, 41]
)  # fmt: skip
INTERNAL_NODE_KEY = bytes(
    [1, 126, 197, 199, 165, 71, 41, 150, 253, 148, 102, 102, 180, 138, 2, 230,
     93, 221, 83, 111, 55, 199, 109, 210, 248, 99, 82, 230, 74, 83, 113, 63]
)  # fmt: skip
FILE_SALT = bytes(32)
BRANCHING = 4
MAX_GROUP = 2 * BRANCHING + 1

HashAndSize = tuple[bytes, int]


def to_hex(raw: bytes) -> str:
    """The Xet hex form of a 32-byte hash (each 8-byte word printed as a little-endian u64)."""
    return "".join(raw[i : i + 8][::-1].hex() for i in range(0, 32, 8))


def from_hex(text: str) -> bytes:
    """The 32 raw bytes a Xet hex hash names; refuses anything but 64 hex digits."""
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
        raise XetFormatError(f"not a Xet hash (64 lowercase hex digits): {text[:80]!r}")
    return b"".join(bytes.fromhex(text[i : i + 16])[::-1] for i in range(0, 64, 16))


def chunk_hash(data: bytes) -> bytes:
    return blake3.blake3(data, key=DATA_KEY).digest()


def _last_word_mod(raw: bytes) -> int:
    return int.from_bytes(raw[24:32], "little") % BRANCHING


def _next_cut(nodes: list[HashAndSize], start: int) -> int:
    """End (exclusive) of the group starting at `start` (aggregated_hashes.rs `next_merge_cut`)."""
    remaining = len(nodes) - start
    if remaining <= 2:
        return len(nodes)
    end = min(MAX_GROUP, remaining)
    for i in range(2, end):
        if _last_word_mod(nodes[start + i][0]) == 0:
            return start + i + 1
    return start + end


def _merge(group: list[HashAndSize]) -> HashAndSize:
    text = "".join(f"{to_hex(h)} : {size}\n" for h, size in group)
    digest = blake3.blake3(text.encode(), key=INTERNAL_NODE_KEY).digest()
    return digest, sum(size for _, size in group)


def merkle_root(chunks: list[HashAndSize]) -> bytes:
    """The aggregated hash of (hash, size) leaves; 32 zero bytes for none."""
    if not chunks:
        return bytes(32)
    level = list(chunks)
    while len(level) > 1:
        merged: list[HashAndSize] = []
        start = 0
        while start < len(level):
            cut = _next_cut(level, start)
            merged.append(_merge(level[start:cut]))
            start = cut
        level = merged
    return level[0][0]


def xorb_hash(chunks: list[HashAndSize]) -> bytes:
    return merkle_root(chunks)


def file_hash(chunks: list[HashAndSize]) -> bytes:
    """A file's Xet hash: the merkle root of its chunks keyed once more with the (zero) salt."""
    if not chunks:
        return bytes(32)
    return blake3.blake3(merkle_root(chunks), key=FILE_SALT).digest()
