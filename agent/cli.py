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

The token comes from --token-file or the kind's own variable (HF_TOKEN, MODELSCOPE_API_TOKEN), is held in memory only, and is never
printed: every line this command writes is scrubbed of it. Object-store credentials
come from the environment (AWS_ACCESS_KEY_ID, ...; see download/origins/objstore/creds.py) and from
the files of a mounted Secret in --credentials-dir (the PVC-mode Job), scrubbed alike.

Bad input (a --dest that is a file, unwritable or full of the user's own files, a missing
--credentials-dir, an unknown --log-level) is refused in one line with exit 2 before anything is
fetched (agent/cli_download.py, download/destination.py, praesto/cliargs.py).

This is `praesto-agent`'s process edge: `main` takes the process environment, once, and hands that
mapping to what builds each subcommand's settings (the flags' defaults, `DownloadSettings` for
`download`, agent/settings.py `AgentSettings` for `run`); nothing below reads the environment.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from praesto.agent.cli_download import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_SIGNATURE_INVALID,
    EXIT_TEMPFAIL,
    EXIT_TOO_LARGE,
    run_download,
    say,
)
from praesto.agent.download import Options, crashpoints
from praesto.agent.download.destination import ALLOW_EXISTING_FLAG

from praesto import names
from praesto.cliargs import (
    EXIT_USAGE,
    CommandParser,
    add_version,
    configure_logging,
    log_level,
    positive_int,
    seconds,
)
from praesto.spec import URI_EXAMPLES

DESCRIPTION = "Praesto's node agent (run), its one-shot verified download, and the PVC-mode wait."
SOURCE_NOTES = {
    "hf": "a Hugging Face model; token from --token-file or $HF_TOKEN",
    "s3": "S3 or S3-compatible; keys from the environment or --credentials-dir",
    "gs": "Google Cloud Storage; likewise",
    "az": "Azure Blob Storage; the account from AZURE_STORAGE_ACCOUNT_NAME",
    "oci": "an OCI / ModelPack artifact; login from --registry-config",
    "ms": "a ModelScope model; token from --token-file or $MODELSCOPE_API_TOKEN",
}
EPILOG = (
    "sources (download):\n"
    + "".join(f"  {URI_EXAMPLES[s]:<46} {note}\n" for s, note in SOURCE_NOTES.items())
    + f"""
exit codes (download): {EXIT_OK} published or already complete; {EXIT_FAILED} failed for good (the reason
says why); {EXIT_USAGE} bad usage, nothing fetched; {EXIT_TOO_LARGE} larger than --max-bytes; {EXIT_SIGNATURE_INVALID} signature missing,
invalid or not matching; {EXIT_TEMPFAIL} temporary, run again to resume; {EXIT_INTERRUPTED} interrupted, staging kept.

Run `praesto-agent <command> --help` for a command's options.
"""
)


def _wait(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Poll for the complete marker: the PVC-mode init container's whole job."""
    marker = Path(args.path) / names.COMPLETE_FILE
    deadline = None if args.timeout <= 0 else time.monotonic() + args.timeout
    announced = False
    while not marker.is_file():
        if deadline is not None and time.monotonic() >= deadline:
            say(
                f"error: {args.path} has no {names.COMPLETE_FILE} after {args.timeout:g}s; the download is "
                "still running or failed: check the ModelCache status and its download Job",
                None,
            )
            return EXIT_FAILED
        if not announced:
            say(f"waiting for {marker}", None)
            announced = True
        time.sleep(min(args.interval, max(0.0, deadline - time.monotonic())) if deadline else args.interval)
    say(f"ready: {args.path}", None, sys.stdout)
    return EXIT_OK


def build_parser(with_run: bool, env: Mapping[str, str]) -> argparse.ArgumentParser:
    """`praesto-agent`'s parser; flags with an environment default take it from `env` (the flag wins)."""
    parser = CommandParser(
        prog="praesto-agent",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_version(parser)
    level_help = (
        f"DEBUG, INFO, WARNING or ERROR (env {names.ENV_LOG_LEVEL}; default {names.DEFAULT_LOG_LEVEL})"
    )
    parser.add_argument(
        "--log-level",
        type=log_level,
        metavar="LEVEL",
        default=env.get(names.ENV_LOG_LEVEL, names.DEFAULT_LOG_LEVEL),
        help=level_help,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="<command>", title="commands")
    common = CommandParser(add_help=False)  # --log-level also after the subcommand
    common.add_argument(
        "--log-level", type=log_level, metavar="LEVEL", default=argparse.SUPPRESS, help=level_help
    )

    dl = sub.add_parser(
        "download", parents=[common], help="download a model into a directory, verified, atomically"
    )
    dl.add_argument(
        "source",
        metavar="SOURCE",
        help=", ".join(URI_EXAMPLES.values()),
    )
    dl.add_argument(
        "--dest",
        required=True,
        help="directory to publish: created if missing; an existing one must be empty or hold a "
        f"Praesto download (or pass {ALLOW_EXISTING_FLAG})",
    )
    dl.add_argument(
        ALLOW_EXISTING_FLAG,
        action="store_true",
        help="write into a --dest that holds other files (not written by Praesto): they stay, "
        "same-named ones are replaced by the model's",
    )
    dl.add_argument("--revision", help="branch, tag or commit (overrides :rev in SOURCE)")
    dl.add_argument(
        "--token-file",
        help="file holding the hub token (default: $HF_TOKEN for hf://, $MODELSCOPE_API_TOKEN for ms://)",
    )
    dl.add_argument("--registry-config", help="oci://: a Docker config.json holding the registry's login")
    dl.add_argument(
        "--plain-http",
        action="store_true",
        help="oci://: plain HTTP to a registry on this machine (tests only)",
    )
    dl.add_argument("--endpoint", default=None, help="Hub endpoint or mirror (default: $HF_ENDPOINT)")
    dl.add_argument(
        "--egress-allowed-cidrs",
        default=None,
        metavar="CIDRS",
        help="comma-separated internal networks the source may reach, e.g. 127.0.0.1/32 for a registry on "
        "this machine; loopback, link-local, metadata and private addresses are refused otherwise "
        f"(default: ${names.ENV_EGRESS_ALLOWED_CIDRS})",
    )
    dl.add_argument(
        "--xet",
        choices=("true", "false"),
        default=None,
        help="true: Hugging Face files stored in Xet come through the Xet CAS, falling back to resolve/ "
        f"(default: ${names.ENV_XET}, else false)",
    )
    dl.add_argument(
        "--concurrency", type=positive_int, default=Options.concurrency, help="parallel connections"
    )
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
    dl.add_argument(
        "--part-size", type=positive_int, default=Options.part_size >> 20, help="MiB per byte range"
    )
    dl.add_argument("--quiet", action="store_true", help="no progress lines")
    dl.add_argument(
        "--progress-job",
        default=env.get(names.ENV_PROGRESS_JOB),
        metavar="NAMESPACE/NAME",
        help="PVC mode: write live progress on this Job's praesto.io/progress annotation "
        f"(default: ${names.ENV_PROGRESS_JOB}; the sync hook sets it in the download Job)",
    )
    dl.add_argument(
        "--progress-credentials-dir",
        default=names.PROGRESS_CREDENTIALS_DIR,
        metavar="DIR",
        help="with --progress-job: the projected ServiceAccount token and ca.crt to write it with "
        "(default: %(default)s)",
    )
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
    dl.set_defaults(func=run_download)

    wait = sub.add_parser("wait", parents=[common], help="wait until a directory holds a complete download")
    wait.add_argument("--path", required=True)
    wait.add_argument("--timeout", type=seconds, default=0.0, help="seconds; 0 waits forever")
    wait.add_argument("--interval", type=seconds, default=0.5, help=argparse.SUPPRESS)
    wait.set_defaults(func=_wait)

    run = sub.add_parser("run", help="run the node agent (DaemonSet)")
    if with_run:
        from praesto.agent.daemon import run as run_daemon
        from praesto.agent.settings import add_run_arguments

        add_run_arguments(run, env)
        run.set_defaults(func=run_daemon)
    return parser


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
    configure_logging(args.log_level, "%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    code: int = args.func(args, env)
    return code


if __name__ == "__main__":
    sys.exit(main())
