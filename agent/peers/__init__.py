"""Peer-to-peer distribution: agents serve their copies (Ready, or parts written so far) to others.

`auth` signs and checks requests with the chart's shared secret, `server` serves
manifest-listed files of complete caches and journaled parts of downloads in
flight (`inflight`), `source` fetches byte ranges from peers
for the downloader (origin fallback per range), `peering` finds peers through
ModelCacheNode status and decides who goes to the origin first.
"""
