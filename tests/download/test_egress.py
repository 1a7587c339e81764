"""Where a tenant's input may send the node (issue 37 item 3): one egress rule, every path.

(Over 400 lines: every path is tried against the same tripwire, so they stay side by side.)

Each path a tenant's input reaches a connection through is tried against an address the rule
refuses: a Hub redirect (the engine's byte transport), the Hub metadata client's redirects
(huggingface_hub over httpx2), a DNS name that resolves inside the cluster, an object store's
endpoint and a key file's token_uri. `tripwire` fails the test the moment anything dials an
address it did not expect, so a refusal is proven to happen before any packet (and today's main,
which dials them, fails fast instead of waiting on a timeout). The token realm is named by
the real registry (tests/registry, distribution v3.1.2) in its 401s.
"""

from __future__ import annotations

import http.server
import ipaddress
import json
import re
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from praesto.agent.download import DownloadError, LastingDownloadError, Options
from praesto.agent.download.api import Target
from praesto.agent.download.egress import (
    ALLOWED_SETTING,
    REASON_EGRESS_REFUSED,
    EgressPolicy,
    address_class,
    parse_allowed,
    refusal,
)
from praesto.agent.download.fetch import download, plan
from praesto.agent.download.http import Redirect, Transport

from praesto.spec import Source
from testkit.connect_proxy import connect_proxy
from testkit.controlplane import ControlPlaneUnavailable
from testkit.hub import LocalHub
from testkit.registry import Registry, registry_binaries
from testkit.registry_token import Grants

METADATA_URL = "http://169.254.169.254/latest/meta-data/iam/security-credentials"
INTERNAL = "127.0.0.2"  # an address no test allows: stands for an in-cluster service
ORIGINS = EgressPolicy.from_text("127.0.0.1/32")  # the test's own origins, and not INTERNAL


def refused(host: str, address_class: str) -> str:
    """The one message of a refusal (egress.EgressRefused)."""
    return (
        f"egress to {host} refused: {address_class} addresses are not allowed; list it in "
        f"{ALLOWED_SETTING} if the platform means it"
    )


@pytest.fixture
def tripwire(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """Fail on any dial outside 127.0.0.1/::1 and the addresses a test adds to the returned set."""
    dialable = {"127.0.0.1", "::1"}
    original = socket.socket.connect

    def connect(self: socket.socket, address: Any) -> None:
        if self.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in dialable:
            raise AssertionError(f"dialled {address[0]}: the egress rule should have refused it first")
        original(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    return dialable


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Answers per `server.answer(handler)`; records each request's path and Authorization."""

    server: _Server

    def do_GET(self) -> None:
        self.server.seen.append((self.path, self.headers.get("Authorization")))
        self.server.answer(self)

    do_HEAD = do_GET

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, host: str, answer: Callable[[_Recorder], None]) -> None:
        super().__init__((host, 0), _Recorder)
        self.answer = answer
        self.seen: list[tuple[str, str | None]] = []

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"


@pytest.fixture
def serve() -> Iterator[Callable[..., _Server]]:
    started: list[_Server] = []

    def start(answer: Callable[[_Recorder], None], host: str = "127.0.0.1") -> _Server:
        server = _Server(host, answer)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.shutdown()
        server.server_close()


def _ok(body: bytes = b"model bytes") -> Callable[[_Recorder], None]:
    def answer(handler: _Recorder) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if handler.command == "GET":
            handler.wfile.write(body)

    return answer


def _json(document: object) -> Callable[[_Recorder], None]:
    body = json.dumps(document).encode()

    def answer(handler: _Recorder) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    return answer


def _redirect(location: str) -> Callable[[_Recorder], None]:
    def answer(handler: _Recorder) -> None:
        handler.send_response(307)
        handler.send_header("Location", location)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    return answer


def _closed_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _get(transport: Transport, url: str) -> bytes:
    """The 11 bytes `_ok` serves, fetched as the engine fetches a part (authorized at the origin)."""
    got = bytearray()
    transport.fetch(Target(url, True), 0, 11, lambda o, c: got.extend(c), threading.Event())
    return bytes(got)


# --- the rule -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("169.254.169.254", "metadata"),
        ("fd00:ec2::254", "metadata"),
        ("::ffff:169.254.169.254", "metadata"),  # IPv4-mapped
        ("64:ff9b::a9fe:a9fe", "metadata"),  # NAT64 of 169.254.169.254
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("10.96.0.1", "private"),
        ("172.16.5.4", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.10", "private"),  # CGNAT
        ("fd12:3456::1", "private"),  # ULA
        ("240.0.0.1", "reserved"),
        ("8.8.8.8", None),
        ("2606:4700::1111", None),
    ],
)
def test_address_classes(address: str, expected: str | None) -> None:
    assert address_class(ipaddress.ip_address(address)) == expected


def test_a_listed_network_admits_its_addresses_but_never_the_metadata_service_by_accident() -> None:
    allowed = parse_allowed("127.0.0.0/8, 10.0.0.0/8,169.254.0.0/16")
    assert refusal(ipaddress.ip_address("127.0.0.1"), allowed) is None
    assert refusal(ipaddress.ip_address("10.1.2.3"), allowed) is None
    assert refusal(ipaddress.ip_address("192.168.0.1"), allowed) == "private"
    assert refusal(ipaddress.ip_address("169.254.169.254"), allowed) == "metadata"
    assert refusal(ipaddress.ip_address("169.254.169.254"), parse_allowed("169.254.169.254/32")) is None
    with pytest.raises(ValueError, match=r"'10\.0\.0\.0/33' is not a CIDR"):
        parse_allowed("10.0.0.0/33")


# --- redirects --------------------------------------------------------------------------------


def test_a_hub_redirect_to_the_metadata_address_is_refused_before_any_packet(
    tmp_path: Path, tripwire: set[str]
) -> None:
    """A Hub (trusted: the platform configured it) whose LFS redirect names 169.254.169.254."""
    with LocalHub(tmp_path / "hub", cdn_base=METADATA_URL) as hub:
        hub.add_repo("org/model", {"config.json": b"{}", "model.safetensors": b"w" * 4096})
        options = Options(endpoint=hub.endpoint)  # the production default: nothing internal listed
        planned = plan(Source("hf", "org/model"), options)
        with pytest.raises(LastingDownloadError) as failure:
            download(planned, tmp_path / "dest", options)
    assert (failure.value.reason, failure.value.message) == (
        REASON_EGRESS_REFUSED, refused("169.254.169.254", "metadata")
    )  # fmt: skip


def test_a_plain_http_redirect_to_link_local_is_refused(
    serve: Callable[..., _Server], tripwire: set[str]
) -> None:
    origin = serve(_redirect("http://169.254.10.20:8080/blob"))
    transport = Transport(origin.url, None, egress=ORIGINS)
    with pytest.raises(Redirect) as hop:
        _get(transport, f"{origin.url}/blob")
    with pytest.raises(LastingDownloadError, match=re.escape(refused("169.254.10.20", "link-local"))):
        transport.fetch(hop.value.target, 0, 11, lambda o, c: None, threading.Event())
    transport.close()


def test_the_hub_metadata_clients_redirects_are_checked(
    serve: Callable[..., _Server], tripwire: set[str]
) -> None:
    """huggingface_hub follows redirects itself (httpx2): a mirror's metadata answer pointing at
    the metadata service is refused at connect time, not fetched."""
    mirror = serve(_redirect(METADATA_URL))
    with pytest.raises(LastingDownloadError) as failure:
        plan(Source("hf", "org/model"), Options(endpoint=mirror.url))
    assert failure.value.reason == REASON_EGRESS_REFUSED
    assert refused("169.254.169.254", "metadata") in failure.value.message
    assert mirror.seen, "the configured mirror itself is trusted as configured"


def test_a_redirect_to_another_host_drops_the_authorization(serve: Callable[..., _Server]) -> None:
    storage = serve(_ok())
    hub = serve(_redirect(f"{storage.url}/signed?X-Sig=abc"))
    transport = Transport(hub.url, "hf_secret_token", egress=ORIGINS)
    with pytest.raises(Redirect) as hop:
        _get(transport, f"{hub.url}/org/m/resolve/main/w.bin")
    got = bytearray()
    transport.fetch(hop.value.target, 0, 11, lambda o, c: got.extend(c), threading.Event())
    transport.close()
    assert bytes(got) == b"model bytes"
    assert hub.seen[0][1] == "Bearer hf_secret_token"
    assert storage.seen == [("/signed?X-Sig=abc", None)]  # another host: no credential


# --- names and addresses ---------------------------------------------------------------------


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Names the test makes up -> the addresses getaddrinfo answers for them (no /etc/hosts)."""
    names: dict[str, list[str]] = {}
    original = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host not in names:
            return original(host, port, *args, **kwargs)
        return [
            (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, int(port)))
            for a in names[host]
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return names


def test_a_name_that_resolves_to_a_private_address_is_refused_at_connect_time(
    resolver: dict[str, list[str]], tripwire: set[str]
) -> None:
    resolver["models.tenant.example"] = ["10.0.0.5"]
    transport = Transport("http://hub.invalid", None, egress=ORIGINS)
    with pytest.raises(LastingDownloadError, match=re.escape(refused("models.tenant.example", "private"))):
        transport.request("GET", "http://models.tenant.example:8080/weights", authorized=False)


def test_only_the_admitted_addresses_of_a_name_are_dialled(
    serve: Callable[..., _Server], resolver: dict[str, list[str]], tripwire: set[str]
) -> None:
    """A name answering the metadata address first and an allowed one second: the second is dialled."""
    origin = serve(_ok())
    resolver["mixed.tenant.example"] = ["169.254.169.254", "127.0.0.1"]
    transport = Transport("http://hub.invalid", None, egress=ORIGINS)
    port = origin.server_address[1]
    resp = transport.request("GET", f"http://mixed.tenant.example:{port}/w", authorized=False)
    assert (resp.status, resp.read()) == (200, b"model bytes")
    transport.close()


def test_an_allow_listed_network_passes(serve: Callable[..., _Server], tripwire: set[str]) -> None:
    tripwire.add(INTERNAL)
    internal = serve(_ok(), host=INTERNAL)
    unlisted = Transport("http://hub.invalid", None, egress=ORIGINS)
    with pytest.raises(LastingDownloadError, match=re.escape(refused(INTERNAL, "loopback"))):
        unlisted.request("GET", f"{internal.url}/w", authorized=False)
    listed = Transport("http://hub.invalid", None, egress=EgressPolicy.from_text(f"{INTERNAL}/32"))
    assert listed.request("GET", f"{internal.url}/w", authorized=False).read() == b"model bytes"
    listed.close()


def test_the_refusal_is_the_same_whether_an_internal_port_is_open_or_closed(
    serve: Callable[..., _Server], tripwire: set[str]
) -> None:
    tripwire.add(INTERNAL)  # so today's main shows its two different answers instead of tripping
    listening = serve(_ok(), host=INTERNAL)
    messages = []
    for url in (f"{listening.url}/token", f"http://{INTERNAL}:{_closed_port(INTERNAL)}/token"):
        transport = Transport("http://hub.invalid", None, egress=ORIGINS)
        with pytest.raises(LastingDownloadError) as failure:
            transport.request("GET", url, authorized=False).read()
        messages.append((failure.value.reason, failure.value.message))
        transport.close()
    assert messages[0] == messages[1] == (REASON_EGRESS_REFUSED, refused(INTERNAL, "loopback"))
    assert not listening.seen


def test_through_a_proxy_the_target_is_checked_as_written_and_names_are_the_proxys(
    serve: Callable[..., _Server], tripwire: set[str]
) -> None:
    """The proxy resolves names, not the agent (docs/user-guide.md): a refused address is refused
    before the CONNECT; a name goes to the proxy, whose own rules decide."""
    origin = serve(_ok())
    routes = {"models.tenant.example:80": f"127.0.0.1:{origin.server_address[1]}"}
    with connect_proxy(routes) as (proxy, tunnels):
        transport = Transport("http://hub.invalid", None, proxies={"http": proxy}, egress=ORIGINS)
        with pytest.raises(LastingDownloadError, match=re.escape(refused("169.254.169.254", "metadata"))):
            transport.request("GET", METADATA_URL, authorized=False)
        assert tunnels == []  # nothing was asked of the proxy
        resp = transport.request("GET", "http://models.tenant.example/w", authorized=False)
        assert resp.read() == b"model bytes" and tunnels == ["models.tenant.example:80"]
        transport.close()


# --- object stores ----------------------------------------------------------------------------


def test_an_object_store_endpoint_in_the_secret_is_checked_before_the_store_is_opened() -> None:
    endpoint = f"http://{INTERNAL}:{_closed_port(INTERNAL)}"
    secret = {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b", "AWS_ENDPOINT_URL": endpoint}
    with pytest.raises(LastingDownloadError) as failure:
        plan(Source("s3", "bucket/models"), Options(credentials=secret, credentials_from="Secret t/s"))
    assert failure.value.reason == REASON_EGRESS_REFUSED
    assert failure.value.message == f"s3://bucket/models: {refused(INTERNAL, 'loopback')}"


def test_a_gcs_key_files_token_uri_is_checked_too() -> None:
    key = {"type": "service_account", "client_email": "x@p.iam.gserviceaccount.com", "private_key": "k",
           "private_key_id": "1", "token_uri": f"http://{INTERNAL}:{_closed_port(INTERNAL)}/token"}  # fmt: skip
    secret = {"gcloud-application-credentials.json": json.dumps(key)}
    with pytest.raises(LastingDownloadError) as failure:
        plan(Source("gs", "bucket/models"), Options(credentials=secret, credentials_from="Secret t/s"))
    assert failure.value.reason == REASON_EGRESS_REFUSED
    assert refused(INTERNAL, "loopback") in failure.value.message


# --- the token realm a registry names (the real registry, tests/registry) -----------------------


@pytest.fixture
def registry_realm(tmp_path: Path) -> Iterator[Callable[[str], Registry]]:
    """A token-auth registry on 127.0.0.1 whose 401s name the realm the test gives."""
    try:
        registry_binaries()
    except ControlPlaneUnavailable as err:
        pytest.skip(str(err))
    running: list[Registry] = []

    def start(realm: str) -> Registry:
        registry = Registry(tmp_path / f"registry-{len(running)}", grants=Grants(), realm=realm)
        running.append(registry.__enter__())
        return registry

    yield start
    for registry in running:
        registry.__exit__(None, None, None)


def _plan_oci(registry: Registry, egress: EgressPolicy) -> DownloadError:
    source = Source("oci", f"{registry.host}/team/model", "1.0")
    with pytest.raises(DownloadError) as failure:
        plan(source, Options(plain_http=True, egress=egress))
    return failure.value


def test_a_token_realm_at_the_metadata_address_is_refused(
    registry_realm: Callable[[str], Registry], tripwire: set[str]
) -> None:
    error = _plan_oci(registry_realm(METADATA_URL), ORIGINS)
    assert (error.reason, error.message) == (REASON_EGRESS_REFUSED, refused("169.254.169.254", "metadata"))


def test_a_token_realm_inside_the_cluster_gets_nothing_and_tells_nothing(
    registry_realm: Callable[[str], Registry], serve: Callable[..., _Server], tripwire: set[str]
) -> None:
    """An in-cluster service's token is never fetched (nor sent on as a Bearer header), and an open
    port and a closed one answer alike; listed by the platform, the realm is asked."""
    tripwire.add(INTERNAL)  # so today's main shows what it leaks instead of tripping
    service = serve(_json({"token": "in-cluster-secret"}), host=INTERNAL)
    closed = f"http://{INTERNAL}:{_closed_port(INTERNAL)}/token"
    answers = [_plan_oci(registry_realm(realm), ORIGINS) for realm in (f"{service.url}/token", closed)]
    assert [(e.reason, e.message) for e in answers] == [
        (REASON_EGRESS_REFUSED, refused(INTERNAL, "loopback"))
    ] * 2
    assert not service.seen
    listed = _plan_oci(
        registry_realm(f"{service.url}/token"), EgressPolicy.from_text(f"127.0.0.1/32,{INTERNAL}/32")
    )
    assert listed.reason != REASON_EGRESS_REFUSED and service.seen
