"""Bounds the Xet format sets on every size a server states.

xet_core_structures/src/xorb_object/constants.rs (hf-xet 1.8.0): chunks target 64 KiB and are at
most TARGET_CHUNK_SIZE * MAXIMUM_CHUNK_MULTIPLIER = 128 KiB uncompressed; a xorb holds at most
64 MiB and 8 Ki chunks. xorb_chunk_format.rs `XorbChunkHeader::validate` allows a compressed
length up to twice the maximum chunk size (what LZ4 may emit for incompressible data before the
writer falls back to storing it plain). The chunk header's length fields are 3 bytes.
"""

from __future__ import annotations

MAX_CHUNK_SIZE = 128 * 1024
# TARGET_CHUNK_SIZE / MINIMUM_CHUNK_DIVISOR (8): the smallest chunk hf_xet's chunker cuts, a file's
# last chunk aside ("a recommendation, not a threshold": a server may name smaller ones)
MIN_CHUNK_SIZE = 8 * 1024
MAX_COMPRESSED_CHUNK_SIZE = 2 * MAX_CHUNK_SIZE
MAX_XORB_BYTES = 64 * 1024 * 1024
MAX_XORB_CHUNKS = 8 * 1024
CHUNK_HEADER_SIZE = 8
# MAX_XORB_BYTES bounds a xorb's chunk data, not its serialized form (deduplication/src/
# data_aggregator.rs `num_bytes`: the chunks' bytes, cut at MAX_XORB_BYTES); on the wire each chunk
# also has its header, and an incompressible chunk is stored plain, so its byte ranges reach past
# 64 MiB by up to a header per chunk (hf_xet 1.8.0 writes 67,117,351 bytes for 64 MiB of random data).
MAX_XORB_STORED_BYTES = MAX_XORB_BYTES + MAX_XORB_CHUNKS * CHUNK_HEADER_SIZE
CHUNK_HEADER_VERSION = 0
# The reconstruction answer is JSON listing terms of at most one xorb's chunks each: a file of
# size S needs about S / 64 KiB chunks, and a term covers >= 1 of them. 64 MiB of JSON bounds a
# multi-terabyte file's answer; more is refused unread by the caller that fetches it.
MAX_RECONSTRUCTION_JSON_BYTES = 64 * 1024 * 1024
