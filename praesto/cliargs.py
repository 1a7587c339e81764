"""What the command lines (`praesto`, `praesto-hooks`, `praesto-orphans`, `praesto-agent`, `praesto-csi`) share.

A bad flag is refused in one line that names the flag, the cause and the fix, with exit 2
(usage), before any work: `CommandParser` makes argparse's refusal that line, and the type
functions here say what they expected (argparse would print `invalid _positive value`). Every
command prints `<prog> <version>` for `--version`, the version of the installed `praesto`
distribution (`praesto.__version__`, read once from its metadata).
"""

from __future__ import annotations

import argparse
import logging
from typing import NoReturn

from praesto import __version__

EXIT_USAGE = 2
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# Loggers that print whole API answers at DEBUG (kubernetes.client.rest: "response body: ..."), and
# a process that reads a Secret through that client would print the Secret: held at INFO whatever
# --log-level says.
BODY_LOGGERS = ("kubernetes", "httpx2")


def configure_logging(level: str, fmt: str) -> None:
    """The root logger at `level` (one of LOG_LEVELS), never the API clients' bodies."""
    logging.basicConfig(level=getattr(logging, level), format=fmt)
    for name in BODY_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.INFO, getattr(logging, level)))


class CommandParser(argparse.ArgumentParser):
    """An ArgumentParser whose refusal is one line (no usage block) pointing at --help.

    Subcommand parsers made by `add_subparsers` are of the same class, so they refuse alike."""

    def error(self, message: str) -> NoReturn:
        cause = message.removeprefix("argument ")  # "argument --x: ..." reads "--x: ..."
        self.exit(EXIT_USAGE, f"{self.prog}: error: {cause}; see {self.prog} --help\n")


def add_version(parser: argparse.ArgumentParser) -> None:
    """`--version`: `<prog> <version>`, then exit 0 (before any other flag is checked)."""
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}", help="print the version and exit"
    )


def positive_int(text: str) -> int:
    """A count such as --concurrency: 1 or more."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def seconds(text: str) -> float:
    """A duration in seconds, 0 or more (each flag says what 0 means)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):  # `not >=` also refuses nan
        raise argparse.ArgumentTypeError(f"expected a number of seconds (e.g. 30 or 2.5), got {text!r}")
    return value


def log_level(text: str) -> str:
    """One of LOG_LEVELS, any case (the chart writes `info`); also checks an environment default,
    which argparse converts with the type but never checks against `choices`."""
    level = str(text).upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(LOG_LEVELS)}, got {text!r}")
    return level
