"""Issue 21 item 4: the per-cache Secret grant exists only while some node copy needs the Secret.

Before, the Role + RoleBinding (get on the cache's token Secret, bound to the
node agents' ServiceAccount) lived as long as the cache: every node's agent
could read the token for ever, including nodes that hold no copy. RBAC cannot
scope a grant to one node (all agents share one ServiceAccount), so the window
in time is what the hook can narrow: a copy not yet made, pending, downloading
or failed (retrying) needs it; Ready and Evicted copies do not.
"""

from __future__ import annotations

from typing import Any

import pytest
from praesto.hooks.modelcache import sync

from praesto import names
from testkit.hook_objects import NOW, cache_node, mcn, modelcache, node_status, sync_request
from tests.hooks.golden import CONFIG

CACHE = "private"
NODES = ("node-a", "node-b")


def grant_kinds(statuses: dict[str, str | None]) -> list[str]:
    """Kinds of the grant objects one sync returns, with copies on NODES in these phases (None: no
    status yet; a node missing from `statuses` has no ModelCacheNode yet)."""
    token = {"secretRef": {"name": "hf-token", "key": "token"}}
    parent = modelcache(CACHE, spec={"source": {"huggingface": {"repo": "org/private", "token": token}},
                                     "storage": {"size": "1Gi"}})  # fmt: skip
    copies = [mcn(CACHE, n, node_status(p) if p else None) for n, p in statuses.items()]
    request = sync_request(parent, nodes=[cache_node(n) for n in NODES], children=copies)
    children: list[dict[str, Any]] = sync(request, CONFIG, NOW)["children"]
    return sorted(c["kind"] for c in children if c["kind"] in ("Role", "RoleBinding"))


GRANT = ["Role", "RoleBinding"]


@pytest.mark.parametrize(
    ("statuses", "granted"),
    [
        ({}, True),  # no copy made yet
        ({"node-a": None, "node-b": None}, True),  # made, not reported yet
        ({"node-a": names.PHASE_READY, "node-b": names.PHASE_DOWNLOADING}, True),
        ({"node-a": names.PHASE_READY, "node-b": names.PHASE_PENDING}, True),  # e.g. WaitingForSecret
        ({"node-a": names.PHASE_READY, "node-b": names.PHASE_FAILED}, True),  # retrying
        ({"node-a": names.PHASE_READY}, True),  # node-b joined: its copy is not made yet
        ({"node-a": names.PHASE_READY, "node-b": names.PHASE_READY}, False),
        ({"node-a": names.PHASE_READY, "node-b": names.PHASE_EVICTED}, False),
    ],
)
def test_the_grant_exists_only_while_a_copy_needs_the_secret(
    statuses: dict[str, str | None], granted: bool
) -> None:
    assert grant_kinds(statuses) == (GRANT if granted else [])
