"""What the kube-apiserver itself counts: `apiserver_request_total` and its watch-event counters.

Read from the server's own /metrics (as the admin), so a figure holds every request
it served, whoever made it, however the client was built. A `Sample` is one read;
`delta(before, after)` is what happened in between, by (verb, resource[/subresource]).
The admin's reads of /metrics are GETs of a non-resource URL and are not counted under
any resource.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
Key = tuple[str, str]  # (verb, resource or resource/subresource)


@dataclass
class Sample:
    requests: Counter[Key] = field(default_factory=Counter)  # apiserver_request_total
    watch_events: Counter[str] = field(default_factory=Counter)  # apiserver_watch_events_total by resource
    watch_bytes: Counter[str] = field(default_factory=Counter)  # apiserver_watch_events_sizes_sum
    open_watches: Counter[str] = field(default_factory=Counter)  # apiserver_longrunning_requests (a gauge)


def parse(text: str) -> Sample:
    sample = Sample()
    for line in text.splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        name, value = match["name"], float(match["value"])
        labels = dict(_LABEL.findall(match["labels"] or ""))
        resource = labels.get("resource") or labels.get("kind") or ""
        if name == "apiserver_request_total" and resource:
            sub = labels.get("subresource") or ""
            sample.requests[(labels.get("verb", ""), f"{resource}/{sub}" if sub else resource)] += int(value)
        elif name == "apiserver_watch_events_total" and resource:
            sample.watch_events[resource] += int(value)
        elif name == "apiserver_watch_events_sizes_sum" and resource:
            sample.watch_bytes[resource] += int(value)
        elif name == "apiserver_longrunning_requests" and resource and labels.get("verb") == "WATCH":
            sample.open_watches[resource] += int(value)
    return sample


def read(admin: Any) -> Sample:
    """One scrape of the server behind `admin` (a `kubernetes.client.ApiClient` allowed /metrics)."""
    response = admin.call_api(
        "/metrics", "GET", header_params={"Accept": "text/plain"}, _return_http_data_only=True,
        _preload_content=False,
    )  # fmt: skip
    return parse(response.data.decode())


def delta(before: Sample, after: Sample) -> Sample:
    """What the server counted between two scrapes (counters only grow while it runs); the open
    watches as `after` saw them. A WATCH request is counted in `requests` when it ends."""
    return Sample(
        after.requests - before.requests,
        after.watch_events - before.watch_events,
        after.watch_bytes - before.watch_bytes,
        after.open_watches,
    )
