"""praesto-hooks' /metrics counts every worker's requests, whichever worker answers the scrape.

Before multiprocess mode each of the two default workers kept its own counters: a scrape showed the
requests of whichever worker took it, so counters went back and forth and rates were wrong."""

from __future__ import annotations

import re
from pathlib import Path

from testkit.server import get_text, hooks_server

REQUESTS = 40
HEALTHZ = re.compile(r'^praesto_hooks_requests_total\{code="200",method="GET",path="/healthz"\} (\S+)$', re.M)


def healthz_count(text: str) -> float:
    found = HEALTHZ.search(text)
    return float(found.group(1)) if found else 0.0


def test_every_scrape_counts_the_requests_of_both_workers(tmp_path: Path) -> None:
    with hooks_server(tmp_path, workers=2, threads=1) as server:
        before = healthz_count(get_text(server, "/metrics")[1])
        for _ in range(REQUESTS):
            assert get_text(server, "/healthz")[0] == 200
        # New connections spread over both workers; every scrape must see all of them.
        seen = {healthz_count(get_text(server, "/metrics")[1]) - before for _ in range(10)}
    assert seen == {REQUESTS}


def test_the_metric_files_go_with_the_server(tmp_path: Path) -> None:
    env_dir = tmp_path / "metrics-parent"
    env_dir.mkdir()
    with hooks_server(tmp_path, workers=2, env={"TMPDIR": str(env_dir)}) as server:
        get_text(server, "/metrics")
        assert [p.name for p in env_dir.iterdir() if p.name.startswith("praesto-hooks-metrics-")]
    assert not [p for p in env_dir.iterdir() if p.name.startswith("praesto-hooks-metrics-")]
