"""Xet format core: decode and verify what a Xet CAS serves, before any byte is trusted.

Pure code (no I/O): the Hugging Face origin fetches, this package judges. It parses a file's
reconstruction (`reconstruction.py`), splits a fetched xorb byte range into chunks and
decompresses each by its scheme (`chunks.py`), reads a xorb's footer for its chunk hashes
(`footer.py`), hashes chunks, xorbs and files the way Xet does (`hashing.py`) and assembles a
file from its terms, checking every size a server states against the format's bounds and the
result against the file's Xet hash (`assemble.py`). Every refusal is one `XetFormatError` whose
message names the cause.

Why its own package and not `origins/huggingface`: Xet is a storage protocol, not a source kind.
The Hugging Face origin (issue 39's `agent/download/origins/`) will use it, and so will the chunk
store and peers (issue 40 items 2 and 3), which hold xorb ranges by hash whatever file asked.

Authority: hf-xet 1.8.0, the release pinned in pyproject.toml (its PyPI sdist carries the
xet-core crates of that release; the stored xet-core mirror's newest snapshot is commit
af1a3ff9, hf_xet 1.6.0, and agrees on every file cited here), and the public protocol
description at https://huggingface.co/docs/xet/ (hashing, xorb, file-reconstruction, api).
"""

from praesto.agent.download.origins.huggingface.xet.assemble import assemble_file, verify_chunks
from praesto.agent.download.origins.huggingface.xet.chunks import Chunk, decode_range
from praesto.agent.download.origins.huggingface.xet.errors import XetFormatError
from praesto.agent.download.origins.huggingface.xet.footer import XorbFooter, parse_footer
from praesto.agent.download.origins.huggingface.xet.hashing import chunk_hash, file_hash, xorb_hash
from praesto.agent.download.origins.huggingface.xet.reconstruction import (
    FetchRange,
    Reconstruction,
    Term,
    parse_reconstruction,
)

__all__ = [
    "Chunk",
    "FetchRange",
    "Reconstruction",
    "Term",
    "XetFormatError",
    "XorbFooter",
    "assemble_file",
    "chunk_hash",
    "decode_range",
    "file_hash",
    "parse_footer",
    "parse_reconstruction",
    "verify_chunks",
    "xorb_hash",
]
