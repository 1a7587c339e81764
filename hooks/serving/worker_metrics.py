"""One /metrics for every gunicorn worker: prometheus_client's multiprocess mode.

praesto-hooks forks `--workers` processes (2 by default) after `create_app` registered its
metrics in the master. With plain in-process values each worker counts only its own requests and
a scrape reads whichever worker answers, so counters jump between workers' totals and every rate
and alert built on them is wrong. In multiprocess mode each process writes its values to mmap
files under one private directory (keyed by pid; prometheus_client re-opens them after a fork,
values.py MultiProcessValue), and /metrics sums every file, those of workers gunicorn replaced
included, so counters never go back.

The value class must be chosen before the first metric is built (prometheus_client picks it at
import from PROMETHEUS_MULTIPROC_DIR); `enable` sets both the variable, for anything imported
later, and the class itself, since prometheus_client is already imported by then.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prometheus_client import CollectorRegistry, multiprocess, values

ENV = "PROMETHEUS_MULTIPROC_DIR"


def enable(parent: str | None = None) -> Path:
    """A fresh private directory for this server's metric files, in multiprocess mode from now on.
    Fresh per start: files a previous server left would add its counts to ours."""
    directory = Path(tempfile.mkdtemp(prefix="praesto-hooks-metrics-", dir=parent))
    os.environ[ENV] = str(directory)
    values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]  # untyped upstream
    return directory


@contextmanager
def directory(parent: str | None = None) -> Iterator[Path]:
    """`enable`, and the directory removed when the server ends. gunicorn's workers leave by
    SystemExit through this same frame (they are forked inside `run()`), so only the process that
    made the directory removes it."""
    owner = os.getpid()
    made = enable(parent)
    try:
        yield made
    finally:
        if os.getpid() == owner:
            shutil.rmtree(made, ignore_errors=True)


def registry_for_scrape(directory: Path) -> CollectorRegistry:
    """A registry that reads every process's files as they are now (built per scrape, as
    prometheus_client's multiprocess documentation does)."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(directory))  # type: ignore[no-untyped-call]
    return registry
