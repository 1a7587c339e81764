"""`praesto-agent run` flags for peer-to-peer distribution, and building `Peering` from them."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from kubernetes import client
from praesto.agent.peers.auth import SecretError, load_secret
from praesto.agent.peers.peering import PeerConfig, Peering
from praesto.agent.peers.server import Limits

from praesto import names
from praesto.quantity import QuantityError, parse_quantity
from praesto.store import StoreLayout

DEFAULT_SECRET_FILE = "/var/run/secrets/praesto/peer/secret"  # noqa: S105 - a path, not a secret
DEFAULT_TOKEN_FILE = "/var/run/secrets/praesto/peer-token/token"  # noqa: S105 - a path, not a token


def add_peer_arguments(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    add = parser.add_argument
    add("--peer-port", type=int, default=env("PRAESTO_PEER_PORT") or "0",
        help="port serving Ready caches to other agents; 0 disables peers (default %(default)s)")  # fmt: skip
    add("--peer-address", default=env("POD_IP"),
        help="address other agents reach this one on (env POD_IP, from the downward API)")  # fmt: skip
    add("--peer-secret-file", default=env("PRAESTO_PEER_SECRET_FILE", DEFAULT_SECRET_FILE),
        help="shared secret signing peer requests (the chart's peer Secret)")  # fmt: skip
    add("--peer-token-file", default=env("PRAESTO_PEER_TOKEN_FILE", DEFAULT_TOKEN_FILE),
        help="this Pod's projected ServiceAccount token with audience praesto-peer (its node identity)")  # fmt: skip
    add("--peer-service-account", default=env("PRAESTO_PEER_SERVICE_ACCOUNT", ""),
        help="<namespace>/<name> of the agent ServiceAccount: peers must present its tokens")  # fmt: skip
    add("--peer-max-connections", type=int, default=env("PRAESTO_PEER_MAX_CONNECTIONS") or "128",
        help="open connections the peer server keeps; more get 503 (default %(default)s)")  # fmt: skip
    add("--peer-idle-timeout", type=float, default=env("PRAESTO_PEER_IDLE_TIMEOUT") or "30",
        help="seconds a peer connection may stay silent before it is closed (default %(default)s)")  # fmt: skip
    add("--peer-max-uploads", type=int, default=env("PRAESTO_PEER_MAX_UPLOADS") or "8",
        help="concurrent uploads to other agents (default %(default)s)")  # fmt: skip
    add("--peer-upload-rate", default=env("PRAESTO_PEER_UPLOAD_RATE", "0"),
        help="bytes/s all uploads may use together, a quantity (500Mi); 0 is unlimited")  # fmt: skip


def check_peer_arguments(args: argparse.Namespace) -> str | None:
    """The first problem with the peer flags, with its fix, or None."""
    if not args.peer_port:
        return None
    if not 0 < args.peer_port <= 65535:
        return f"--peer-port: {args.peer_port} is not a port; use 1-65535, or 0 to disable peers"
    if not args.peer_address:
        return "--peer-address: Required value with --peer-port; set POD_IP (fieldRef status.podIP)"
    if args.peer_max_uploads < 1:
        return "--peer-max-uploads: must be at least 1"
    if args.peer_max_connections < args.peer_max_uploads:
        return "--peer-max-connections: must be at least --peer-max-uploads"
    if not args.peer_idle_timeout > 0:
        return "--peer-idle-timeout: must be more than 0 seconds"
    namespace, _, name = str(args.peer_service_account).partition("/")
    if not (names.is_dns_label(namespace) and name and "/" not in name):
        return (
            f"--peer-service-account: {args.peer_service_account!r} is not <namespace>/<name>; "
            "the chart sets it to the agent ServiceAccount"
        )
    try:
        if parse_quantity(str(args.peer_upload_rate)) < 0:
            raise QuantityError("negative")
    except QuantityError as err:
        return f"--peer-upload-rate: {err}; use bytes/s as a quantity such as 500Mi, or 0 for no cap"
    return None


def build_peering(args: argparse.Namespace, api: client.ApiClient, layout: StoreLayout) -> Peering | None:
    """The agent's `Peering`, or None when peers are disabled; raises `auth.SecretError`.

    The token file is read once here, so a missing projection fails at start, not at the first peer.
    """
    if not args.peer_port:
        return None
    host = str(args.peer_address)
    shown = f"[{host}]" if ":" in host else host  # IPv6 pod IPs
    config = PeerConfig(
        address=f"{shown}:{args.peer_port}",
        secret=load_secret(Path(args.peer_secret_file)),
        token_file=Path(args.peer_token_file),
        service_account=str(args.peer_service_account),
        bind=("::" if ":" in host else "0.0.0.0", args.peer_port),
        limits=Limits(
            args.peer_max_uploads,
            int(parse_quantity(str(args.peer_upload_rate))),
            max_connections=args.peer_max_connections,
            idle_seconds=args.peer_idle_timeout,
        ),
    )
    peering = Peering(config, api, args.node_name, layout)
    try:
        peering.credentials.token()
    except SecretError:
        peering.server.server_close()
        raise
    return peering
