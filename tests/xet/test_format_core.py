"""Praesto's Xet format core rebuilds every file hf_xet uploaded to the double, from the double's
reconstruction and xorb ranges, verifying each chunk and the file's Xet hash; it refuses corrupt
ranges naming the chunk, ranges outside the xorb and chunks claiming more than the format allows."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest
from praesto.agent.download.origins.huggingface.xet import (
    FetchRange,
    XetFormatError,
    XorbFooter,
    assemble_file,
    decode_range,
    parse_footer,
    parse_reconstruction,
)
from praesto.agent.download.origins.huggingface.xet.hashing import from_hex
from praesto.agent.download.origins.huggingface.xet.limits import MAX_CHUNK_SIZE, MAX_XORB_BYTES

from tests.xet.conftest import Repo


def reconstruction_doc(repo: Repo, name: str, version: int = 2) -> Any:
    token, _ = repo.double.token()
    request = urllib.request.Request(
        f"{repo.double.url}/v{version}/reconstructions/{repo.uploaded[name].hash}",
        headers={"Authorization": f"Bearer {token}"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.load(answer)


def fetch(source: FetchRange) -> bytes:
    request = urllib.request.Request(source.url, headers={"Range": source.range_header})
    with urllib.request.urlopen(request, timeout=10) as answer:
        data: bytes = answer.read()
        return data


def footers(repo: Repo, doc: Any) -> dict[str, XorbFooter]:
    """Each xorb's footer, read from the whole xorb object the presigned URL names."""
    out = {}
    for xorb, entries in doc.get("xorbs", doc.get("fetch_info", {})).items():
        with urllib.request.urlopen(entries[0]["url"], timeout=10) as answer:
            out[xorb] = parse_footer(answer.read(), from_hex(xorb))
    return out


@pytest.mark.parametrize("version", [1, 2])
def test_every_uploaded_file_is_rebuilt_byte_identical_and_verified(repo: Repo, version: int) -> None:
    for name, data in repo.files.items():
        doc = reconstruction_doc(repo, name, version)
        recon = parse_reconstruction(doc, len(data))
        expected = repo.uploaded[name].hash
        assert assemble_file(recon, fetch, expected) == data, name
        assert assemble_file(recon, fetch, expected, footers(repo, doc)) == data, name


def test_the_chunks_use_every_compression_scheme(repo: Repo) -> None:
    schemes = set()
    for name in ("weights.f32", "notes.txt", "shard-a.bin"):
        recon = parse_reconstruction(reconstruction_doc(repo, name), len(repo.files[name]))
        for fetches in recon.fetches.values():
            for source in fetches:
                data = fetch(source)
                decode_range(data, source.start, source.end - source.start)
                at = 0
                while at < len(data):
                    schemes.add(data[at + 4])
                    at += 8 + int.from_bytes(data[at + 1 : at + 4], "little")
    assert schemes == {0, 1, 2}, schemes  # none, lz4, bg4-lz4


def test_a_flipped_byte_in_a_xorb_range_is_refused_naming_the_chunk(repo: Repo) -> None:
    name = "shard-a.bin"
    doc = reconstruction_doc(repo, name)
    known = footers(repo, doc)  # read before the fault: what a chunk store or an earlier fetch holds
    recon = parse_reconstruction(doc, len(repo.files[name]))
    term = recon.terms[0]
    footer = known[term.xorb]
    chunk = term.start + 3
    first, _ = footer.byte_range(chunk, chunk + 1)
    repo.double.store.flip_byte(term.xorb, first + 100)
    try:
        with pytest.raises(XetFormatError, match=rf"chunk {chunk} of xorb {term.xorb}"):
            assemble_file(recon, fetch, repo.uploaded[name].hash, known)
        with pytest.raises(XetFormatError, match="refused"):  # without the footer, the file hash refuses it
            assemble_file(recon, fetch, repo.uploaded[name].hash)
    finally:
        repo.double.store.flip_byte(term.xorb, first + 100)


def test_a_reconstruction_naming_chunks_outside_the_xorb_is_refused(repo: Repo) -> None:
    name = "config.json"
    doc = reconstruction_doc(repo, name)
    known = footers(repo, doc)
    xorb = doc["terms"][0]["hash"]
    chunks = len(known[xorb].chunk_hashes)
    doc["terms"][0]["range"] = {"start": chunks, "end": chunks + 1}
    doc["xorbs"][xorb][0]["ranges"][0]["chunks"] = {"start": chunks, "end": chunks + 1}
    recon = parse_reconstruction(doc, len(repo.files[name]))
    with pytest.raises(XetFormatError, match="outside the xorb"):
        assemble_file(recon, fetch, repo.uploaded[name].hash, known)

    doc["terms"][0]["range"] = {"start": 0, "end": 9000}
    with pytest.raises(XetFormatError, match=r"terms\[0\]\.range \[0, 9000\) is outside a xorb"):
        parse_reconstruction(doc, len(repo.files[name]))


def test_claims_over_the_formats_bounds_are_refused_before_decoding() -> None:
    header = bytes([0]) + (100).to_bytes(3, "little") + bytes([0]) + (200_000).to_bytes(3, "little")
    with pytest.raises(
        XetFormatError, match=r"chunk 7 of xorb x: claims 200000 bytes, the format allows 1\.\.131072"
    ):
        decode_range(header + bytes(100), 7, 1, "x")
    header = bytes([0]) + (300_000).to_bytes(3, "little") + bytes([1]) + (1000).to_bytes(3, "little")
    with pytest.raises(XetFormatError, match="claims 300000 stored bytes"):
        decode_range(header, 0, 1, "x")
    xorb = "ab" * 32
    term = {"hash": xorb, "unpacked_length": 10, "range": {"start": 0, "end": 1}}
    fetches = {
        xorb: [
            {
                "url": "http://cas/x",
                "ranges": [{"chunks": {"start": 0, "end": 1}, "bytes": {"start": 0, "end": 9}}],
            }
        ]
    }
    with pytest.raises(XetFormatError, match="terms add up to 20 bytes, the file has 25"):
        parse_reconstruction({"terms": [term, term], "xorbs": fetches}, 25)
    with pytest.raises(XetFormatError, match=r"terms add up past the file's 15 bytes at terms\[1\]"):
        parse_reconstruction({"terms": [term, term], "xorbs": fetches}, 15)
    with pytest.raises(XetFormatError, match="claims 131073 bytes from 1 chunks"):
        parse_reconstruction({"terms": [term | {"unpacked_length": 131073}], "xorbs": fetches}, 131073)
    big = {
        xorb: [
            {
                "url": "http://cas/x",
                "ranges": [{"chunks": {"start": 0, "end": 1}, "bytes": {"start": 0, "end": 999_999}}],
            }
        ]
    }
    with pytest.raises(XetFormatError, match="longer than 1 chunks can be"):
        parse_reconstruction({"terms": [term], "xorbs": big}, 10)


def test_a_range_claiming_more_than_a_xorb_holds_stops_before_decoding_past_it() -> None:
    """8192 chunks of 128 KiB would decode to 1 GiB: a range stops at a xorb's 64 MiB of chunk data."""
    plain = bytes(MAX_CHUNK_SIZE)
    chunk = (
        bytes([0]) + len(plain).to_bytes(3, "little") + bytes([0]) + len(plain).to_bytes(3, "little") + plain
    )
    count = MAX_XORB_BYTES // MAX_CHUNK_SIZE + 1
    with pytest.raises(XetFormatError, match=rf"chunk {count - 1} of xorb x: the range's chunks claim more"):
        decode_range(chunk * count, 0, count, "x")
    assert len(decode_range(chunk * (count - 1), 0, count - 1, "x")) == count - 1
