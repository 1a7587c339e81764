"""`praesto-agent run` flags for peer-to-peer distribution, the `PeerConfig` they make, and `Peering`.

The flags' environment defaults come from the mapping the process edge hands in (agent/cli.py
main); this module never reads the environment itself. The agent's settings (agent/settings.py)
hold the checked `PeerConfig` as their `peers` section; `build_peering` takes that section.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from praesto.agent.peers.auth import Pod
from praesto.agent.peers.limits import Limits
from praesto.agent.peers.peering import PeerConfig, Peering

from praesto import names
from praesto.kubeerrors import Groups
from praesto.quantity import QuantityError, parse_quantity
from praesto.store import StoreLayout

DEFAULTS = Limits()
ENV_POD_IP = "POD_IP"  # the downward API's status.podIP: --peer-address


def add_peer_arguments(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """The --peer-* flags, each defaulting to its variable in `environ` (the flag wins)."""
    env = environ.get
    add = parser.add_argument
    add("--peer-port", type=int, default=env("PRAESTO_PEER_PORT") or "0",
        help="port serving Ready caches to other agents; 0 disables peers (default %(default)s)")  # fmt: skip
    add("--peer-address", default=env(ENV_POD_IP),
        help=f"address other agents reach this one on (env {ENV_POD_IP}, from the downward API)")  # fmt: skip
    add("--pod-name", default=env("POD_NAME", ""),
        help="this agent Pod's name (env POD_NAME, downward API): peer tokens are bound to it")  # fmt: skip
    add("--pod-uid", default=env("POD_UID", ""),
        help="this agent Pod's UID (env POD_UID, downward API): peer tokens are bound to it")  # fmt: skip
    add("--peer-service-account", default=env("PRAESTO_PEER_SERVICE_ACCOUNT", ""),
        help="<namespace>/<name> of the agent ServiceAccount: peers must present its tokens")  # fmt: skip
    add("--peer-max-connections", type=int, default=env("PRAESTO_PEER_MAX_CONNECTIONS") or str(DEFAULTS.max_connections),
        help="open connections the peer server keeps; more get 503 (default %(default)s)")  # fmt: skip
    add("--peer-max-connections-per-client", type=int,
        default=env("PRAESTO_PEER_MAX_CONNECTIONS_PER_CLIENT") or str(DEFAULTS.max_connections_per_client),
        help="open connections one client address may hold; more get 429 (default %(default)s)")  # fmt: skip
    add("--peer-idle-timeout", type=float, default=env("PRAESTO_PEER_IDLE_TIMEOUT") or str(DEFAULTS.idle_seconds),
        help="seconds a peer connection may stay silent before it is closed (default %(default)s)")  # fmt: skip
    add("--peer-request-timeout", type=float,
        default=env("PRAESTO_PEER_REQUEST_TIMEOUT") or str(DEFAULTS.request_seconds),
        help="seconds a request's head may take to arrive whole, however it is paced (default %(default)s)")  # fmt: skip
    add("--peer-min-send-rate", default=env("PRAESTO_PEER_MIN_SEND_RATE") or str(DEFAULTS.min_send_rate),
        help="bytes/s, a quantity (256Ki): a response sent slower on average, after --peer-idle-timeout "
        "of grace, is cut; 0 never cuts (default %(default)s)")  # fmt: skip
    add("--peer-max-uploads", type=int, default=env("PRAESTO_PEER_MAX_UPLOADS") or str(DEFAULTS.max_uploads),
        help="concurrent uploads to other agents (default %(default)s)")  # fmt: skip
    add("--peer-upload-rate", default=env("PRAESTO_PEER_UPLOAD_RATE", str(DEFAULTS.rate)),
        help="bytes/s all uploads may use together, a quantity (500Mi); 0 is unlimited")  # fmt: skip


def check_peer_arguments(args: argparse.Namespace) -> str | None:
    """The first problem with the peer flags, with its fix, or None."""
    if not args.peer_port:
        return None
    if not 0 < args.peer_port <= 65535:
        return f"--peer-port: {args.peer_port} is not a port; use 1-65535, or 0 to disable peers"
    if not args.peer_address:
        return f"--peer-address: Required value with --peer-port; set {ENV_POD_IP} (fieldRef status.podIP)"
    if args.peer_max_uploads < 1:
        return "--peer-max-uploads: must be at least 1"
    if args.peer_max_connections < args.peer_max_uploads:
        return "--peer-max-connections: must be at least --peer-max-uploads"
    if not 1 <= args.peer_max_connections_per_client <= args.peer_max_connections:
        return (
            f"--peer-max-connections-per-client: {args.peer_max_connections_per_client} must be from 1 to "
            f"--peer-max-connections ({args.peer_max_connections})"
        )
    if not args.peer_idle_timeout > 0:
        return "--peer-idle-timeout: must be more than 0 seconds"
    if not args.peer_request_timeout > 0:
        return "--peer-request-timeout: must be more than 0 seconds, e.g. 10"
    namespace, _, name = str(args.peer_service_account).partition("/")
    if not (names.is_dns_label(namespace) and name and "/" not in name):
        return (
            f"--peer-service-account: {args.peer_service_account!r} is not <namespace>/<name>; "
            "the chart sets it to the agent ServiceAccount"
        )
    pod_fields = (("--pod-name", args.pod_name, "metadata.name"), ("--pod-uid", args.pod_uid, "metadata.uid"))
    for flag, value, field in pod_fields:
        if not value:
            return (
                f"{flag}: Required value with --peer-port (peer tokens are bound to this Pod); "
                f"set it from the downward API (fieldRef {field})"
            )
    for flag, value in (
        ("--peer-upload-rate", args.peer_upload_rate),
        ("--peer-min-send-rate", args.peer_min_send_rate),
    ):
        try:
            if parse_quantity(str(value)) < 0:
                raise QuantityError("negative")
        except QuantityError as err:
            return f"{flag}: {err}; use bytes/s as a quantity such as 500Mi, or 0 for none"
    return None


def peer_config(args: argparse.Namespace) -> PeerConfig | None:
    """The checked peer flags (`check_peer_arguments` found no problem) as a `PeerConfig`, or None
    when peers are disabled (--peer-port 0)."""
    if not args.peer_port:
        return None
    host = str(args.peer_address)
    shown = f"[{host}]" if ":" in host else host  # IPv6 pod IPs
    namespace, _, name = str(args.peer_service_account).partition("/")
    return PeerConfig(
        address=f"{shown}:{args.peer_port}",
        pod=Pod(namespace, str(args.pod_name), str(args.pod_uid), name),
        service_account=str(args.peer_service_account),
        bind=("::" if ":" in host else "0.0.0.0", args.peer_port),
        limits=Limits(
            args.peer_max_uploads,
            int(parse_quantity(str(args.peer_upload_rate))),
            max_connections=args.peer_max_connections,
            max_connections_per_client=args.peer_max_connections_per_client,
            idle_seconds=args.peer_idle_timeout,
            request_seconds=args.peer_request_timeout,
            min_send_rate=int(parse_quantity(str(args.peer_min_send_rate))),
        ),
    )


def build_peering(
    config: PeerConfig | None, api: Groups, node_name: str, layout: StoreLayout
) -> Peering | None:
    """The agent's `Peering` from its settings' `peers` section, or None when peers are disabled."""
    if config is None:
        return None
    return Peering(config, api, node_name, layout)
