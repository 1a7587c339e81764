"""praesto-orphans' settings: flags over the environment, checked once before any work.

The process edge (cli.py `main`) takes the environment once (hooks/config.py `environment`, the
hooks package's settings module) and hands it here; nothing below reads it. A flag wins over its
variable; a bad value, from either, is refused in one line naming it, the cause and the fix.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from praesto import names
from praesto.cliargs import EXIT_USAGE, CommandParser, add_version, log_level, positive_int, seconds

PROG = "praesto-orphans"
ENV_RESYNC_SECONDS = "PRAESTO_ORPHANS_RESYNC_SECONDS"
ENV_HEARTBEAT_FILE = "PRAESTO_ORPHANS_HEARTBEAT_FILE"
ENV_LOG_LEVEL = names.ENV_LOG_LEVEL  # PRAESTO_LOG_LEVEL, as the agent reads it
DEFAULT_RESYNC_SECONDS = 600  # every copy is looked at again (a full list) this often
MIN_RESYNC_SECONDS = 30  # fewer would relist every copy and Node of the cluster near continuously
DEFAULT_HEARTBEAT_SECONDS = 10.0
DEFAULT_STALE_AFTER = 60.0  # the probe's bound: several heartbeats missed, not one slow one


@dataclass(frozen=True)
class OrphansSettings:
    """What praesto-orphans runs with (`--help` says the same per flag)."""

    resync_seconds: int = DEFAULT_RESYNC_SECONDS
    """--resync-seconds (PRAESTO_ORPHANS_RESYNC_SECONDS): every copy and Node is listed again this often."""
    log_level: str = "INFO"
    """--log-level (PRAESTO_LOG_LEVEL): DEBUG, INFO, WARNING or ERROR."""
    heartbeat_file: str = ""
    """--heartbeat-file (PRAESTO_ORPHANS_HEARTBEAT_FILE): touched while every watch runs; empty: none."""
    heartbeat_seconds: float = DEFAULT_HEARTBEAT_SECONDS
    """--heartbeat-seconds: how often the heartbeat file is touched."""
    probe: bool = False
    """--probe: do not run; exit 0 if the heartbeat file is fresh (the chart's liveness probe)."""
    stale_after: float = DEFAULT_STALE_AFTER
    """--stale-after: the probe's bound on the heartbeat file's age, in seconds."""


def _from_env(env: Mapping[str, str], name: str, convert: type | object, fallback: object) -> object:
    """The variable converted as its flag would be, or a one-line refusal naming the variable."""
    raw = env.get(name, "").strip()
    if not raw:
        return fallback
    try:
        return convert(raw)  # type: ignore[operator]
    except argparse.ArgumentTypeError as err:
        raise SettingsError(f"{name}: {err}; unset it or give a valid value") from None


class SettingsError(ValueError):
    """A bad environment variable, named with its fix."""


def parser(env: Mapping[str, str]) -> CommandParser:
    """praesto-orphans' flags; each variable-backed flag defaults to its variable (checked here)."""
    p = CommandParser(
        prog=PROG,
        description="Release the node copies (ModelCacheNodes) of Nodes that are gone, so deleting a "
        "ModelCache always finishes. The chart runs it as its own Deployment, <fullname>-orphans.",
    )
    add_version(p)
    p.add_argument(
        "--resync-seconds",
        type=positive_int,
        default=_from_env(env, ENV_RESYNC_SECONDS, positive_int, DEFAULT_RESYNC_SECONDS),
        help=f"list every copy and Node again this often (env {ENV_RESYNC_SECONDS}; default "
        f"{DEFAULT_RESYNC_SECONDS}, at least {MIN_RESYNC_SECONDS})",
    )
    p.add_argument(
        "--log-level",
        type=log_level,
        default=_from_env(env, ENV_LOG_LEVEL, log_level, "INFO"),
        help=f"DEBUG, INFO, WARNING or ERROR (env {ENV_LOG_LEVEL}; default INFO)",
    )
    p.add_argument(
        "--heartbeat-file",
        default=env.get(ENV_HEARTBEAT_FILE, "").strip(),
        help=f"touch this file while every watch runs, for --probe (env {ENV_HEARTBEAT_FILE}; default none)",
    )
    p.add_argument(
        "--heartbeat-seconds",
        type=seconds,
        default=DEFAULT_HEARTBEAT_SECONDS,
        help=f"touch the heartbeat file this often (default {DEFAULT_HEARTBEAT_SECONDS:g})",
    )
    p.add_argument(
        "--probe",
        action="store_true",
        help="do not run: exit 0 if --heartbeat-file was touched within --stale-after seconds, else 1 "
        "(the chart's liveness probe)",
    )
    p.add_argument(
        "--stale-after",
        type=seconds,
        default=DEFAULT_STALE_AFTER,
        help=f"--probe's bound on the heartbeat file's age in seconds (default {DEFAULT_STALE_AFTER:g})",
    )
    return p


def settings_from(argv: Sequence[str], env: Mapping[str, str]) -> OrphansSettings:
    """The settings, or exit 2 with one line (argparse's refusal, or ours) before any work."""
    try:
        p = parser(env)
    except SettingsError as err:
        CommandParser(prog=PROG).exit(EXIT_USAGE, f"{PROG}: error: {err}\n")
    args = p.parse_args(list(argv))
    bad = _out_of_range(args)
    if bad:
        p.error(bad)
    return OrphansSettings(
        resync_seconds=args.resync_seconds,
        log_level=args.log_level,
        heartbeat_file=args.heartbeat_file,
        heartbeat_seconds=args.heartbeat_seconds,
        probe=args.probe,
        stale_after=args.stale_after,
    )


def _out_of_range(args: argparse.Namespace) -> str | None:
    if args.resync_seconds < MIN_RESYNC_SECONDS:
        return (
            f"--resync-seconds ({ENV_RESYNC_SECONDS}) must be at least {MIN_RESYNC_SECONDS}: each resync "
            "lists every copy and Node"
        )
    if args.heartbeat_seconds <= 0:
        return "--heartbeat-seconds must be more than 0"
    if args.stale_after <= 0:
        return "--stale-after must be more than 0 (several --heartbeat-seconds of the running releaser)"
    if args.probe and not args.heartbeat_file:
        return (
            f"--probe needs --heartbeat-file (or {ENV_HEARTBEAT_FILE}): the file the running releaser touches"
        )
    return None


def environment_problem(env: Mapping[str, str]) -> str | None:
    """What praesto-orphans, started with no flags in this environment, would refuse: praesto-hooks
    --release-orphaned-copies asks before gunicorn starts, so the refusal is its own, in its log, and
    not a child's exit that gunicorn's master reaps unseen (gunicorn 27.0.1 arbiter.py
    `Arbiter.reap_workers` waits on any child and logs an unknown one at debug only)."""
    try:
        args = parser(env).parse_args([])
    except SettingsError as err:
        return str(err)
    return _out_of_range(args)
