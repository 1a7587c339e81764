"""A local Xet CAS (test double) that the real hf_xet client uploads to and downloads from.

`server.py` speaks the CAS endpoints and serves "presigned" xorb ranges and tokens; `store.py`
holds xorbs, files, tokens and counters; `formats.py` reads the xorb and shard bytes hf_xet
uploads; `client.py` runs the real client (PyPI hf-xet 1.8.0) against it in a child process.
Faults for Praesto's downloader: `store.expire_tokens()` (401 until refreshed),
`store.flip_byte(xorb, offset)` (a corrupt range), reconstructions built by hand.
"""

from testkit.xet.client import HfXet, Uploaded
from testkit.xet.server import XetDouble, running_double

__all__ = ["HfXet", "Uploaded", "XetDouble", "running_double"]
