"""HTTP to one peer: each request signed (protocol.py), "not yet" told apart, deadlines, prefixes.

`PeerSource` (source.py) decides whom to ask for what; this is how one answer is read.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from praesto.agent.download.api import Sink, Target
from praesto.agent.download.http import Transient, Transport, retry_after
from praesto.agent.peers import auth
from praesto.agent.peers.protocol import ACCEPT_PREFIX_HEADER, NOT_YET, WRITTEN_HEADER


class Slow(Exception):
    """A peer sent too slowly for the range's deadline."""


class NotYet(Exception):
    """The peer is still downloading and has not written that range (HTTP 425)."""

    def __init__(self, written: str, retry_after: float | None) -> None:
        super().__init__(f"not written yet ({written} bytes so far)")
        self.written = written
        self.retry_after = retry_after


class PeerTransport(Transport):
    """`Transport` that authenticates each request with this Pod's token for the target node's
    audience and signs it (`node_of` maps a peer address to its node): every attempt, a stale
    socket's retry included, gets a new nonce. Tells 425 "not yet" apart from every other
    refusal (which drops the peer)."""

    def __init__(
        self,
        credentials: auth.Credentials,
        timeout: float,
        node_of: Callable[[str], str],
        proxies: Mapping[str, str] | None = None,
    ) -> None:
        # Peers are other nodes' agents at the addresses the platform's own objects give: not a
        # tenant's origin, so not under the egress rule (download/egress.py).
        super().__init__("http://peer.invalid", None, timeout=timeout, proxies=proxies, egress=None)
        self.credentials = credentials
        self.node_of = node_of
        self._deadline = threading.local()  # of the range being fetched on this thread (fetch_by)
        self._served = threading.local()  # where the answer on this thread ends (a prefix: before the range)
        self._method = threading.local()  # of the request being sent on this thread (it is signed)

    def _headers(self, url: str, authorized: bool, extra: dict[str, str]) -> dict[str, str]:
        headers = super()._headers(url, authorized, extra)
        parts = urlsplit(url)
        path = parts.path + (f"?{parts.query}" if parts.query else "")  # as the base request sends it
        try:
            target = self.node_of(parts.netloc)
            headers.update(self.credentials.sign(target, self._method.value, path, headers))
        except auth.TokenError as err:
            raise Transient(str(err)) from None  # this peer is dropped; the origin serves
        return headers

    def fetch_by(
        self, deadline: float, target: Target, start: int, end: int, sink: Sink, cancel: threading.Event
    ) -> int:
        """`fetch`, cut with `Slow` at `deadline` even while bytes still trickle in: the socket
        timeout bounds only each read, and the base loop fills a whole chunk before its sink.
        A peer still receiving the range may answer with the prefix it has written: then fewer
        bytes than asked are returned, without an error, and the caller asks again for the rest."""
        self._deadline.value = deadline
        self._served.value = None
        delivered = [0]

        def counted(offset: int, chunk: memoryview) -> None:
            sink(offset, chunk)
            delivered[0] += len(chunk)

        try:
            return self.fetch(target, start, end, counted, cancel, {ACCEPT_PREFIX_HEADER: "1"})
        except Transient:
            served = self._served.value
            if served is not None and served < end and start + delivered[0] == served:
                return delivered[0]  # the whole prefix it announced: the rest is still arriving there
            raise
        finally:
            self._deadline.value = None
            self._served.value = None

    def request(
        self,
        method: str,
        url: str,
        *,
        authorized: bool,
        headers: dict[str, str] | None = None,
        body: bytes | None = None,
    ) -> http.client.HTTPResponse:
        self._method.value = method
        resp = super().request(method, url, authorized=authorized, headers=headers, body=body)
        if resp.status == NOT_YET:
            resp.read()  # small body: the connection stays usable
            raise NotYet(resp.getheader(WRITTEN_HEADER, ""), retry_after(resp.getheader("Retry-After")))
        if resp.status == 206:
            self._served.value = _range_end(resp.getheader("Content-Range", ""))
        deadline: float | None = getattr(self._deadline, "value", None)
        if deadline is not None:

            def readinto_by_deadline(buffer: Any) -> int:
                """At most one socket read per call (a buffered readinto waits for the whole
                chunk, one trickled byte at a time), and none after the deadline."""
                if time.monotonic() > deadline:
                    raise Slow()
                data = resp.read1(len(buffer))
                memoryview(buffer)[: len(data)] = data
                return len(data)

            resp.readinto = readinto_by_deadline  # type: ignore[method-assign,assignment]
        return resp


def _range_end(content_range: str) -> int | None:
    """The end (exclusive) of a `bytes a-b/size` Content-Range; None when it says otherwise."""
    unit, _, rest = content_range.partition(" ")
    span = rest.partition("/")[0]
    first, _, last = span.partition("-")
    if unit != "bytes" or not first.isdigit() or not last.isdigit():
        return None
    return int(last) + 1
