"""Start an emulator process on a free loopback port and wait (polling, with a deadline) until it answers.

Shared by the GCS and Azure emulator helpers: a port taken between `free_port()` and the
emulator's bind is retried on another port; any HTTP answer (even an error status) means ready.
"""

from __future__ import annotations

import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

from testkit.ports import free_port

STARTUP_DEADLINE = 30.0


def _answers(url: str, ca_file: str | None = None) -> bool:
    context = ssl.create_default_context(cafile=ca_file) if ca_file else None
    try:
        with urllib.request.urlopen(url, timeout=2, context=context):
            return True
    except urllib.error.HTTPError:
        return True  # an HTTP error is an answer: the server is up
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def start(
    argv_for: Callable[[int], list[str]],
    ready_url_for: Callable[[int], str],
    log_path: Path,
    env: Mapping[str, str] | None = None,
    ca_file: str | None = None,
) -> tuple[subprocess.Popen[bytes], int]:
    """The running process and its port (`ca_file`: trusted for an HTTPS ready URL); raises RuntimeError with the log's tail if it never answers."""
    deadline = time.monotonic() + STARTUP_DEADLINE
    while True:
        port = free_port()
        with open(log_path, "wb") as log:
            process = subprocess.Popen(argv_for(port), stdout=log, stderr=subprocess.STDOUT, env=env)
        while time.monotonic() < deadline and process.poll() is None:
            if _answers(ready_url_for(port), ca_file):
                return process, port
            time.sleep(0.05)
        stop(process)
        if time.monotonic() > deadline:
            raise RuntimeError(f"{argv_for(port)[0]} did not start: {log_path.read_text()[-2000:]}")


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
