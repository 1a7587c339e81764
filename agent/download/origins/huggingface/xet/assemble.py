"""Assemble a file from its reconstruction and the fetched xorb ranges; nothing passes unverified.

Each fetched range is split into chunks and decoded (`chunks.decode_range`); a chunk whose xorb's
footer is known is checked against the footer's hash for it, naming the chunk on a mismatch; each
term must unpack to the length the reconstruction stated; the file's Xet hash (the merkle root of
every chunk, `hashing.file_hash`) must equal the hash the file was asked for. The caller still
checks the Hub's sha256 before publishing (issue 40 item 1): this is the first gate, not the last.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from praesto.agent.download.origins.huggingface.xet.chunks import Chunk, decode_range
from praesto.agent.download.origins.huggingface.xet.errors import XetFormatError
from praesto.agent.download.origins.huggingface.xet.footer import XorbFooter
from praesto.agent.download.origins.huggingface.xet.hashing import file_hash, from_hex, to_hex
from praesto.agent.download.origins.huggingface.xet.reconstruction import FetchRange, Reconstruction, Term

Fetch = Callable[[FetchRange], bytes]


class Held(Protocol):
    """A local store of chunks (the node's chunk store): what it holds of a term, and what was fetched."""

    def chunks(self, term: Term) -> list[Chunk] | None:
        """The term's chunks, each checked against its hash, or None to fetch them."""

    def keep(self, source: FetchRange, raw: bytes, chunks: list[Chunk]) -> None:
        """A fetched range, `raw` as served and `chunks` decoded from it (not yet verified by the file)."""

    def used(self, term: Term, chunks: list[Chunk]) -> None:
        """The term's chunks, held or fetched, in file order (what a verified file's index lists)."""


def verify_chunks(chunks: list[Chunk], footer: XorbFooter) -> None:
    """Every chunk's hash is the one the xorb's footer lists at its index."""
    for chunk in chunks:
        if chunk.index >= len(footer.chunk_hashes):
            raise XetFormatError(
                f"chunk {chunk.index} is outside xorb {to_hex(footer.xorb_hash)} "
                f"({len(footer.chunk_hashes)} chunks)"
            )
        if chunk.hash != footer.chunk_hashes[chunk.index]:
            raise XetFormatError(
                f"chunk {chunk.index} of xorb {to_hex(footer.xorb_hash)}: its bytes hash to "
                f"{to_hex(chunk.hash)}, the xorb lists {to_hex(footer.chunk_hashes[chunk.index])}"
            )


def iter_file(
    recon: Reconstruction,
    fetch: Fetch,
    expected_hash: str,
    footers: Mapping[str, XorbFooter] | None = None,
    held: Held | None = None,
) -> Iterator[bytes]:
    """The file's bytes chunk by chunk, in order; raises before the last term's first piece if
    anything fails to verify, so a consumer that publishes only after exhausting the iterator
    publishes only verified files. One fetched range is held at a time: the previous one is let go
    before the next is fetched (`fetch` may count ranges against a memory budget: xetmemory.py).

    `held`: a local store asked for each term's chunks before fetching, and given what was fetched;
    its chunks count in the file's hash exactly like fetched ones."""
    footers = footers or {}
    if not recon.terms:  # an empty file: no chunks, and its Xet hash is 32 zero bytes
        if from_hex(expected_hash) != file_hash([]):
            raise XetFormatError(f"an empty reconstruction for {expected_hash}, which is not the empty file")
        return
    decoded: dict[FetchRange, list[Chunk]] = {}
    leaves: list[tuple[bytes, int]] = []
    for term in recon.terms:
        footer = footers.get(term.xorb)
        if footer is not None and term.end > len(footer.chunk_hashes):
            raise XetFormatError(
                f"reconstruction names chunks [{term.start}, {term.end}) of xorb {term.xorb}, "
                f"which has {len(footer.chunk_hashes)}: outside the xorb"
            )
        source = recon.fetch_for(term)
        local = held.chunks(term) if held is not None else None
        if local is not None:
            chunks = local
        else:
            if source not in decoded:
                decoded.clear()  # terms arrive in file order: the previous range is done with
                raw = fetch(source)
                chunks = decode_range(raw, source.start, source.end - source.start, term.xorb)
                if footer is not None:
                    verify_chunks(chunks, footer)
                if held is not None:
                    held.keep(source, raw, chunks)
                decoded[source] = chunks
                del raw  # what `held.keep` needed of it is written; the chunks are what is left
            chunks = decoded[source][term.start - source.start : term.end - source.start]
        size = sum(len(c.data) for c in chunks)
        if size != term.unpacked_length:
            raise XetFormatError(
                f"chunks [{term.start}, {term.end}) of xorb {term.xorb} unpack to {size} bytes, "
                f"the reconstruction said {term.unpacked_length}"
            )
        leaves.extend((c.hash, len(c.data)) for c in chunks)
        if held is not None:
            held.used(term, chunks)
        if term is recon.terms[-1]:
            got = file_hash(leaves)
            if got != from_hex(expected_hash):
                raise XetFormatError(
                    f"the assembled file hashes to {to_hex(got)}, not {expected_hash}: refused"
                )
        for chunk in chunks:
            yield chunk.data
        del chunks


def assemble_file(
    recon: Reconstruction, fetch: Fetch, expected_hash: str, footers: Mapping[str, XorbFooter] | None = None
) -> bytes:
    return b"".join(iter_file(recon, fetch, expected_hash, footers))
