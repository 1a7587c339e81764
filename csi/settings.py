"""`praesto-csi`'s settings: its flags, their environment defaults, checked into one typed object.

`add_arguments` declares the flags; the two with an environment default take it from the mapping
the process edge hands in (csi/cli.py `main`, the one place `praesto-csi` reads the process
environment), so a flag wins over its variable. `CsiSettings.from_args` checks them together (a
`SettingsError` names the flag, the cause and the fix). The chart passes the flags on the node
DaemonSet's csi container (templates/node-daemonset.yaml); tests/test_settings_inventory.py checks
the two against each other.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from praesto.csi.registration import SOCKET_NAME, RegistrationOptions

from praesto import names
from praesto.cliargs import LOG_LEVELS, log_level, seconds

ENV_ENDPOINT = "CSI_ENDPOINT"  # the CSI convention's variable for the plugin's socket
DEFAULT_ENDPOINT = "unix:///csi/csi.sock"


class SettingsError(ValueError):
    """A bad flag: names it, says what is wrong and what to set."""


@dataclass(frozen=True)
class CsiSettings:
    """Everything `praesto-csi` is configured with, checked; one per process."""

    node_name: str
    """--node-name (NODE_NAME, the downward API's spec.nodeName): this node. Required."""
    endpoint: str = DEFAULT_ENDPOINT
    """--endpoint (CSI_ENDPOINT): the unix socket the plugin serves CSI on."""
    base_path: Path = Path(names.DEFAULT_BASE_PATH)
    """--base-path: the node-local model store; an absolute path."""
    unassigned_after: float = 60.0
    """--unassigned-after: seconds without an answer from the node agent before a cache is
    reported as not assigned to this node."""
    registration: RegistrationOptions | None = None
    """--registration-dir, --kubelet-endpoint and --registration-check-seconds: the plugin
    registers with the kubelet itself (no node-driver-registrar sidecar); None: it does not."""
    log_level: str = "INFO"
    """--log-level: DEBUG, INFO, WARNING or ERROR."""

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> CsiSettings:
        """The settings from the parsed flags; `SettingsError` names the first problem."""
        if not args.node_name:
            raise SettingsError(
                f"--node-name is required (or env {names.ENV_NODE_NAME}); set it from the Pod's "
                "spec.nodeName with the downward API"
            )
        if not args.base_path.is_absolute():
            raise SettingsError(f"--base-path {str(args.base_path)!r} must be an absolute path")
        return cls(
            node_name=args.node_name,
            endpoint=args.endpoint,
            base_path=args.base_path,
            unassigned_after=args.unassigned_after,
            registration=registration_options(args),
            log_level=args.log_level,
        )


def registration_options(args: argparse.Namespace) -> RegistrationOptions | None:
    """The registration flags, checked together: one without the other is a mistake."""
    if args.registration_dir is None and not args.kubelet_endpoint:
        return None
    if args.registration_dir is None or not args.kubelet_endpoint:
        missing = "--kubelet-endpoint" if args.registration_dir is not None else "--registration-dir"
        raise SettingsError(
            f"{missing} is required with the other registration flag: give --registration-dir "
            f"<kubelet root dir>/plugins_registry and --kubelet-endpoint "
            f"<kubelet root dir>/plugins/{names.CSI_DRIVER_NAME}/csi.sock, or neither"
        )
    return RegistrationOptions(args.registration_dir, args.kubelet_endpoint, args.registration_check_seconds)


def add_arguments(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    """`praesto-csi`'s flags; --endpoint and --node-name default to their variables in `env`."""
    parser.add_argument(
        "--endpoint",
        default=env.get(ENV_ENDPOINT, CsiSettings.endpoint),
        help=f"unix socket to serve on (env {ENV_ENDPOINT}; default {CsiSettings.endpoint})",
    )
    parser.add_argument(
        "--node-name",
        default=env.get(names.ENV_NODE_NAME, ""),
        help=f"this node's name (env {names.ENV_NODE_NAME})",
    )
    parser.add_argument(
        "--base-path",
        type=Path,
        default=CsiSettings.base_path,
        help=f"the node-local model store (default {CsiSettings.base_path})",
    )
    parser.add_argument(
        "--unassigned-after",
        type=seconds,
        default=CsiSettings.unassigned_after,
        help="seconds without an answer from the node agent before a cache is reported as not assigned here",
    )
    registration = parser.add_argument_group(
        "kubelet plugin registration (replaces the node-driver-registrar sidecar; give both or neither)"
    )
    registration.add_argument(
        "--registration-dir",
        type=Path,
        help="the kubelet's plugin registration directory, <kubelet root dir>/plugins_registry "
        f"(e.g. /var/lib/kubelet/plugins_registry); the plugin serves {SOCKET_NAME} there",
    )
    registration.add_argument(
        "--kubelet-endpoint",
        default="",
        help="the --endpoint socket's path as the kubelet sees it, e.g. "
        f"/var/lib/kubelet/plugins/{names.CSI_DRIVER_NAME}/csi.sock "
        "(node-driver-registrar's --kubelet-registration-path)",
    )
    registration.add_argument(
        "--registration-check-seconds",
        type=seconds,
        default=RegistrationOptions.check_seconds,
        help="how often to check that the registration socket still exists; "
        f"if it is gone the plugin exits 1 to register again (default {RegistrationOptions.check_seconds:g})",
    )
    parser.add_argument(
        "--log-level",
        type=log_level,
        default=CsiSettings.log_level,
        metavar="LEVEL",
        help=f"{', '.join(LOG_LEVELS)} (default {CsiSettings.log_level})",
    )
