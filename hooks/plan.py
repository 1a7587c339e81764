"""`praesto plan`: will it fit? A ModelCache's source listed as the node agent lists it, before
anything is fetched.

Each ModelCache in the file is planned by the agent's own planner (`praesto.agent.download.fetch.plan`:
the same revision resolution, listing, allow/ignore patterns and file sizes the agent and the
PVC-mode Job use), and the total is held against spec.storage.size by the downloader's own rule
(`check_size`). A source larger than storage.size is a cache that fails for good with
SizeExceedsRequest, nothing written, so this is not a warning to ignore: the command exits 1.

Credentials are this machine's, read as `praesto-agent download` reads them: HF_TOKEN and
HF_ENDPOINT, the object stores' variables (AWS_*, GOOGLE_*, AZURE_*), PRAESTO_CA_BUNDLE. A
secretRef on the cache names a Secret in the cluster, which an offline command cannot read.

Exit: 0 every cache fits; 1 one does not, or its source refused or could not be planned for
good; 2 bad usage (flags, an unreadable file, an invalid spec); 75 a temporary failure.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from praesto.agent.download import DownloadError, Options, Plan, TemporaryDownloadError
from praesto.agent.download.egress import EgressPolicy
from praesto.agent.download.fetch import check_size, plan
from praesto.agent.download.origins import origin_for
from praesto.agent.download.settings import DownloadSettings
from praesto.hooks.render import RenderError, load_modelcaches

from praesto import names
from praesto.cliargs import EXIT_USAGE, CommandParser
from praesto.quantity import format_bytes
from praesto.spec import InvalidSpec, ModelCacheSpec, parse_spec

PROG = "praesto plan"
EXIT_FITS, EXIT_DOES_NOT_FIT, EXIT_TEMPORARY = 0, 1, 75


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = CommandParser(
        prog=PROG,
        description="List a ModelCache's source with its real file sizes, as the node agent would plan it, "
        "and check that spec.storage.size holds it. Nothing is downloaded.",
        epilog="Exit 0: every cache fits; 1: one does not (it would fail with SizeExceedsRequest) or its "
        "source cannot be planned; 2: bad usage; 75: a temporary failure, run it again.",
    )
    parser.add_argument("-f", "--filename", required=True, help="ModelCache YAML file ('-' for stdin)")
    parser.add_argument("--endpoint", help="Hugging Face endpoint or mirror (default: $HF_ENDPOINT)")
    parser.add_argument("--files", action="store_true", help="also list every file with its size")
    return parser.parse_args(argv)


def options_for(args: argparse.Namespace, env: Mapping[str, str], scheme: str) -> Options:
    """What the planner needs, from this machine's environment as `praesto-agent download` reads it."""
    settings = DownloadSettings.from_env(env)
    section = replace(
        settings.environment,  # the proxies, OCI mirrors and object-store variables, read once
        endpoint=args.endpoint or settings.hf_endpoint,
        modelscope_endpoint=settings.modelscope_endpoint,
        ca_bundle=settings.ca_bundle,
        egress=EgressPolicy.from_text(settings.egress_allowed_cidrs),  # main checked it
    )
    return Options.of(
        section,
        token=settings.token_for(scheme),
        credentials=_credentials_from_env(env, scheme),
        credentials_from="the environment",
    )


def _credentials_from_env(env: Mapping[str, str], scheme: str) -> dict[str, str] | None:
    """The settings a kind whose credential is a set of keys (object stores) reads from the environment,
    as `praesto-agent download` does; None for kinds whose credential is a token or a login."""
    from_env = origin_for(scheme).credential.from_env
    return from_env(env, None) if from_env is not None else None


def _say(text: str, stream: Any = sys.stdout) -> None:
    print(text, file=stream, flush=True)


def plan_cache(name: str, spec: ModelCacheSpec, args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Plan one cache and say whether it fits; its exit code."""
    source = spec.source
    try:
        planned: Plan = plan(source, options_for(args, env, source.scheme))
    except DownloadError as error:
        _say(f"{PROG}: ModelCache {name}: {error.reason}: {error.message}", sys.stderr)
        return EXIT_TEMPORARY if isinstance(error, TemporaryDownloadError) else EXIT_DOES_NOT_FIT
    total = planned.total_bytes
    _say(
        f"ModelCache {name}: {source.uri} {source.revision} -> {planned.revision}: "
        f"{len(planned.files)} files, {format_bytes(total)} ({total} bytes); "
        f"storage.size {spec.size} ({spec.size_bytes} bytes)"
    )
    if args.files:
        for remote in planned.files:
            _say(f"  {remote.size:>14}  {remote.path}")
    try:
        check_size(planned, Options(max_bytes=spec.size_bytes))
    except DownloadError as error:
        _say(f"WARNING: ModelCache {name} will not fit: {error.reason}: {error.message}", sys.stderr)
        return EXIT_DOES_NOT_FIT
    need = planned.disk_bytes(spec.size_bytes)  # on disk, as check_size counted it
    share = (
        "an archive layer's unpacked size is known only once unpacked: up to all of storage.size"
        if planned.unpacked_unknown
        else f"{100 * need // spec.size_bytes}% of storage.size"
    )
    _say(f"ModelCache {name}: fits ({share})")
    return EXIT_FITS


def main(argv: list[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ) if env is None else env
    try:
        EgressPolicy.from_text(DownloadSettings.from_env(env).egress_allowed_cidrs)
    except ValueError as err:
        _say(f"{PROG}: {names.ENV_EGRESS_ALLOWED_CIDRS}: {err}", sys.stderr)
        return EXIT_USAGE
    try:
        caches = load_modelcaches(args.filename)
    except RenderError as err:
        _say(f"{PROG}: {err}", sys.stderr)
        return EXIT_USAGE
    specs: list[tuple[str, ModelCacheSpec]] = []
    for cache in caches:
        name = f"{cache['metadata']['namespace']}/{cache['metadata']['name']}"
        try:
            specs.append((name, parse_spec(cache.get("spec"))))
        except InvalidSpec as err:
            for error in err.errors:
                _say(f"{PROG}: ModelCache {name}: {error}", sys.stderr)
            return EXIT_USAGE
    codes = [plan_cache(name, spec, args, env) for name, spec in specs]
    return max(codes, key=lambda code: (code != EXIT_FITS, code == EXIT_DOES_NOT_FIT))
