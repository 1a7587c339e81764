"""`praesto-agent run` flags for the cluster-wide origin budget (chart `originBudget`), the
`BudgetConfig` they make, and building the budget from it.

The flags' environment defaults come from the mapping the process edge hands in (agent/cli.py
main); this module never reads the environment itself. The agent's settings (agent/settings.py)
hold the checked `BudgetConfig` as their `origin_budget` section; `build_budget` takes that section.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from praesto.agent.budget import slots
from praesto.agent.budget.leases import LeaseApi
from praesto.agent.budget.origin_budget import BudgetConfig, OriginBudget

from praesto import names
from praesto.kubeerrors import Groups
from praesto.quantity import QuantityError, parse_quantity


def add_budget_arguments(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """The --origin-budget-* flags, each defaulting to its variable in `environ` (the flag wins)."""
    env = environ.get
    add = parser.add_argument
    add("--origin-budget-namespace", default=env("PRAESTO_ORIGIN_BUDGET_NAMESPACE", ""),
        help="namespace of the origin budget's Leases (the release's); empty disables the budget")  # fmt: skip
    add("--origin-budget-max-nodes", type=int, default=env("PRAESTO_ORIGIN_BUDGET_MAX_NODES") or str(BudgetConfig.max_nodes),
        help="nodes that may pull from the origin at once, cluster-wide; 0 is no limit (default %(default)s)")  # fmt: skip
    add("--origin-budget-per-host", type=int, default=env("PRAESTO_ORIGIN_BUDGET_PER_HOST") or str(BudgetConfig.per_host),
        help="nodes that may pull from one source host at once; 0 is no limit (default %(default)s)")  # fmt: skip
    add("--origin-budget-bytes-per-second", default=env("PRAESTO_ORIGIN_BUDGET_BYTES_PER_SECOND", str(BudgetConfig.bytes_per_second)),
        help="the cluster's origin bytes/s, a quantity (1Gi); each slot holder gets an equal share; 0 is none")  # fmt: skip
    add("--origin-budget-lease-seconds", type=int, default=env("PRAESTO_ORIGIN_BUDGET_LEASE_SECONDS") or str(BudgetConfig.lease_seconds),
        help="a slot whose holder stops renewing it frees after this long (default %(default)s)")  # fmt: skip
    add("--origin-budget-max-retry-after-seconds", type=int,
        default=env("PRAESTO_ORIGIN_BUDGET_MAX_RETRY_AFTER_SECONDS") or f"{BudgetConfig.max_retry_after:g}",
        help="the longest Retry-After one node's origin may impose on every node (default %(default)s)")  # fmt: skip
    add("--origin-budget-poll-seconds", type=float, default=env("PRAESTO_ORIGIN_BUDGET_POLL_SECONDS") or f"{BudgetConfig.poll_seconds:g}",
        help="how often a waiting node looks at the slots again (default %(default)s)")  # fmt: skip


def check_budget_arguments(args: argparse.Namespace) -> str | None:
    """The first problem with the origin budget flags, with its fix, or None."""
    if not args.origin_budget_namespace:
        return None
    if not names.is_dns_label(args.origin_budget_namespace):
        return f"--origin-budget-namespace: {args.origin_budget_namespace!r} is not a namespace name"
    if args.origin_budget_max_nodes < 0 or args.origin_budget_per_host < 0:
        return "--origin-budget-max-nodes and --origin-budget-per-host: must be 0 (no limit) or more"
    if args.origin_budget_lease_seconds < 3:
        return f"--origin-budget-lease-seconds: {args.origin_budget_lease_seconds} is under 3; use e.g. 30"
    if args.origin_budget_max_retry_after_seconds < 1:
        return "--origin-budget-max-retry-after-seconds: must be 1 or more; use e.g. 600"
    node = str(getattr(args, "node_name", "") or "")  # the daemon's flag (absent in a budget-only parser)
    if not slots.claim_name_fits(node):
        return (
            f"--node-name: {node!r} is too long for the origin budget's Lease names "
            "(praesto-origin-<group>.<node>, 253 characters); turn originBudget off for such nodes"
        )
    if not args.origin_budget_poll_seconds > 0:
        return "--origin-budget-poll-seconds: must be more than 0 seconds"
    try:
        rate = parse_quantity(str(args.origin_budget_bytes_per_second))
    except QuantityError as err:
        return (
            f"--origin-budget-bytes-per-second: {err}; use bytes/s as a quantity such as 1Gi, or 0 for none"
        )
    if rate < 0:
        return "--origin-budget-bytes-per-second: must be 0 (none) or more"
    if rate and not args.origin_budget_max_nodes:
        return (
            "--origin-budget-bytes-per-second needs --origin-budget-max-nodes: each of that many "
            "nodes gets an equal share of the rate (chart originBudget.maxNodes)"
        )
    return None


def budget_config(args: argparse.Namespace) -> BudgetConfig | None:
    """The checked origin budget flags (`check_budget_arguments` found no problem) as a
    `BudgetConfig`, or None when the chart did not enable the budget."""
    if not args.origin_budget_namespace:
        return None
    return BudgetConfig(
        namespace=args.origin_budget_namespace,
        max_nodes=args.origin_budget_max_nodes,
        per_host=args.origin_budget_per_host,
        bytes_per_second=int(parse_quantity(str(args.origin_budget_bytes_per_second))),
        lease_seconds=args.origin_budget_lease_seconds,
        poll_seconds=args.origin_budget_poll_seconds,
        max_retry_after=float(args.origin_budget_max_retry_after_seconds),
    )


def build_budget(config: BudgetConfig | None, api: Groups, node_name: str) -> OriginBudget | None:
    """The agent's origin budget from its settings' `origin_budget` section, or None when off."""
    if config is None:
        return None
    return OriginBudget(config, LeaseApi(api, config.namespace), node_name)
