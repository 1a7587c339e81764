"""`praesto-csi`: the CSI node plugin's command line, and its process edge.

`main` takes the process environment, once, and builds the plugin's settings from it and the
flags (csi/settings.py `CsiSettings`); nothing below reads the environment.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping

from praesto.csi.registration import RegistrationFailed
from praesto.csi.server import serve
from praesto.csi.settings import CsiSettings, SettingsError, add_arguments
from praesto.csi.sockets import EndpointError
from praesto.csi.volume import CsiError

from praesto import names
from praesto.cliargs import EXIT_USAGE, CommandParser, add_version, configure_logging


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    """`praesto-csi`'s parser; flags with an environment default take it from `env` (the flag wins)."""
    parser = CommandParser(
        prog="praesto-csi",
        description=f"CSI node plugin {names.CSI_DRIVER_NAME}: read-only model cache mounts",
    )
    add_version(parser)
    add_arguments(parser, env)
    return parser


def main(argv: list[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """The process edge: the environment is taken here, once (`env` stands in for it in tests)."""
    env = dict(os.environ) if env is None else env
    args = build_parser(env).parse_args(argv)
    configure_logging(str(args.log_level).upper(), "%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = CsiSettings.from_args(args)
    except SettingsError as err:
        print(f"praesto-csi: {err}", file=sys.stderr)
        return EXIT_USAGE
    try:
        serve(
            settings.endpoint,
            settings.node_name,
            settings.base_path,
            settings.unassigned_after,
            settings.registration,
        )
    except EndpointError as err:
        print(f"praesto-csi: {err}", file=sys.stderr)
        return EXIT_USAGE
    except RegistrationFailed as err:  # exit non-zero so that the DaemonSet restarts the plugin
        print(f"praesto-csi: {err}", file=sys.stderr)
        return 1
    except CsiError as err:  # e.g. a store directory that is a symlink (storefs.UnsafeStore)
        print(f"praesto-csi: {err.message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
