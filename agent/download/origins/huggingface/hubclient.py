"""The Hugging Face metadata client's connections under the egress rule (egress.py).

`huggingface_hub` sends every metadata request through one shared `httpx2.Client` that follows
redirects (utils/_http.py `default_client_factory`, huggingface_hub 2.4.0). The Hub endpoint is
the platform's (HF_ENDPOINT, trusted as configured), but where it redirects is not, so the
client this module installs (`set_client_factory`) opens each TCP connection through
`egress.connect` with the rule of the plan running on this thread (`applied`): the addresses a
name resolves to are checked and only those are dialled. httpx2 drops `Authorization` on a
redirect to another origin itself (`_client.py` `_redirect_headers`). Outside `applied` (no
plan: anything else in the process using the library) connections are opened as before.
Through a proxy the target is checked as written, per hop, by the request hook (the proxy
resolves names).
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import httpcore2
import httpx2
from httpcore2._backends.sync import SyncBackend, SyncStream  # the library's own TCP stream
from huggingface_hub.utils import _http as hf_http
from praesto.agent.download.egress import EgressPolicy, connect

_POLICY: ContextVar[EgressPolicy | None] = ContextVar("praesto_egress", default=None)


@contextmanager
def applied(policy: EgressPolicy) -> Iterator[None]:
    """Metadata requests made inside run under `policy` (a ContextVar: per thread)."""
    token = _POLICY.set(policy)
    try:
        yield
    finally:
        _POLICY.reset(token)


class GuardedBackend(SyncBackend):
    """httpcore2's sync backend, with the TCP connect of `egress.connect` under the active rule."""

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.NetworkStream:
        policy = _POLICY.get()
        if policy is None:
            return super().connect_tcp(host, port, timeout, local_address, socket_options)
        source = None if local_address is None else (local_address, 0)
        try:
            sock = connect(host, port, timeout, source, policy)
        except TimeoutError as error:
            raise httpcore2.ConnectTimeout(str(error)) from None
        except OSError as error:
            raise httpcore2.ConnectError(str(error)) from None
        for option in socket_options or ():
            sock.setsockopt(*option)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return SyncStream(sock)


def _check_hop(request: httpx2.Request) -> None:
    """Each request, redirects included: a target written as a refused address is refused even
    when a proxy would resolve it (direct connections are decided at connect time)."""
    policy = _POLICY.get()
    if policy is not None:
        policy.check_literal(
            request.url.host, request.url.port or (80 if request.url.scheme == "http" else 443)
        )


def client_factory() -> httpx2.Client:
    """huggingface_hub's default client (utils/_http.py `default_client_factory`), guarded."""
    transport = httpx2.HTTPTransport()
    transport._pool._network_backend = GuardedBackend()  # httpcore2 ConnectionPool's backend
    return httpx2.Client(
        event_hooks={"request": [_check_hop, hf_http.hf_request_event_hook]},
        follow_redirects=True,
        timeout=None,
        transport=transport,
    )


def install() -> None:
    """Make `client_factory` the library's (called where hfplan imports huggingface_hub)."""
    hf_http.set_client_factory(client_factory)
