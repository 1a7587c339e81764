"""`praesto-csi`: the CSI node plugin's command line."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from praesto.csi.registration import SOCKET_NAME, RegistrationFailed, RegistrationOptions
from praesto.csi.server import serve
from praesto.csi.sockets import EndpointError
from praesto.csi.volume import CsiError

from praesto import names

DEFAULT_ENDPOINT = "unix:///csi/csi.sock"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="praesto-csi",
        description=f"CSI node plugin {names.CSI_DRIVER_NAME}: read-only model cache mounts",
    )
    parser.add_argument(
        "--endpoint",
        default=os.environ.get("CSI_ENDPOINT", DEFAULT_ENDPOINT),
        help=f"unix socket to serve on (env CSI_ENDPOINT; default {DEFAULT_ENDPOINT})",
    )
    parser.add_argument(
        "--node-name",
        default=os.environ.get(names.ENV_NODE_NAME, ""),
        help="this node's name (env NODE_NAME)",
    )
    parser.add_argument(
        "--base-path",
        type=Path,
        default=Path(names.DEFAULT_BASE_PATH),
        help=f"the node-local model store (default {names.DEFAULT_BASE_PATH})",
    )
    parser.add_argument(
        "--unassigned-after",
        type=float,
        default=60.0,
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
        type=float,
        default=10.0,
        help="how often to check that the registration socket still exists; "
        "if it is gone the plugin exits 1 to register again (default 10)",
    )
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser


def registration_options(args: argparse.Namespace) -> RegistrationOptions | None:
    """The registration flags, checked together: one without the other is a mistake."""
    if args.registration_dir is None and not args.kubelet_endpoint:
        return None
    if args.registration_dir is None or not args.kubelet_endpoint:
        missing = "--kubelet-endpoint" if args.registration_dir is not None else "--registration-dir"
        raise EndpointError(
            f"{missing} is required with the other registration flag: give --registration-dir "
            f"<kubelet root dir>/plugins_registry and --kubelet-endpoint "
            f"<kubelet root dir>/plugins/{names.CSI_DRIVER_NAME}/csi.sock, or neither"
        )
    return RegistrationOptions(args.registration_dir, args.kubelet_endpoint, args.registration_check_seconds)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.node_name:
        print(
            "praesto-csi: --node-name is required (or env NODE_NAME); set it from the Pod's "
            "spec.nodeName with the downward API",
            file=sys.stderr,
        )
        return 2
    if not args.base_path.is_absolute():
        print(f"praesto-csi: --base-path {str(args.base_path)!r} must be an absolute path", file=sys.stderr)
        return 2
    try:
        registration = registration_options(args)
        serve(args.endpoint, args.node_name, args.base_path, args.unassigned_after, registration)
    except EndpointError as err:
        print(f"praesto-csi: {err}", file=sys.stderr)
        return 2
    except RegistrationFailed as err:  # exit non-zero so that the DaemonSet restarts the plugin
        print(f"praesto-csi: {err}", file=sys.stderr)
        return 1
    except CsiError as err:  # e.g. a store directory that is a symlink (storefs.UnsafeStore)
        print(f"praesto-csi: {err.message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
