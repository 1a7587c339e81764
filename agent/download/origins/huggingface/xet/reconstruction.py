"""Parse a file's reconstruction as the CAS answers it (v1 or v2), refusing any out-of-bounds claim.

xet_client/src/cas_types/mod.rs (hf-xet 1.8.0): `GET /v1/reconstructions/<file hash>` answers
`QueryReconstructionResponse` {offset_into_first_range, terms: [{hash, unpacked_length, range:
{start, end}}], fetch_info: {xorb hash: [{range: {start, end}, url, url_range: {start, end}}]}};
`GET /v2/reconstructions/<file hash>` answers `QueryReconstructionResponseV2`, the same but
`xorbs: {xorb hash: [{url, ranges: [{chunks: {start, end}, bytes: {start, end}}]}]}`. Chunk
ranges are end-exclusive, byte ranges end-inclusive (they are HTTP Range values; the client must
send exactly them, remote_client.rs `get_file_term_data`). A file is its terms' chunks in order;
each term names the fetch whose chunk range covers it. https://huggingface.co/docs/xet/api and
.../file-reconstruction describe the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from praesto.agent.download.origins.huggingface.xet.errors import XetFormatError
from praesto.agent.download.origins.huggingface.xet.hashing import from_hex
from praesto.agent.download.origins.huggingface.xet.limits import (
    CHUNK_HEADER_SIZE,
    MAX_CHUNK_SIZE,
    MAX_COMPRESSED_CHUNK_SIZE,
    MAX_XORB_CHUNKS,
    MAX_XORB_STORED_BYTES,
)


@dataclass(frozen=True)
class Term:
    """Chunks [start, end) of xorb `xorb` (hex), which unpack to `unpacked_length` bytes of the file."""

    xorb: str
    start: int
    end: int
    unpacked_length: int


@dataclass(frozen=True)
class FetchRange:
    """One HTTP fetch: `url` with `Range: bytes=<first_byte>-<last_byte>` yields chunks [start, end) of `xorb`."""

    xorb: str
    start: int
    end: int
    url: str
    first_byte: int
    last_byte: int

    @property
    def range_header(self) -> str:
        return f"bytes={self.first_byte}-{self.last_byte}"

    @property
    def length(self) -> int:
        return self.last_byte - self.first_byte + 1


@dataclass(frozen=True)
class Reconstruction:
    terms: tuple[Term, ...]
    fetches: Mapping[str, tuple[FetchRange, ...]]

    @property
    def size(self) -> int:
        return sum(t.unpacked_length for t in self.terms)

    def fetch_for(self, term: Term) -> FetchRange:
        for fetch in self.fetches.get(term.xorb, ()):
            if fetch.start <= term.start and term.end <= fetch.end:
                return fetch
        raise XetFormatError(f"no fetch covers chunks [{term.start}, {term.end}) of xorb {term.xorb}")


def _int(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise XetFormatError(f"reconstruction: {what} is not a non-negative integer: {str(value)[:40]!r}")
    return value


def _chunk_range(raw: Any, what: str) -> tuple[int, int]:
    if not isinstance(raw, dict):
        raise XetFormatError(f"reconstruction: {what} is not a {{start, end}} object")
    start, end = _int(raw.get("start"), f"{what}.start"), _int(raw.get("end"), f"{what}.end")
    if not start < end <= MAX_XORB_CHUNKS:
        raise XetFormatError(
            f"reconstruction: {what} [{start}, {end}) is outside a xorb (at most {MAX_XORB_CHUNKS} chunks)"
        )
    return start, end


def _fetch(xorb: str, chunks: Any, byte_range: Any, url: Any, what: str) -> FetchRange:
    start, end = _chunk_range(chunks, f"{what} chunks")
    if not isinstance(byte_range, dict):
        raise XetFormatError(f"reconstruction: {what} byte range is not a {{start, end}} object")
    first, last = (
        _int(byte_range.get("start"), f"{what} bytes.start"),
        _int(byte_range.get("end"), f"{what} bytes.end"),
    )
    most = (end - start) * (CHUNK_HEADER_SIZE + MAX_COMPRESSED_CHUNK_SIZE)
    if not first <= last < MAX_XORB_STORED_BYTES or last - first + 1 > most:
        raise XetFormatError(
            f"reconstruction: {what} bytes {first}-{last} are outside a xorb or longer than "
            f"{end - start} chunks can be ({most} bytes)"
        )
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise XetFormatError(f"reconstruction: {what} url is not an http(s) URL")
    return FetchRange(xorb, start, end, url, first, last)


def _fetches(doc: Mapping[str, Any]) -> dict[str, tuple[FetchRange, ...]]:
    out: dict[str, list[FetchRange]] = {}
    if "xorbs" in doc:  # v2
        xorbs = doc["xorbs"]
        if not isinstance(xorbs, dict):
            raise XetFormatError("reconstruction: `xorbs` is not an object")
        for xorb, entries in xorbs.items():
            from_hex(xorb)
            for i, entry in enumerate(entries if isinstance(entries, list) else [None]):
                if not isinstance(entry, dict) or not isinstance(entry.get("ranges"), list):
                    raise XetFormatError(f"reconstruction: xorbs[{xorb}][{i}] is not {{url, ranges}}")
                for j, rng in enumerate(entry["ranges"]):
                    rng = rng if isinstance(rng, dict) else {}
                    what = f"xorbs[{xorb}][{i}].ranges[{j}]"
                    out.setdefault(xorb, []).append(
                        _fetch(xorb, rng.get("chunks"), rng.get("bytes"), entry.get("url"), what)
                    )
    else:  # v1
        info = doc.get("fetch_info")
        if not isinstance(info, dict):
            raise XetFormatError("reconstruction: neither `xorbs` (v2) nor `fetch_info` (v1) is an object")
        for xorb, entries in info.items():
            from_hex(xorb)
            for i, entry in enumerate(entries if isinstance(entries, list) else [None]):
                entry = entry if isinstance(entry, dict) else {}
                what = f"fetch_info[{xorb}][{i}]"
                out.setdefault(xorb, []).append(
                    _fetch(xorb, entry.get("range"), entry.get("url_range"), entry.get("url"), what)
                )
    return {k: tuple(v) for k, v in out.items()}


def parse_reconstruction(doc: Any, file_size: int) -> Reconstruction:
    """A whole file's reconstruction, checked against the format's bounds and `file_size` (the size
    the Hub states for the file): the terms must unpack to exactly that many bytes."""
    if not isinstance(doc, dict) or not isinstance(doc.get("terms"), list):
        raise XetFormatError("reconstruction: not an object with a `terms` list")
    if _int(doc.get("offset_into_first_range", 0), "offset_into_first_range") != 0:
        raise XetFormatError("reconstruction: offset_into_first_range is not 0 for a whole-file request")
    raw_terms = doc["terms"]
    if len(raw_terms) > file_size:  # every term holds at least one byte
        raise XetFormatError(f"reconstruction: {len(raw_terms)} terms for a {file_size}-byte file")
    terms: list[Term] = []
    total = 0
    for i, raw in enumerate(raw_terms):
        raw = raw if isinstance(raw, dict) else {}
        xorb = raw.get("hash")
        if not isinstance(xorb, str):
            raise XetFormatError(f"reconstruction: terms[{i}].hash is not a string")
        from_hex(xorb)
        start, end = _chunk_range(raw.get("range"), f"terms[{i}].range")
        unpacked = _int(raw.get("unpacked_length"), f"terms[{i}].unpacked_length")
        if not end - start <= unpacked <= (end - start) * MAX_CHUNK_SIZE:
            raise XetFormatError(
                f"reconstruction: terms[{i}] claims {unpacked} bytes from {end - start} chunks "
                f"(each 1..{MAX_CHUNK_SIZE} bytes)"
            )
        total += unpacked
        if total > file_size:
            raise XetFormatError(
                f"reconstruction: terms add up past the file's {file_size} bytes at terms[{i}]"
            )
        terms.append(Term(xorb, start, end, unpacked))
    if total != file_size:
        raise XetFormatError(f"reconstruction: terms add up to {total} bytes, the file has {file_size}")
    recon = Reconstruction(tuple(terms), _fetches(doc))
    for term in terms:
        recon.fetch_for(term)
    return recon
