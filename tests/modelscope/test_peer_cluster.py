"""Two full node agents on loopback addresses and the local ModelScope hub: a node selected later
copies the whole model from its peer. Every ModelScope file carries the hub's sha256, so every
file may come from a peer (a Hub file known only by its git SHA-1 may not: tests/peers)."""

from __future__ import annotations

import base64
import functools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from praesto.agent.logs import configure
from praesto.agent.settings import AgentSettings

from praesto import names
from testkit import peer_cluster
from testkit.agent_harness import MCN, rbac_violations, ready_condition
from testkit.kube_real import RealKube
from testkit.modelscope_hub import ModelScopeHub
from testkit.objects import modelcachenode
from testkit.peer_cluster import NAMESPACE, Cluster

FILES = {
    "configuration.json": b'{"framework": "pytorch"}',
    "model.safetensors": os.urandom(3 << 20),
    "tokenizer/tokenizer.json": os.urandom(300_000),
}
TOTAL = sum(len(d) for d in FILES.values())
TOKEN = "ms-pEeRtOkEn5566778899"
OTHER = "team-b"


@pytest.fixture
def c(tmp_path: Path, kube: RealKube, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    with ModelScopeHub(tmp_path / "hub") as hub:
        # each agent as `praesto-agent run` with MODELSCOPE_ENDPOINT set (agent/settings.py)
        settings = functools.partial(AgentSettings, modelscope_endpoint=hub.endpoint)
        monkeypatch.setattr(peer_cluster, "AgentSettings", settings)
        made = Cluster(kube, hub, tmp_path)
        configure("DEBUG", made.log)
        hub.add_repo("org/tiny", FILES)
        try:
            yield made
        finally:
            made.stop()
    assert rbac_violations(kube.requests) == []


def _select(c: Cluster, node: str) -> None:
    source = {"uri": "ms://org/tiny", "revision": "master"}
    c.kube.create(modelcachenode("tiny", node, NAMESPACE, source=source))


def test_a_node_selected_later_copies_every_file_from_its_peer(c: Cluster) -> None:
    c.start("node-a")
    _select(c, "node-a")
    c.wait_ready("tiny", ["node-a"])
    c.hub.reset_counters()
    c.start("node-b")
    _select(c, "node-b")
    c.wait_ready("tiny", ["node-b"])
    assert c.files("tiny", "node-b") == FILES
    assert c.hub.bytes_served == 0  # the hub answered the file list only
    assert c.status("tiny", "node-b")["bytesFromPeers"] == TOTAL
    assert c.status("tiny", "node-b")["phase"] == names.PHASE_READY


def test_a_peer_never_serves_another_namespaces_private_copy_to_a_cache_without_its_token(c: Cluster) -> None:
    """Node-a holds team-a's copy of a private repo (its own token). Team-b's cache of that repo on
    node-b, with no token, is Unauthorized by the hub: its plan never exists, so node-b asks no peer
    and node-a's copy reaches nothing of team-b's."""
    c.hub.add_repo("org/secret", FILES, private=True)
    c.hub.tokens.add(TOKEN)
    c.kube.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ms-token", "namespace": NAMESPACE},
                   "data": {names.ENV_MODELSCOPE_TOKEN: base64.b64encode(TOKEN.encode()).decode()}})  # fmt: skip
    ref = {"name": "ms-token", "key": names.ENV_MODELSCOPE_TOKEN}
    c.start("node-a")
    c.start("node-b")
    c.kube.create(modelcachenode("secret", "node-a", NAMESPACE,
                                 source={"uri": "ms://org/secret", "revision": "master", "secretRef": ref}))  # fmt: skip
    c.wait_ready("secret", ["node-a"])
    c.hub.reset_counters()
    c.kube.create(
        modelcachenode("secret", "node-b", OTHER, source={"uri": "ms://org/secret", "revision": "master"})
    )
    name = names.modelcachenode_name("secret", "node-b")

    def reason() -> str:
        status = (c.kube.get(MCN, name, OTHER) or {}).get("status") or {}
        return str(ready_condition(status).get("reason"))

    c.kube.wait_until(lambda: reason() == "Unauthorized", 30.0, "team-b's copy Unauthorized")
    status = (c.kube.get(MCN, name, OTHER) or {}).get("status") or {}
    assert status.get("phase") == names.PHASE_FAILED and not status.get("bytesFromPeers")
    assert c.hub.bytes_served == 0
    dest = c.nodes["node-b"].layout.cache_dir(OTHER, "secret")
    assert not dest.exists() or not any(p.is_file() for p in dest.rglob("*"))
    assert TOKEN not in c.log.getvalue()
