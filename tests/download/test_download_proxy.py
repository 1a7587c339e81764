"""Byte fetches honour HTTPS_PROXY/HTTP_PROXY/NO_PROXY by CONNECT tunnelling (http.client does not)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from praesto.agent.download.http import Transport, proxy_for

from testkit.connect_proxy import connect_proxy
from testkit.hub import LocalHub


def test_fetch_goes_through_the_proxy_unless_no_proxy_spares_the_host(
    hub: LocalHub, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    hub.add_repo("org/m", {"a.bin": b"x" * 100_000})
    url = f"{hub.endpoint}/org/m/resolve/main/a.bin"
    for name in ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    with connect_proxy() as (proxy, tunnels):
        monkeypatch.setenv("HTTP_PROXY", proxy)
        got = bytearray()
        transport = Transport(hub.endpoint, None)
        target = transport.resolve(url)
        transport.fetch(target, 0, 100_000, lambda o, c: got.extend(c), threading.Event())
        transport.close()
        assert bytes(got) == b"x" * 100_000
        assert tunnels and tunnels[0] == hub.endpoint.removeprefix("http://")

        monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
        before = len(tunnels)
        assert proxy_for("http", hub.endpoint.removeprefix("http://")) is None
        direct = Transport(hub.endpoint, None)
        direct.fetch(direct.resolve(url), 0, 10, lambda o, c: None, threading.Event())
        direct.close()
        assert len(tunnels) == before
