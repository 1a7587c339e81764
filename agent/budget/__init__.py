"""Cluster-wide origin budget: how many nodes pull from the origin at once, through Leases.

`slots` is the pure slot logic (which Lease to take, expiry, Retry-After, pacing),
`leases` the API calls, `gate` the node's budget and the origin byte source behind
it, `config` the agent flags (chart `originBudget`).
"""
