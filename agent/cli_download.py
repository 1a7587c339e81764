"""`praesto-agent download`: one verified, atomic download, as the PVC-mode Job and users run it.

Every input is checked before a byte moves (the source, --credentials-dir, --dest and
--staging-dir, the token and signature files), so bad usage exits 2 with nothing written.
Every line this command writes is scrubbed of the token and of any credential it read.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from types import FrameType

from praesto.agent import job_progress
from praesto.agent.download import DownloadCancelled, DownloadError, Options, TemporaryDownloadError
from praesto.agent.download.api import SUMMARY_RECORD, WRITE_BUFFERED, WRITE_DIRECT
from praesto.agent.download.destination import destination_problem
from praesto.agent.download.egress import EgressPolicy
from praesto.agent.download.fetch import download, plan
from praesto.agent.download.origin import REGISTRY_LOGIN, SETTINGS
from praesto.agent.download.origins import origin_for
from praesto.agent.download.settings import DownloadSettings
from praesto.agent.download.signature import policy_from_files

from praesto import names
from praesto.cliargs import EXIT_USAGE
from praesto.quantity import QuantityError, format_bytes, parse_quantity
from praesto.spec import parse_uri

EXIT_OK, EXIT_FAILED, EXIT_TEMPFAIL, EXIT_INTERRUPTED = 0, 1, 75, 130  # EXIT_USAGE: cliargs
EXIT_TOO_LARGE = names.DOWNLOAD_EXIT_TOO_LARGE  # SizeExceedsRequest: the PVC Job fails at once on it
EXIT_SIGNATURE_INVALID = names.DOWNLOAD_EXIT_SIGNATURE_INVALID  # likewise for SignatureInvalid


def _not_a_summary(record: logging.LogRecord) -> bool:
    """The downloader's plan/publish summaries: this command prints its own `planned:`/`complete:`."""
    return not getattr(record, SUMMARY_RECORD, False)


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


def say(text: str, secret: str | None, stream: object = sys.stderr) -> None:
    print(_scrub(text, secret), file=stream, flush=True)  # type: ignore[call-overload]


def _read_token(args: argparse.Namespace, settings: DownloadSettings, scheme: str) -> str | None:
    """--token-file, else the variable of this source's own kind (HF_TOKEN, MODELSCOPE_API_TOKEN)."""
    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as error:
            raise ValueError(
                f"--token-file {args.token_file}: {error.strerror}; give a readable file"
            ) from None
        return token or None
    return settings.token_for(scheme)


def _registry_config(path: str | None, credentials_dir: Path | None, key: str) -> dict[str, str] | None:
    """A registry login: --registry-config (a Docker config.json), else a mounted dockerconfigjson
    Secret's `key` (names.DOCKER_CONFIG_KEY)."""
    mounted = credentials_dir / key if credentials_dir else None
    chosen = Path(path) if path else mounted if mounted and mounted.is_file() else None
    if chosen is None:
        return None
    try:
        return {key: chosen.read_text()}
    except OSError as error:
        raise ValueError(
            f"--registry-config {chosen}: {error.strerror}; give a readable Docker config.json"
        ) from None


def _credentials_dir(path: str | None) -> Path | None:
    """--credentials-dir, which must be a folder: a missing one is a typo or an unmounted Secret,
    and the download would go on anonymously, refused by the store and retried forever."""
    if not path:
        return None
    folder = Path(path)
    if not folder.is_dir():
        cause = "is not a directory" if folder.exists() else "does not exist"
        raise ValueError(
            f"--credentials-dir {path} {cause} (it may come from ${names.ENV_CREDENTIALS_DIR}); give the "
            "folder a credentials Secret is mounted at (one file per key), or leave it out to use the "
            "environment"
        )
    return folder


def run_download(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    source, errors = parse_uri(args.source, "SOURCE")
    if errors or source is None:
        say(f"error: {errors[0] if errors else 'SOURCE: unsupported'}", None)
        return EXIT_USAGE
    try:
        credentials_dir = _credentials_dir(args.credentials_dir)
        if args.progress_job:
            job_progress.parse_job_ref(args.progress_job)
    except ValueError as error:
        say(f"error: {error}", None)
        return EXIT_USAGE
    staging_dir = Path(args.staging_dir) if args.staging_dir else None
    problem = destination_problem(Path(args.dest), staging_dir, args.allow_existing_files)
    if problem:
        say(f"error: {problem}", None)
        return EXIT_USAGE
    if args.revision:
        source = source.with_revision(args.revision)
    try:
        max_bytes = parse_quantity(args.max_bytes) if args.max_bytes else None
    except QuantityError as error:
        say(f"error: --max-bytes: {error}; e.g. --max-bytes 20Gi", None)
        return EXIT_USAGE
    settings = DownloadSettings.from_env(env)
    allowed = (
        settings.egress_allowed_cidrs if args.egress_allowed_cidrs is None else args.egress_allowed_cidrs
    )
    try:
        egress = EgressPolicy.from_text(allowed)
    except ValueError as error:
        say(f"error: --egress-allowed-cidrs ({names.ENV_EGRESS_ALLOWED_CIDRS}): {error}", None)
        return EXIT_USAGE
    shape = origin_for(source.scheme).credential  # what this kind's credential is (download/origin.py)
    credentials = shape.from_env(env, credentials_dir) if shape.form == SETTINGS and shape.from_env else None
    if shape.form == REGISTRY_LOGIN:
        try:
            credentials = _registry_config(args.registry_config, credentials_dir, shape.cluster_key)
        except ValueError as error:
            say(f"error: {error}", None)
            return EXIT_USAGE
    _SECRETS.extend(v for v in (credentials or {}).values() if v)
    if args.allow or args.ignore:
        source = type(source)(
            source.scheme, source.location, source.revision, tuple(args.allow), tuple(args.ignore)
        )
    try:
        token = _read_token(args, settings, source.scheme)
        signature = policy_from_files(
            public_key=args.signature_public_key,
            certificate=args.signature_certificate,
            chain=tuple(args.signature_certificate_chain),
            identity=args.signature_identity,
            oidc_issuer=args.signature_oidc_issuer,
            path=args.signature_path,
        )
    except ValueError as error:
        say(f"error: {error}", None)
        return EXIT_USAGE
    logging.getLogger().addFilter(_Scrub(token))
    for handler in logging.getLogger().handlers:
        handler.addFilter(_Scrub(token))
        handler.addFilter(_not_a_summary)
    cancel = threading.Event()
    last = [0.0]
    live = (  # PVC mode: the download Job's progress annotation (agent/job_progress.py)
        job_progress.sender_from_env(args.progress_job, Path(args.progress_credentials_dir), env)
        if args.progress_job
        else None
    )

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if not args.quiet and (now - last[0] >= 2.0 or done == total):
            last[0] = now
            pct = 100 * done // total if total else 100
            say(f"progress: {format_bytes(done)} of {format_bytes(total)} ({pct}%)", token)
        if live is not None:
            live.record(done, total)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        cancel.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # this process's download settings, once, from its flags over its environment
    section = replace(
        settings.environment,  # the proxies, OCI mirrors and object-store variables, read once
        endpoint=args.endpoint or settings.hf_endpoint,
        modelscope_endpoint=settings.modelscope_endpoint,
        ca_bundle=settings.ca_bundle,
        concurrency=args.concurrency,
        part_size=args.part_size << 20,
        write_mode=WRITE_BUFFERED if args.buffered_writes else WRITE_DIRECT,
        plain_http=args.plain_http,
        egress=egress,
        xet=settings.xet if args.xet is None else args.xet == "true",
    )
    options = Options.of(
        section,
        token=token,
        blobs_dir=Path(args.blobs_dir) if args.blobs_dir else None,
        staging_dir=staging_dir,
        progress=progress,
        cancel=cancel,
        credentials=credentials,
        credentials_from=f"the files in {credentials_dir}" if credentials_dir else "the environment",
        # a mounted Secret (the PVC Job mounts the cache's own) is the only credential then
        identity_allowed=credentials_dir is None,
        max_bytes=max_bytes,
        signature=signature,
    )
    try:
        resolved = plan(source, options)
        say(
            f"planned: {source.uri} {source.revision} -> {resolved.revision}, "
            f"{len(resolved.files)} files, {format_bytes(resolved.total_bytes)}",
            token,
        )
        result = download(resolved, Path(args.dest), options)
    except DownloadCancelled:
        say("interrupted: staging kept; run the same command again to resume", token)
        return EXIT_INTERRUPTED
    except DownloadError as error:
        say(f"error: {error.reason}: {error.message}", token)
        if error.reason == "SizeExceedsRequest":
            return EXIT_TOO_LARGE
        if error.reason == names.REASON_SIGNATURE_INVALID:
            return EXIT_SIGNATURE_INVALID
        return EXIT_TEMPFAIL if isinstance(error, TemporaryDownloadError) else EXIT_FAILED
    finally:
        if live is not None:
            live.stop()
    _report(settings.termination_log, resolved.revision, result.plan.total_bytes)
    say(
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
        say(f"warning: could not write {path}: {err}", None)
