"""`python -m praesto.hooks.orphans`: what `praesto-hooks --release-orphaned-copies` starts beside gunicorn."""

from praesto.hooks.orphans.cli import main

raise SystemExit(main())
