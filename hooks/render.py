"""`praesto render`: print the children and status the hooks would produce, offline.

Users can check a ModelCache (and CI can unit-test one) without a cluster:
the same pure `sync` the controller runs, fed a first-sync request built from
the files given. Output is multi-document YAML: every child, then the
ModelCache itself carrying the status the hook would write.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from praesto.hooks import hook_protocol
from praesto.hooks.common import parse_time
from praesto.hooks.config import ConfigError, HooksConfig
from praesto.hooks.modelcache import parse_parent, sync

from praesto import names
from praesto.cliargs import CommandParser
from praesto.spec import InvalidSpec


class RenderError(Exception):
    """A problem with the input files: says which file and what to do."""


def _documents(path: str) -> list[Any]:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as err:
        raise RenderError(f"{path}: cannot read: {err.strerror or err}") from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        raise RenderError(f"{path}: is not valid YAML: {err}") from None
    out: list[Any] = []
    for doc in docs:
        # `kubectl get ... -o yaml` writes a List; accept it as well as plain documents.
        if isinstance(doc, dict) and str(doc.get("kind", "")).endswith("List") and "items" in doc:
            out.extend(doc.get("items") or [])
        else:
            out.append(doc)
    return out


def _of_kind(docs: Iterable[Any], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if isinstance(d, dict) and d.get("kind") == kind]


def load_modelcaches(path: str) -> list[dict[str, Any]]:
    caches = _of_kind(_documents(path), names.MODELCACHE_KIND)
    if not caches:
        raise RenderError(
            f"{path}: contains no object of kind {names.MODELCACHE_KIND}; "
            f"give a file with apiVersion: {names.API_VERSION} and kind: {names.MODELCACHE_KIND}"
        )
    for cache in caches:
        if cache.get("apiVersion") != names.API_VERSION:
            raise RenderError(
                f"{path}: apiVersion: Unsupported value: {cache.get('apiVersion')!r}: use {names.API_VERSION}"
            )
        meta = cache.get("metadata")
        if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
            raise RenderError(f"{path}: metadata.name: Required value: name the ModelCache")
        meta.setdefault("namespace", "default")
        meta.setdefault("generation", 1)
    return caches


def load_nodes(path: str | None) -> list[dict[str, Any]]:
    if path is None:
        return []
    docs = _documents(path)
    nodes = _of_kind(docs, "Node")
    if len(nodes) != len(docs):
        raise RenderError(f"{path}: every document must be a Node (or a List of Nodes, as kubectl writes)")
    for node in nodes:
        if not isinstance(node.get("metadata"), dict) or not node["metadata"].get("name"):
            raise RenderError(f"{path}: a Node without metadata.name; give each Node a name")
    return nodes


def request_for(cache: dict[str, Any], nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """The request Metacontroller sends on the first sync: no children yet."""
    return {
        "controller": {},
        "parent": cache,
        "children": {
            key: {}
            for key in (
                hook_protocol.MODELCACHENODE,
                hook_protocol.PVC,
                hook_protocol.JOB,
                hook_protocol.ROLE,
                hook_protocol.ROLEBINDING,
            )
        },
        "related": {
            hook_protocol.NODE: {n["metadata"]["name"]: n for n in nodes},
            hook_protocol.POD: {},
        },
        "finalizing": False,
    }


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = CommandParser(
        prog="praesto render",
        description="Print the children and status the Praesto hooks would produce for a ModelCache.",
    )
    parser.add_argument("-f", "--filename", required=True, help="ModelCache YAML file ('-' for stdin)")
    parser.add_argument("--nodes", help="Nodes YAML (e.g. kubectl get nodes -o yaml) for local mode")
    parser.add_argument("--now", help="evaluate at this RFC 3339 time instead of the current time")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    now = datetime.now(UTC)
    if args.now:
        parsed = parse_time(args.now)
        if parsed is None:
            print(f"praesto render: --now: Invalid value: {args.now!r}: use RFC 3339", file=sys.stderr)
            return 2
        now = parsed
    try:
        config = HooksConfig.from_env()
        caches = load_modelcaches(args.filename)
        nodes = load_nodes(args.nodes)
    except (RenderError, ConfigError) as err:
        print(f"praesto render: {err}", file=sys.stderr)
        return 2
    failed = False
    out: list[Any] = []
    for cache in caches:
        try:
            parse_parent(cache)
        except InvalidSpec as err:
            failed = True
            for error in err.errors:
                print(f"praesto render: ModelCache {cache['metadata']['name']}: {error}", file=sys.stderr)
            continue
        response = sync(request_for(cache, nodes), config, now)
        out.extend(response["children"])
        out.append({**cache, "status": response["status"]})
    yaml.safe_dump_all(out, sys.stdout, sort_keys=False, default_flow_style=False)
    return 1 if failed else 0
