"""The orphan releaser as its own process, praesto-orphans: `releaser` (the decision and its API
edge), `settings` (flags over the environment), `cli` (the entry point and its heartbeat).

Nothing is imported here, so `praesto-orphans --probe` (the liveness probe) starts without the
Kubernetes client."""
