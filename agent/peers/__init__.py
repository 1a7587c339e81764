"""Peer-to-peer distribution: agents serve their copies (Ready, or parts written so far) to others.

`auth` mints this Pod's per-node tokens and `identity` checks them, `protocol` is
the wire (paths, headers, the signed proof of each request; `replay` answers each
once), `server` serves
manifest-listed files of complete caches and journaled parts of downloads in
flight (`inflight`), `source` fetches byte ranges from peers
for the downloader (origin fallback per range), `peering` finds peers through
ModelCacheNode status and decides who goes to the origin first.
"""
