"""Byte fetches honour HTTPS_PROXY/HTTP_PROXY/NO_PROXY by CONNECT tunnelling (http.client does not),
taken from the environment the process edge handed in (`EngineSettings.from_environment`), not from the process
environment at the point of use (#23 item 3)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from praesto.agent.download.api import EngineSettings, Options
from praesto.agent.download.http import Transport
from praesto.agent.download.proxies import proxies_from_env, proxy_for

from testkit.connect_proxy import connect_proxy
from testkit.egress import LOOPBACK
from testkit.hub import LocalHub


def test_fetch_goes_through_the_proxy_unless_no_proxy_spares_the_host(
    hub: LocalHub, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    hub.add_repo("org/m", {"a.bin": b"x" * 100_000})
    url = f"{hub.endpoint}/org/m/resolve/main/a.bin"
    for name in ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    with connect_proxy() as (proxy, tunnels):
        got = bytearray()
        proxies = EngineSettings.from_environment({"HTTP_PROXY": proxy}).proxies  # read at the edge
        transport = Transport(hub.endpoint, None, proxies=proxies, egress=LOOPBACK)
        target = transport.resolve(url)
        transport.fetch(target, 0, 100_000, lambda o, c: got.extend(c), threading.Event())
        transport.close()
        assert bytes(got) == b"x" * 100_000
        assert tunnels and tunnels[0] == hub.endpoint.removeprefix("http://")

        spared = proxies_from_env({"HTTP_PROXY": proxy, "NO_PROXY": "127.0.0.1,localhost"})
        before = len(tunnels)
        assert proxy_for("http", hub.endpoint.removeprefix("http://"), spared) is None
        direct = Transport(hub.endpoint, None, proxies=spared, egress=LOOPBACK)
        direct.fetch(direct.resolve(url), 0, 10, lambda o, c: None, threading.Event())
        direct.close()
        assert len(tunnels) == before

        monkeypatch.setenv(
            "HTTP_PROXY", proxy
        )  # set on the process only: below the edge it counts for nothing
        unset = Transport(hub.endpoint, None, proxies=Options().proxies, egress=LOOPBACK)
        unset.fetch(unset.resolve(url), 0, 10, lambda o, c: None, threading.Event())
        unset.close()
        assert len(tunnels) == before


def test_proxy_variables_are_read_as_urllib_reads_them() -> None:
    env = {
        "HTTP_PROXY": "upper:1",
        "http_proxy": "lower:2",
        "HTTPS_PROXY": "secure:3",
        "no_proxy": "a.example",
    }
    assert proxies_from_env(env) == {
        "http": "lower:2",
        "https": "secure:3",
        "no": "a.example",
    }  # lowercase wins
    assert proxy_for("https", "hub.example:443", proxies_from_env(env)) == "secure:3"
    assert proxy_for("https", "a.example:443", proxies_from_env(env)) is None
    assert proxy_for("http", "hub.example", {"https": "only-secure:3"}) == "only-secure:3"
    assert proxies_from_env({"HTTP_PROXY": ""}) == {}
