"""`praesto` command: offline tools for users (render).

It lives in the hooks package because what it runs is the hooks' own logic
(`praesto render`); the ground package `praesto` imports nothing from above it.
"""

from __future__ import annotations

import sys

from praesto.hooks.render import main as render_main


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print("usage: praesto render -f modelcache.yaml [--nodes nodes.yaml]")
        return 0 if args else 2
    if args[0] == "render":
        return int(render_main(args[1:]))
    print(f"praesto: unknown command {args[0]!r}; try: praesto render -f modelcache.yaml", file=sys.stderr)
    return 2
