"""`praesto-agent`: the node agent daemon (`run`), one-shot downloads and the PVC-mode wait.

    praesto-agent download hf://org/name[:rev] --dest DIR [--revision R] [--token-file F]
                  [--endpoint URL] [--concurrency N] [--allow GLOB]... [--ignore GLOB]...
                  [--max-bytes QUANTITY] [--signature-public-key FILE | --signature-certificate FILE
                  [--signature-certificate-chain FILE]... | --signature-identity ID --signature-oidc-issuer URL]
                  [--signature-path model.sig]
    praesto-agent download s3://bucket/prefix --dest DIR [--credentials-dir D]   (also gs://, az://)
    praesto-agent wait --path DIR [--timeout SECONDS]
    praesto-agent run ...            (the DaemonSet process; see `praesto-agent run --help`)

Exit codes (download): 0 published (or already complete); 1 failed for good (the
reason says why: RepoNotFound, Unauthorized, GatedRepo, RevisionNotFound,
ChecksumMismatch, InsufficientDiskSpace, InvalidRepoFile, WaitingForCredentials,
SizeExceedsRequest, SignatureInvalid, SourceUnavailable); 2 bad
usage; 3 larger than --max-bytes (SizeExceedsRequest), nothing written; 4 the required
signature (--signature-*) is missing, invalid or does not match (SignatureInvalid), nothing published; 75 temporary failure, run again to resume; 130 interrupted (SIGINT/SIGTERM),
staging kept for resume. wait: 0 complete, 1 timed out, 2 bad usage.

The token comes from --token-file or HF_TOKEN, is held in memory only, and is never
printed: every line this command writes is scrubbed of it. Object-store credentials
come from the environment (AWS_ACCESS_KEY_ID, ...; see download/objcreds.py) and from
the files of a mounted Secret in --credentials-dir (the PVC-mode Job), scrubbed alike.

This is `praesto-agent`'s process edge: `main` takes the process environment, once, and hands that
mapping to what builds each subcommand's settings (the flags' defaults, `DownloadSettings` for
`download`, agent/settings.py `AgentSettings` for `run`); nothing below reads the environment.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

from praesto.agent.download import (
    DownloadCancelled,
    DownloadError,
    Options,
    TemporaryDownloadError,
    crashpoints,
    download,
    plan,
)
from praesto.agent.download.objcreds import settings_from_env
from praesto.agent.download.settings import DownloadSettings
from praesto.agent.download.signature import policy_from_files

from praesto import names
from praesto.quantity import QuantityError, format_bytes, parse_quantity
from praesto.spec import parse_uri

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_TEMPFAIL, EXIT_INTERRUPTED = 0, 1, 2, 75, 130
EXIT_TOO_LARGE = names.DOWNLOAD_EXIT_TOO_LARGE  # SizeExceedsRequest: the PVC Job fails at once on it
EXIT_SIGNATURE_INVALID = names.DOWNLOAD_EXIT_SIGNATURE_INVALID  # likewise for SignatureInvalid


class _Scrub(logging.Filter):
    """Last line of defence: no log record carries the token or a credential."""

    def __init__(self, secret: str | None) -> None:
        super().__init__()
        self.secret = secret

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        scrubbed = _scrub(message, self.secret)
        if scrubbed != message:
            record.msg, record.args = scrubbed, None
        return True


_SECRETS: list[str] = []  # credential values seen by this process (memory only)


def _scrub(text: str, secret: str | None) -> str:
    for value in [secret, *_SECRETS]:
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return text


def _say(text: str, secret: str | None, stream: object = sys.stderr) -> None:
    print(_scrub(text, secret), file=stream, flush=True)  # type: ignore[call-overload]


def _read_token(args: argparse.Namespace, settings: DownloadSettings) -> str | None:
    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as error:
            raise ValueError(
                f"--token-file {args.token_file}: {error.strerror}; give a readable file"
            ) from None
        return token or None
    return settings.hf_token


def _registry_config(path: str | None, credentials_dir: Path | None) -> dict[str, str] | None:
    """An OCI login: --registry-config (a Docker config.json), else a mounted dockerconfigjson Secret."""
    mounted = credentials_dir / names.DOCKER_CONFIG_KEY if credentials_dir else None
    chosen = Path(path) if path else mounted if mounted and mounted.is_file() else None
    if chosen is None:
        return None
    try:
        return {names.DOCKER_CONFIG_KEY: chosen.read_text()}
    except OSError as error:
        raise ValueError(
            f"--registry-config {chosen}: {error.strerror}; give a readable Docker config.json"
        ) from None


def _download(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    source, errors = parse_uri(args.source, "SOURCE")
    if errors or source is None:
        _say(f"error: {errors[0] if errors else 'SOURCE: unsupported'}", None)
        return EXIT_USAGE
    if args.revision:
        source = source.with_revision(args.revision)
    try:
        max_bytes = parse_quantity(args.max_bytes) if args.max_bytes else None
    except QuantityError as error:
        _say(f"error: --max-bytes: {error}; e.g. --max-bytes 20Gi", None)
        return EXIT_USAGE
    settings = DownloadSettings.from_env(env)
    credentials_dir = Path(args.credentials_dir) if args.credentials_dir else None
    credentials = settings_from_env(env, credentials_dir) if source.scheme not in ("hf", "oci") else None
    if source.scheme == "oci":
        try:
            credentials = _registry_config(args.registry_config, credentials_dir)
        except ValueError as error:
            _say(f"error: {error}", None)
            return EXIT_USAGE
    _SECRETS.extend(v for v in (credentials or {}).values() if v)
    if args.allow or args.ignore:
        source = type(source)(
            source.scheme, source.location, source.revision, tuple(args.allow), tuple(args.ignore)
        )
    try:
        token = _read_token(args, settings)
        signature = policy_from_files(
            public_key=args.signature_public_key,
            certificate=args.signature_certificate,
            chain=tuple(args.signature_certificate_chain),
            identity=args.signature_identity,
            oidc_issuer=args.signature_oidc_issuer,
            path=args.signature_path,
        )
    except ValueError as error:
        _say(f"error: {error}", None)
        return EXIT_USAGE
    logging.getLogger().addFilter(_Scrub(token))
    for handler in logging.getLogger().handlers:
        handler.addFilter(_Scrub(token))
    cancel = threading.Event()
    last = [0.0]

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if not args.quiet and (now - last[0] >= 2.0 or done == total):
            last[0] = now
            pct = 100 * done // total if total else 100
            _say(f"progress: {format_bytes(done)} of {format_bytes(total)} ({pct}%)", token)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        cancel.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    options = Options(
        endpoint=args.endpoint or settings.hf_endpoint,
        ca_bundle=settings.ca_bundle,
        store_env=settings.store_env,
        token=token,
        concurrency=args.concurrency,
        blobs_dir=Path(args.blobs_dir) if args.blobs_dir else None,
        staging_dir=Path(args.staging_dir) if args.staging_dir else None,
        progress=progress,
        cancel=cancel,
        part_size=args.part_size << 20,
        direct_writes=not args.buffered_writes,
        credentials=credentials,
        credentials_from=f"the files in {credentials_dir}" if credentials_dir else "the environment",
        # a mounted Secret (the PVC Job mounts the cache's own) is the only credential then
        identity_allowed=credentials_dir is None,
        max_bytes=max_bytes,
        signature=signature,
        plain_http=args.plain_http,
    )
    try:
        resolved = plan(source, options)
        _say(
            f"planned: {source.uri} {source.revision} -> {resolved.revision}, "
            f"{len(resolved.files)} files, {format_bytes(resolved.total_bytes)}",
            token,
        )
        result = download(resolved, Path(args.dest), options)
    except DownloadCancelled:
        _say("interrupted: staging kept; run the same command again to resume", token)
        return EXIT_INTERRUPTED
    except DownloadError as error:
        _say(f"error: {error.reason}: {error.message}", token)
        if error.reason == "SizeExceedsRequest":
            return EXIT_TOO_LARGE
        if error.reason == names.REASON_SIGNATURE_INVALID:
            return EXIT_SIGNATURE_INVALID
        return EXIT_TEMPFAIL if isinstance(error, TemporaryDownloadError) else EXIT_FAILED
    _report(settings.termination_log, resolved.revision, result.plan.total_bytes)
    _say(
        f"complete: {args.dest} at {resolved.revision} ({format_bytes(result.bytes_from_origin)} fetched, "
        f"{format_bytes(result.bytes_deduplicated)} linked, {format_bytes(result.bytes_resumed)} resumed, "
        f"{result.seconds:.1f}s)",
        token,
        sys.stdout,
    )
    return EXIT_OK


def _report(path: str | None, revision: str, size: int) -> None:
    """The PVC-mode Job's result for the sync hook: its termination message (hooks/pvc_pod.py)."""
    if not path:
        return
    try:
        Path(path).write_text(json.dumps({"resolvedRevision": revision, "sizeBytes": size}))
    except OSError as err:  # a report, not the download: never fail a complete download on it
        _say(f"warning: could not write {path}: {err}", None)


def _wait(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Poll for the complete marker: the PVC-mode init container's whole job."""
    marker = Path(args.path) / names.COMPLETE_FILE
    deadline = None if args.timeout <= 0 else time.monotonic() + args.timeout
    announced = False
    while not marker.is_file():
        if deadline is not None and time.monotonic() >= deadline:
            _say(
                f"error: {args.path} has no {names.COMPLETE_FILE} after {args.timeout:g}s; the download is "
                "still running or failed: check the ModelCache status and its download Job",
                None,
            )
            return EXIT_FAILED
        if not announced:
            _say(f"waiting for {marker}", None)
            announced = True
        time.sleep(min(args.interval, max(0.0, deadline - time.monotonic())) if deadline else args.interval)
    _say(f"ready: {args.path}", None, sys.stdout)
    return EXIT_OK


def build_parser(with_run: bool, env: Mapping[str, str]) -> argparse.ArgumentParser:
    """`praesto-agent`'s parser; flags with an environment default take it from `env` (the flag wins)."""
    parser = argparse.ArgumentParser(
        prog="praesto-agent", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--log-level", default=env.get(names.ENV_LOG_LEVEL, names.DEFAULT_LOG_LEVEL))
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)  # --log-level also after the subcommand
    common.add_argument("--log-level", default=argparse.SUPPRESS, help="DEBUG, INFO, WARNING, ERROR")

    dl = sub.add_parser(
        "download", parents=[common], help="download a model into a directory, verified, atomically"
    )
    dl.add_argument(
        "source",
        metavar="SOURCE",
        help="hf://org/name[:revision], s3://, gs:// or az://bucket/prefix, oci://host/repo[:tag|@sha256:digest]",
    )
    dl.add_argument(
        "--dest", required=True, help="directory to publish (created, or filled in place if it exists)"
    )
    dl.add_argument("--revision", help="branch, tag or commit (overrides :rev in SOURCE)")
    dl.add_argument("--token-file", help="file holding a Hugging Face token (default: $HF_TOKEN)")
    dl.add_argument("--registry-config", help="oci://: a Docker config.json holding the registry's login")
    dl.add_argument(
        "--plain-http",
        action="store_true",
        help="oci://: plain HTTP to a registry on this machine (tests only)",
    )
    dl.add_argument("--endpoint", default=None, help="Hub endpoint or mirror (default: $HF_ENDPOINT)")
    dl.add_argument("--concurrency", type=_positive, default=Options.concurrency, help="parallel connections")
    dl.add_argument(
        "--allow", "--allow-pattern", action="append", default=[], metavar="GLOB", help="only files matching"
    )
    dl.add_argument(
        "--ignore",
        "--ignore-pattern",
        action="append",
        default=[],
        metavar="GLOB",
        help="skip files matching",
    )
    dl.add_argument(
        "--credentials-dir",
        default=env.get(names.ENV_CREDENTIALS_DIR),
        help="object stores: a mounted credentials Secret (one file per key, e.g. AWS_ACCESS_KEY_ID)",
    )
    dl.add_argument(
        "--max-bytes",
        metavar="QUANTITY",
        help="refuse, before writing, a source larger than this (e.g. 20Gi)",
    )
    dl.add_argument("--blobs-dir", help="content-addressed dir for dedup hard links (same filesystem)")
    dl.add_argument("--staging-dir", help="where to stage (same filesystem as --dest)")
    dl.add_argument("--part-size", type=_positive, default=Options.part_size >> 20, help="MiB per byte range")
    dl.add_argument("--quiet", action="store_true", help="no progress lines")
    dl.add_argument(
        "--buffered-writes",
        action="store_true",
        help="write through the page cache even on a local disk (default: O_DIRECT for large files there)",
    )
    sig = dl.add_argument_group(
        "signed models (OpenSSF model signing; the bundle is checked before publishing)"
    )
    sig.add_argument(
        "--signature-public-key", metavar="FILE", help="PEM public key the model must be signed with"
    )
    sig.add_argument(
        "--signature-certificate",
        metavar="FILE",
        help="PEM CA certificate the signing certificate must chain to",
    )
    sig.add_argument(
        "--signature-certificate-chain",
        action="append",
        default=[],
        metavar="FILE",
        help="PEM intermediate certificates between that CA and the signing certificate (repeatable)",
    )
    sig.add_argument(
        "--signature-identity", help="keyless Sigstore: the signer's identity (needs Sigstore's services)"
    )
    sig.add_argument("--signature-oidc-issuer", help="keyless Sigstore: the OIDC issuer of that identity")
    sig.add_argument(
        "--signature-path",
        metavar="PATH",
        help=f"the bundle, relative to the model root (default {names.DEFAULT_SIGNATURE_FILE})",
    )
    dl.set_defaults(func=_download)

    wait = sub.add_parser("wait", parents=[common], help="wait until a directory holds a complete download")
    wait.add_argument("--path", required=True)
    wait.add_argument("--timeout", type=float, default=0.0, help="seconds; 0 waits forever")
    wait.add_argument("--interval", type=float, default=0.5, help=argparse.SUPPRESS)
    wait.set_defaults(func=_wait)

    run = sub.add_parser("run", help="run the node agent (DaemonSet)")
    if with_run:
        from praesto.agent.daemon import run as run_daemon
        from praesto.agent.settings import add_run_arguments

        add_run_arguments(run, env)
        run.set_defaults(func=run_daemon)
    return parser


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be a positive integer")
    return value


def _command(argv: list[str]) -> str | None:
    """The subcommand, found without parsing (the `run` parser needs the daemon imported)."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--log-level":
            skip = True
        elif not arg.startswith("-"):
            return arg
    return None


def main(argv: list[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """The process edge: the environment is taken here, once (`env` stands in for it in tests)."""
    argv = sys.argv[1:] if argv is None else argv
    env = dict(os.environ) if env is None else env
    crashpoints.arm(env.get(crashpoints.ENV))  # tests only: die at a named step of a download
    parser = build_parser(_command(argv) == "run", env)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    code: int = args.func(args, env)
    return code


if __name__ == "__main__":
    sys.exit(main())
