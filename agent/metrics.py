"""Prometheus metrics of the node agent, in a registry of their own.

A registry per agent (not the global one) lets tests run several agents in one
process and read exact values.
"""

from __future__ import annotations

from dataclasses import dataclass

from praesto.agent.download.api import Result
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

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
            cache_hits=Counter(
                "praesto_agent_cache_hits",
                "Caches found complete on disk and made Ready without a download",
                registry=reg,
            ),
            in_flight=Gauge("praesto_agent_downloads_in_flight", "Downloads running now", registry=reg),
        )

    def record_download(self, result: Result) -> None:
        self.bytes_downloaded.labels(ORIGIN_SOURCE).inc(result.bytes_from_origin)
        self.bytes_downloaded.labels(ORIGIN_DEDUP).inc(result.bytes_deduplicated)
        self.bytes_downloaded.labels(ORIGIN_PEER).inc(result.bytes_from_peers)
        self.download_seconds.observe(result.seconds)

    def value(self, name: str, **labels: str) -> float:
        """Current value of a sample (tests and the debug log)."""
        found = self.registry.get_sample_value(name, labels)
        return found or 0.0

    def serve(self, port: int, addr: str = "0.0.0.0") -> int:
        """Serve /metrics on a thread; returns the bound port (`port=0` picks a free one)."""
        server, _thread = start_http_server(port, addr, registry=self.registry)
        return int(server.server_port)
