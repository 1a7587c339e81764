"""The egress allow-lists the tests' origins need (agent/download/egress.py refuses them otherwise).

Every origin a test starts listens on loopback (the node tier: on the node's own address, a private
one), which the production default refuses. Each entry point lists them explicitly with these, so
a test that leaves them out sees what production sees.
"""

from __future__ import annotations

from praesto.agent.download.egress import EgressPolicy

from praesto import names

LOOPBACK_CIDRS = "127.0.0.0/8,::1/128"
"""The networks of a test's loopback origins, as --egress-allowed-cidrs and the variable take them."""
LOOPBACK = EgressPolicy.from_text(LOOPBACK_CIDRS)
"""Options.egress for a download from loopback origins."""
LOOPBACK_ENV = {names.ENV_EGRESS_ALLOWED_CIDRS: LOOPBACK_CIDRS}
"""The environment of a `praesto-agent` / `praesto plan` process reaching loopback origins."""
LOOPBACK_FLAG = f"--egress-allowed-cidrs={LOOPBACK_CIDRS}"
"""The same, as a flag of `praesto-agent run` or `praesto-agent download`."""


def cidrs_with(*addresses: str) -> str:
    """LOOPBACK_CIDRS and these addresses (e.g. the node tier's NODE_IP), each as a one-address network."""
    return ",".join([LOOPBACK_CIDRS, *(f"{a}/{128 if ':' in a else 32}" for a in addresses)])
