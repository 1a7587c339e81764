"""Prometheus metrics of the node agent, in a registry of their own.

A registry per agent (not the global one) lets tests run several agents in one
process and read exact values.

The metrics name every tenant's namespaces and caches on the node, so `/metrics`
answers only clients inside the agent's own Pod (loopback: `kubectl port-forward`,
a sidecar) unless `--metrics-from=any` (the chart sets it when
`nodeAgent.metrics.allowedNamespaces` or `nodeAgent.metrics.from` names a
scraper, and admits only those to the port with a NetworkPolicy). Anyone else
gets 403 naming that value. `/healthz` (the kubelet's readiness probe, from the
node's address) answers everyone and tells nothing.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from praesto.agent.download.api import Result
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import MetricsHandler

FROM_LOCAL = "local"  # --metrics-from: only clients inside the agent's Pod (loopback)
FROM_ANY = "any"  # any client that reaches the port (the chart's NetworkPolicy says who can)
METRICS_FROM = (FROM_LOCAL, FROM_ANY)
SOCKET_TIMEOUT = 10.0  # a scrape that sends or takes nothing this long is dropped

ORIGIN_SOURCE = "source"
ORIGIN_DEDUP = "dedup"
ORIGIN_PEER = "peer"  # copied from another node's Ready copy (praesto.agent.peers)


@dataclass(frozen=True)
class AgentMetrics:
    registry: CollectorRegistry
    bytes_downloaded: Counter
    download_seconds: Histogram
    failures: Counter
    evictions: Counter
    cache_hits: Counter
    in_flight: Gauge
    scrub_mismatches: Counter
    xet_files: Counter
    xet_fallbacks: Counter

    @classmethod
    def create(cls) -> AgentMetrics:
        reg = CollectorRegistry()
        return cls(
            registry=reg,
            bytes_downloaded=Counter(
                "praesto_agent_downloaded_bytes",
                "Bytes placed in the store, by origin: fetched from the source, copied from a peer node "
                "or hard-linked (dedup)",
                ["origin"],
                registry=reg,
            ),
            download_seconds=Histogram(
                "praesto_agent_download_duration_seconds",
                "Wall time of successful cache downloads",
                buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1200, 3600, 7200),
                registry=reg,
            ),
            failures=Counter(
                "praesto_agent_download_failures",
                "Failed download attempts, by reason",
                ["reason"],
                registry=reg,
            ),
            evictions=Counter(
                "praesto_agent_evictions",
                "Caches evicted from this node, by cause (ttl, capacity)",
                ["cause"],
                registry=reg,
            ),
            scrub_mismatches=Counter(
                "praesto_scrub_mismatches",
                "Files the at-rest scrub found not matching the copy's manifest (agent/scrub/)",
                ["namespace", "model_cache"],  # as praesto_pod_model_* label them
                registry=reg,
            ),
            cache_hits=Counter(
                "praesto_agent_cache_hits",
                "Caches found complete on disk and made Ready without a download",
                registry=reg,
            ),
            in_flight=Gauge("praesto_agent_downloads_in_flight", "Downloads running now", registry=reg),
            xet_files=Counter(
                "praesto_agent_xet_files",
                "Hugging Face files fetched through the Xet CAS and verified by their sha256 (downloads.xet)",
                registry=reg,
            ),
            xet_fallbacks=Counter(
                "praesto_agent_xet_fallbacks",
                "Hugging Face files that left the Xet path for resolve/, by cause (token, cas, stall, "
                "format, egress, checksum)",
                ["cause"],
                registry=reg,
            ),
        )

    def record_download(self, result: Result) -> None:
        self.bytes_downloaded.labels(ORIGIN_SOURCE).inc(result.bytes_from_origin)
        self.bytes_downloaded.labels(ORIGIN_DEDUP).inc(result.bytes_deduplicated)
        self.bytes_downloaded.labels(ORIGIN_PEER).inc(result.bytes_from_peers)
        self.download_seconds.observe(result.seconds)
        self.xet_files.inc(result.xet_files)
        for cause, count in result.xet_fallbacks.items():
            self.xet_fallbacks.labels(cause).inc(count)

    def value(self, name: str, **labels: str) -> float:
        """Current value of a sample (tests and the debug log)."""
        found = self.registry.get_sample_value(name, labels)
        return found or 0.0

    def serve(self, port: int, addr: str = "0.0.0.0", scrapers: str = FROM_LOCAL) -> int:
        """Serve /metrics (to `scrapers`) and /healthz on a thread; returns the bound port
        (`port=0` picks a free one)."""
        handler = type("Handler", (_Handler,), {"registry": self.registry, "scrapers": scrapers})
        server_class = type("Server", (ThreadingHTTPServer,), {"address_family": _family(addr)})
        server = server_class((addr, port), handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="praesto-metrics", daemon=True).start()
        return int(server.server_port)


def _family(addr: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in addr else socket.AF_INET


def is_local(host: str) -> bool:
    """A client on the loopback: inside the agent's own network namespace (its Pod)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


class _Handler(MetricsHandler):
    scrapers = FROM_LOCAL
    timeout = SOCKET_TIMEOUT

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == "/healthz":
            self._answer(200, "ok\n")
        elif path != "/metrics":
            self._answer(404, f"{path}: not found; the agent serves /metrics and /healthz\n")
        elif self.scrapers != FROM_ANY and not is_local(str(self.client_address[0])):
            self._answer(
                403,
                "/metrics: Forbidden: it names every tenant's caches, so it answers only inside the "
                "agent's Pod (kubectl port-forward); to let a scraper in, list its namespace in the "
                "chart's nodeAgent.metrics.allowedNamespaces (agent flag --metrics-from=any)\n",
            )
        else:
            super().do_GET()

    def _answer(self, status: int, text: str) -> None:
        body = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Nothing: scrapes every few seconds would fill the log."""
