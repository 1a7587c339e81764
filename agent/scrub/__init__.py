"""At-rest scrub and repair of Ready copies (issue #25 part 2): `core` (manifest + files -> findings,
pure), `pacing` (the I/O budget), `ioprio` (idle I/O priority), `schedule` (when each copy is due); the thread that runs them is agent/scrubber.py."""
