"""`python -m praesto.hooks.orphans`: what `praesto-hooks --release-orphaned-copies` starts beside gunicorn."""

from praesto.hooks.orphans.cli import main

if __name__ == "__main__":  # imported (the wheel's import check), it starts nothing
    raise SystemExit(main())
