"""`praesto-orphans`: the orphan releaser (releaser.py) as a process of its own.

The chart runs it as its own Deployment (`<fullname>-orphans`, one replica) under its own
ServiceAccount (praesto/rbac.py ORPHANS): visible (`kubectl logs deploy/praesto-orphans`),
restarted by the kubelet when it ends, with its own resources and liveness probe, and outside
the hooks Pods, so its restarts never take an admission endpoint out of the hooks' Service.
Two running at once (a rollout's surge, or replicas raised by hand) do not fight: every release
is a patch conditional on the copy's resourceVersion, and the later one gets 409 or 404 and
lets the next event decide. No leader is needed.

While every watch thread runs, the main thread touches `--heartbeat-file` every
`--heartbeat-seconds`; `praesto-orphans --probe` (the liveness probe) checks its age. A watch
thread that ended ends the process (exit 1), so the kubelet restarts it. The probe does not
depend on the API server: an outage is the reflectors' to wait out (with backoff), not a restart.
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from praesto.hooks.config import environment
from praesto.hooks.orphans.settings import PROG, OrphansSettings, settings_from

from praesto.cliargs import EXIT_USAGE, configure_logging

log = logging.getLogger("praesto.hooks.orphans")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def probe(settings: OrphansSettings, now: float | None = None) -> int:
    """0 if the heartbeat file was touched within `stale_after` seconds, else 1 with one line."""
    path = Path(settings.heartbeat_file)
    try:
        age = (time.time() if now is None else now) - path.stat().st_mtime
    except OSError as err:
        print(
            f"{PROG}: no heartbeat at {path} ({err.strerror}): the releaser is not running", file=sys.stderr
        )
        return 1
    if age > settings.stale_after:
        print(
            f"{PROG}: heartbeat {path} is {age:.0f}s old (bound {settings.stale_after:g}s)", file=sys.stderr
        )
        return 1
    return 0


def run(settings: OrphansSettings) -> int:
    """Release orphans until SIGTERM (0), or until a watch thread ends (1)."""
    from praesto.hooks.kube import NoApiConfig
    from praesto.hooks.orphans.releaser import OrphanReleaser

    configure_logging(settings.log_level, LOG_FORMAT)
    try:
        releaser = OrphanReleaser(resync=settings.resync_seconds)
    except (NoApiConfig, OSError, ValueError) as err:
        print(f"{PROG}: error: no Kubernetes client configuration ({err}); run it in a Pod or set KUBECONFIG",
              file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: releaser.stopped.set())
    releaser.start()
    log.info("releasing the node copies of deleted Nodes (resync every %ss)", settings.resync_seconds)
    heartbeat = Path(settings.heartbeat_file) if settings.heartbeat_file else None
    while True:
        if not releaser.running():
            if releaser.stopped.is_set():
                releaser.stop()
                return 0
            log.error("a watch thread ended; exiting so that the kubelet restarts the releaser")
            return 1
        if heartbeat is not None:
            heartbeat.touch()
        releaser.stopped.wait(settings.heartbeat_seconds)


def main(argv: Sequence[str] | None = None) -> int:
    settings = settings_from(sys.argv[1:] if argv is None else argv, environment())
    return probe(settings) if settings.probe else run(settings)


if __name__ == "__main__":
    raise SystemExit(main())
