"""`praesto` command: offline tools for users (render, plan).

It lives in the hooks package because what it runs is the hooks' own logic (`praesto render`)
and, for `praesto plan`, the agent's planner; the ground package `praesto` imports nothing from
above it. Each command is imported only when it runs (`plan` brings the object-store clients).
"""

from __future__ import annotations

import sys

from praesto import __version__
from praesto.cliargs import EXIT_USAGE
from praesto.kinds import FORMS, URI_EXAMPLES

COMMANDS = {
    "render": "print the children and status the hooks would produce for a ModelCache (no cluster)",
    "plan": "list a ModelCache's source with its real file sizes and check that storage.size holds it",
    "uninstall-check": "the chart's pre-delete hook: refuse helm uninstall while ModelCaches exist",
}
HELP = (
    "usage: praesto [-h] [--version] <command> [options]\n\n"
    "Offline tools for Praesto ModelCache objects.\n\ncommands:\n"
    + "".join(f"  {name:<{max(map(len, COMMANDS))}} {text}\n" for name, text in COMMANDS.items())
    + f"\nsources a ModelCache may name (spec.source.uri; or {' / '.join(f'source.{f}' for f in FORMS)}):\n"
    + "".join(f"  {example}\n" for example in URI_EXAMPLES.values())
    + "\nexamples:\n"
    "  praesto render -f modelcache.yaml --nodes nodes.yaml\n"
    "  praesto plan -f modelcache.yaml\n\n"
    "Run `praesto <command> --help` for a command's options.\n"
)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print(HELP, end="", file=sys.stderr)
        return EXIT_USAGE
    command, rest = args[0], args[1:]
    if command in ("-h", "--help"):
        print(HELP, end="")
        return 0
    if command == "--version":
        print(f"praesto {__version__}")
        return 0
    if command == "render":
        from praesto.hooks.render import main as render_main

        return int(render_main(rest))
    if command == "plan":
        from praesto.hooks.plan import main as plan_main

        return plan_main(rest)
    if command == "uninstall-check":  # run by the chart (templates/uninstall-hook.yaml), in the cluster
        from praesto.hooks.uninstall_check import main as uninstall_check_main

        return uninstall_check_main(rest)
    print(
        f"praesto: error: unknown command {command!r}; use one of {', '.join(COMMANDS)} (see praesto --help)",
        file=sys.stderr,
    )
    return EXIT_USAGE
