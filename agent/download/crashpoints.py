"""Named points where a test can kill the downloader, to prove what a hard kill there leaves behind.

`PRAESTO_CRASH_AT=<name>` in the environment makes the process SIGKILL itself when
it reaches `crash_point(<name>)`: the same end as an OOM kill, a kill after the
grace period or a node losing power, but at an exact step instead of by chance.
Unset (always, outside tests) it costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

ENV = "PRAESTO_CRASH_AT"
# A verified file was made read-only; the journal does not say it is verified yet.
FILE_READ_ONLY = "file-read-only"
POINTS = frozenset({FILE_READ_ONLY})


def crash_point(name: str) -> None:
    if os.environ.get(ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
