"""OCI sources on the real control plane (#26): a ModelPack artifact in a registry that requires
auth (the CNCF distribution registry over TLS with token auth, the artifact pushed by the ORAS CLI)
becomes a Ready cache on two nodes; the login is the cache's own kubernetes.io/dockerconfigjson
Secret, read by the agents through the per-cache grant; the tag is pinned to the manifest digest;
the registry serves the model's bytes once: the second node joins the pool once the first holds
the model and copies it from that peer. (Two nodes starting the same second may both read the
origin: limiting that is the chart's `originBudget`, tested in test_origin_budget.py.)"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.dynamic.exceptions import DynamicApiError

from praesto import names
from praesto.store import StoreLayout
from testkit.metacontroller import CompositeController, gone
from testkit.oci_artifacts import Layer, push_files, push_modelpack
from testkit.ports import free_port
from testkit.registry import Registry, docker_config
from testkit.registry_token import Grants
from tests.cluster.agents import AgentProcess
from tests.cluster.flows import merge_patch, phase_is
from tests.cluster.installed import Installed
from tests.cluster.tenants import modelcache, opted_in_namespace, ready_node
from tests.download.conftest import tree_of

Obj = dict[str, Any]
NS = "oci-models"
POOL = "test.praesto.io/oci-pool"
NODES = ("oci-a", "oci-b")
READER = ("puller", "puller-password")
LAYERS = [
    Layer("model.safetensors", os.urandom(6 << 20)),
    Layer("config.json", b'{"model_type": "llama"}', kind="weight.config"),
    Layer("tokenizer.json", b'{"version": "1.0"}' * 500, kind="weight.config"),
]


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    grants = Grants(
        users={"pusher": ("push-pw", {"team/llama": {"pull", "push"}, "team/public": {"pull", "push"}}),
               READER[0]: (READER[1], {"team/llama": {"pull"}})},
        anonymous={"team/public": {"pull"}},
    )  # fmt: skip
    with Registry(tmp_path_factory.mktemp("registry"), tls=True, grants=grants) as running:
        yield running


def ready_on(count: int) -> Callable[[Obj | None], bool]:
    """For `composite.wait_parent`: Ready with `count` of `count` selected nodes holding the model."""

    def done(parent: Obj | None) -> bool:
        status = (parent or {}).get("status") or {}
        return status.get("phase") == names.PHASE_READY and (
            status.get("readyNodes"),
            status.get("totalNodes"),
        ) == (count, count)

    return done


def test_a_modelpack_artifact_behind_token_auth_is_ready_on_two_nodes_read_from_the_registry_once(
    installed: Installed, registry: Registry, composite: CompositeController, tmp_path: Path
) -> None:
    digest = push_modelpack(
        registry, "team/llama", "1.0", LAYERS, tmp_path / "push", user=("pusher", "push-pw")
    )
    opted_in_namespace(installed.admin, NS)
    client.CoreV1Api(installed.admin.api).create_namespaced_secret(
        NS,
        {
            "metadata": {"name": "regcred"},
            "type": "kubernetes.io/dockerconfigjson",
            "data": {
                names.DOCKER_CONFIG_KEY: base64.b64encode(docker_config(registry, *READER).encode()).decode()
            },
        },
    )
    first, late = NODES
    ready_node(installed.admin, first, {POOL: "oci"})
    ready_node(installed.admin, late)  # not in the pool yet
    with ExitStack() as stack:
        agents = {
            node: stack.enter_context(
                AgentProcess(installed, node, "http://127.0.0.1:9", tmp_path / node,
                             (f"--ca-bundle={registry.ca_path}",), peer_port=free_port())
            )
            for node in NODES
        }  # fmt: skip
        installed.admin.create(
            modelcache(
                "llama", NS, node_selector={POOL: "oci"},
                source={"oci": {"reference": registry.reference("team/llama", "1.0")}, "secretRef": {"name": "regcred"}},
            )
        )  # fmt: skip
        ready = composite.wait_parent(NS, "llama", phase_is(names.PHASE_READY), deadline=120)
        assert (ready or {})["status"]["resolvedRevision"] == digest  # the tag, pinned for every later node
        ready_node(installed.admin, late, {POOL: "oci"})  # joins the pool: the cache selects it too
        ready = composite.wait_parent(NS, "llama", ready_on(2), deadline=120)
        status = (ready or {})["status"]
        assert status["resolvedRevision"] == digest, status
        for node, agent in agents.items():
            assert tree_of(StoreLayout(agent.base).cache_dir(NS, "llama")) == {
                x.path: x.data for x in LAYERS
            }, node
        model_bytes = sum(len(x.data) for x in LAYERS)
        assert registry.blob_bytes("team/llama") == model_bytes, [a.log()[-3000:] for a in agents.values()]
        assert READER[1] not in "".join(a.log() for a in agents.values())
        installed.admin.delete(names.API_VERSION, names.MODELCACHE_KIND, "llama", NS)
        composite.wait_parent(NS, "llama", gone, deadline=60)


def test_an_oras_pushed_artifact_of_files_and_a_folder_is_ready_without_a_login(
    installed: Installed, registry: Registry, composite: CompositeController, tmp_path: Path
) -> None:
    """The other format: `oras push` files and a folder (one tar+gzip layer, unpacked), pulled
    anonymously (the registry grants anonymous pull on this repository); no Secret, no grant."""
    files = {
        "weights.bin": os.urandom(1 << 20),
        "tokenizer/vocab.txt": b"a\nb\n",
        "tokenizer/merges.txt": b"ab",
    }
    push_files(registry, "team/public", "v1", files, tmp_path / "push", user=("pusher", "push-pw"),
               folders=("tokenizer",))  # fmt: skip
    opted_in_namespace(installed.admin, NS)
    ready_node(installed.admin, "oci-c", {POOL: "public"})
    with AgentProcess(
        installed, "oci-c", "http://127.0.0.1:9", tmp_path / "oci-c", (f"--ca-bundle={registry.ca_path}",)
    ) as agent:
        installed.admin.create(
            modelcache("public", NS, node_selector={POOL: "public"}, source={"uri": f"oci://{registry.reference('team/public', 'v1')}"})
        )  # fmt: skip
        composite.wait_parent(NS, "public", phase_is(names.PHASE_READY), deadline=90)
        assert tree_of(StoreLayout(agent.base).cache_dir(NS, "public")) == files
        assert (
            installed.admin.get(
                "rbac.authorization.k8s.io/v1", "Role", names.secret_reader_role_name("public"), NS
            )
            is None
        )
        installed.admin.delete(names.API_VERSION, names.MODELCACHE_KIND, "public", NS)
        composite.wait_parent(NS, "public", gone, deadline=60)


def test_a_new_tag_rolls_beside_the_old_one_and_only_the_changed_layer_is_read(
    installed: Installed, registry: Registry, composite: CompositeController, tmp_path: Path
) -> None:
    """A rolling update of an OCI source (#25 part 1): the reference's tag changes, the registry
    and repository may not. The unchanged weight layer is shared by content; the registry
    serves only the changed one, and the cache serves the new digest afterwards."""
    weights, old_tokenizer, new_tokenizer = os.urandom(2 << 20), b'{"v": 1}' * 300, b'{"v": 2}' * 400
    pushed = {
        tag: push_modelpack(registry, "team/public", tag,
                            [Layer("model.safetensors", weights), Layer("tokenizer.json", tokenizer, kind="weight.config")],
                            tmp_path / tag, user=("pusher", "push-pw"))
        for tag, tokenizer in (("r1", old_tokenizer), ("r2", new_tokenizer))
    }  # fmt: skip
    opted_in_namespace(installed.admin, NS)
    ready_node(installed.admin, "oci-d", {POOL: "roll"})
    with AgentProcess(
        installed, "oci-d", "http://127.0.0.1:9", tmp_path / "oci-d", (f"--ca-bundle={registry.ca_path}",)
    ) as agent:
        source = {"oci": {"reference": registry.reference("team/public", "r1")}}
        installed.admin.create(modelcache("rolls", NS, node_selector={POOL: "roll"}, source=source))
        composite.wait_parent(NS, "rolls", serving(pushed["r1"]), deadline=90)

        def ask(reference: str) -> None:
            body = {"spec": {"source": {"oci": {"reference": reference}}}}
            merge_patch(installed.admin, names.API_VERSION, names.MODELCACHE_KIND, "rolls", body, NS)

        with pytest.raises(DynamicApiError) as refused:  # another repository is another cache
            ask(registry.reference("team/llama", "r1"))
        assert "immutable but for its revision" in str(refused.value.body)

        served_before = registry.blob_bytes("team/public")
        ask(registry.reference("team/public", "r2"))
        composite.wait_parent(NS, "rolls", serving(pushed["r2"]), deadline=90)
        cache_dir = StoreLayout(agent.base).cache_dir(NS, "rolls")
        assert tree_of(cache_dir) == {"model.safetensors": weights, "tokenizer.json": new_tokenizer}
        read = registry.blob_bytes("team/public") - served_before
        assert len(new_tokenizer) <= read < len(new_tokenizer) + 4096, read  # the changed layer (+ config)
        installed.admin.delete(names.API_VERSION, names.MODELCACHE_KIND, "rolls", NS)
        composite.wait_parent(NS, "rolls", gone, deadline=60)


def serving(digest: str) -> Callable[[Obj | None], bool]:
    """For `composite.wait_parent`: Ready, serving `digest` on every selected node, not rolling."""

    def done(parent: Obj | None) -> bool:
        status = (parent or {}).get("status") or {}
        return (
            status.get("phase") == names.PHASE_READY
            and status.get("resolvedRevision") == digest
            and "nextRevision" not in status
            and status.get("readyNodes") == status.get("totalNodes")
        )

    return done
