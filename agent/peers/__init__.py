"""Peer-to-peer distribution: agents with a Ready copy serve it to agents still downloading.

`auth` signs and checks requests with the chart's shared secret, `server` serves
manifest-listed files of complete caches, `source` fetches byte ranges from peers
for the downloader (origin fallback per range), `peering` finds peers through
ModelCacheNode status and decides who goes to the origin first.
"""
