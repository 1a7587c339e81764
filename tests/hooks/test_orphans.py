"""Which node copies praesto-hooks releases: only those being deleted, held by the agent, on a vanished Node."""

from __future__ import annotations

from typing import Any

from praesto.hooks import orphans
from praesto.hooks.server import gunicorn_options, parse_args

from praesto import names


def copy(
    node: str, *, deleting: bool = True, finalizers: tuple[str, ...] = (names.FINALIZER_NODE_AGENT,)
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": f"c-{node}",
        "namespace": "t",
        "resourceVersion": "7",
        "finalizers": list(finalizers),
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-12-03T00:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": node}}


def test_only_deleting_agent_held_copies_of_vanished_nodes() -> None:
    live = {"alive"}
    copies = [
        copy("gone"),
        copy("alive"),
        copy("gone", deleting=False),
        copy("gone", finalizers=("other.example/finalizer",)),
    ]
    assert orphans.orphaned(copies, lambda n: n in live) == [copies[0]]


def test_release_drops_only_our_finalizer_and_is_conditional() -> None:
    held = copy("gone", finalizers=("a.example/x", names.FINALIZER_NODE_AGENT))
    assert orphans.release_patch(held) == {
        "metadata": {"finalizers": ["a.example/x"], "resourceVersion": "7"}
    }


def test_the_flag_runs_the_releaser_beside_gunicorn() -> None:
    options = gunicorn_options(parse_args(["--release-orphaned-copies"]))
    assert callable(options["when_ready"]) and callable(options["on_exit"])
    assert "when_ready" not in gunicorn_options(parse_args([]))
