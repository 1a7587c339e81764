"""At-rest scrub and repair of Ready copies (issue #25 part 2): `core` (manifest + files -> findings,
pure), `pacing` (the I/O budget), `ioprio` (idle I/O priority), `schedule` (when each copy is due) and
`scrubber`, the thread that runs them; it gets the agent's side whole (`AgentSide`), so this package
imports nothing of `praesto.agent`, which imports it."""
