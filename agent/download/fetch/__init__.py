"""`plan()` and `download()`: a source in, a verified and atomically published directory out.

The one package that joins the download core (praesto.agent.download: api, engine, publish, ...)
and the origins (praesto.agent.download.origins: one package per source kind), both imported
statically: the core knows no kind and no origin imports this package, so nothing cycles.
Staging, resume and dedup are in engine.py, publication in publish.py; this module
only decides what happens to staging on each kind of failure: kept for resume on
cancel and transient errors, removed when the disk is full (space given back). What a source
kind plans and where its bytes are is its origin's (origins/: one table, one package per kind).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from praesto.agent.download.access import Access
from praesto.agent.download.api import (
    NO_SOURCES,
    SUMMARY,
    DownloadCancelled,
    DownloadError,
    LastingDownloadError,
    Options,
    PartSources,
    Plan,
    Result,
    TemporaryDownloadError,
)
from praesto.agent.download.engine import NO_SPACE, Engine
from praesto.agent.download.origins import origin_for
from praesto.agent.download.publish import TREE, is_published, publish, staging_for
from praesto.agent.download.signature import verify_tree
from praesto.agent.download.unpack import unpack_layers

from praesto import names
from praesto.quantity import format_bytes
from praesto.spec import Source

log = logging.getLogger("praesto.download")


def plan(source: Source, options: Options) -> Plan:
    """Resolve a source (hf://, s3://, gs://, az://, oci://, ...) to an exact revision and its files."""
    planned: Plan = origin_for(source.scheme).plan(source, options)
    return planned


def check_size(plan: Plan, options: Options) -> None:
    """Refuse, before a byte is written, a source larger than the volume it must fit: counted as it
    lands on disk (Plan.disk_bytes: archive layers and what they unpack to), not as it is fetched."""
    bound = options.max_bytes
    if bound is not None and plan.disk_bytes(bound) > bound:
        raise LastingDownloadError(
            "SizeExceedsRequest",
            f"{plan.source.uri} takes {plan.describe_size()} on disk but the volume holds "
            f"{format_bytes(bound)} ({bound} bytes, spec.storage.size); nothing was written; "
            "raise storage.size on the ModelCache to at least the model's size",
        )


def _verify_signature(staging: Path, options: Options) -> dict[str, Any] | None:
    """The required signature checked over the staged tree, before anything is published.

    A refusal removes staging: its bytes match the origin's listing (the engine verified that) but
    not what the signer signed, so resuming them would only fail the same way.
    """
    if options.signature is None:
        return None
    try:
        return verify_tree(staging / TREE, options.signature)
    except LastingDownloadError:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _unpacked(plan: Plan, staging: Path, sha256: dict[str, str], options: Options) -> Plan:
    """OCI archive layers unpacked into the staged tree (unpack.py), stopped as they cross
    `options.max_bytes` (storage.size); the plan of the tree as it is.

    A refusal removes staging: the layers are what the registry vouches for, so fetching them
    again would only be refused the same way.
    """
    try:
        return unpack_layers(plan, staging / TREE, sha256, options.blobs_dir, options.max_bytes)
    except LastingDownloadError:
        shutil.rmtree(staging, ignore_errors=True)
        _drop_blobs(plan, options.blobs_dir)
        raise


def _drop_blobs(plan: Plan, blobs: Path | None) -> None:
    """The refused plan's blobs go with staging (the engine shared each file and layer once it was
    verified), unless a copy links them too: nothing of a refused artifact stays on the node."""
    for file in plan.files:
        if blobs is None or file.sha256 is None:
            continue
        blob = blobs / file.sha256
        with contextlib.suppress(OSError):
            if blob.stat().st_nlink == 1:
                blob.unlink()


def download(plan: Plan, dest: Path, options: Options, sources: PartSources = NO_SOURCES) -> Result:
    """Fetch, verify and publish `plan` at `dest`; idempotent when `dest` already holds it.

    `sources`: peers and arrivals beside the origin, and the origin budget before it (none: the
    origin only, ungated).
    """
    started = time.monotonic()
    check_size(plan, options)
    dest = Path(dest)
    if is_published(dest, plan, options.cache_uid, options.signature):
        log.info("already complete dest=%s commit=%s", dest, plan.revision, extra=SUMMARY)
        return Result(plan, seconds=time.monotonic() - started)
    staging, pvc = staging_for(dest, options)
    access: Access = origin_for(plan.source.scheme).open(plan, options)
    if sources.throttle is not None:  # the cluster-wide origin budget gates origin bytes, never peers
        access = access.behind(sources.throttle)
    engine = Engine(plan, staging, access, options, sources)
    try:
        try:
            engine.prepare()
            engine.run()
        finally:
            engine.close()
        tree_plan = _unpacked(plan, staging, engine.sha256, options)
        signed = _verify_signature(staging, options)
        if signed and signed.get(names.MANIFEST_SIGNATURE_EXCLUDED):  # exactly the files signed are published
            dropped = set(signed[names.MANIFEST_SIGNATURE_EXCLUDED])
            tree_plan = replace(tree_plan, files=tuple(f for f in tree_plan.files if f.path not in dropped))
        publish(tree_plan, staging, dest, pvc, engine.sha256, options.cache_uid, signed)
    except OSError as error:
        if error.errno not in NO_SPACE:
            raise TemporaryDownloadError(
                "SourceUnavailable",
                f"writing {dest}: {error.strerror or error}; check the disk",
            ) from None
        shutil.rmtree(staging, ignore_errors=True)  # give the space back; resuming cannot fit either
        free = shutil.disk_usage(staging.parent if staging.parent.exists() else dest.parent).free
        raise LastingDownloadError(
            "InsufficientDiskSpace",
            f"{plan.source.uri} needs {format_bytes(plan.disk_bytes(options.max_bytes))} but only "
            f"{format_bytes(free)} is free "
            f"on the filesystem of {dest}; free space or use a larger disk",
        ) from None
    except (DownloadError, DownloadCancelled):
        raise
    result = engine.result
    result.seconds = time.monotonic() - started
    log.info(
        "published dest=%s commit=%s origin_bytes=%d dedup_bytes=%d resumed_bytes=%d direct_bytes=%d seconds=%.2f",
        dest, plan.revision, result.bytes_from_origin, result.bytes_deduplicated, result.bytes_resumed,
        result.bytes_written_direct, result.seconds, extra=SUMMARY,
    )  # fmt: skip
    return result


__all__ = ["check_size", "download", "plan"]
