"""Object-store bytes for the same engine the Hub uses: ranged, streamed, pinned reads.

`ObjectSource` is the engine's `ByteSource` for s3/gs/az: each part is one ranged GET
through `obstore` (Rust, so the threads fetch in parallel without the GIL), streamed in
1 MiB chunks straight into the engine's `pwrite` + hashing sink, pinned with If-Match on
the planned ETag and the planned version. Everything else (staging, resume journal,
verification, dedup, atomic publication) is the Hugging Face path unchanged.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import obstore
from obstore.exceptions import NotFoundError, PreconditionError
from praesto.agent.download.access import Access
from praesto.agent.download.api import (
    DownloadCancelled,
    Options,
    Plan,
    RemoteFile,
    Target,
    TemporaryDownloadError,
)
from praesto.agent.download.http import CHUNK, Transient
from praesto.agent.download.origins.objstore.creds import StoreConfig
from praesto.agent.download.origins.objstore.plan import (
    STORE_ERRORS,
    Store,
    config_for,
    open_store,
    translate,
)

if TYPE_CHECKING:
    from obstore import GetOptions


class ObjectSource:
    def __init__(self, store: Store, cfg: StoreConfig, plan: Plan) -> None:
        self.store, self.cfg, self.uri = store, cfg, plan.source.uri
        self.files = {f.path: f for f in plan.files}

    def resolve(self, url: str) -> Target:
        return Target(url, True)

    def fetch(
        self,
        target: Target,
        start: int,
        end: int,
        sink: Callable[[int, memoryview], None],
        cancel: threading.Event,
    ) -> int:
        f = self.files[target.url]
        options: GetOptions = {"range": (start, end)}
        if f.etag:
            options["if_match"] = f.etag
        if f.version:
            options["version"] = f.version
        offset = start
        try:
            stream = obstore.get(self.store, f.key or f.path, options=options).stream(min_chunk_size=CHUNK)
        except STORE_ERRORS as error:
            raise self._failure(error, f) from None
        while offset < end:
            if cancel.is_set():
                raise DownloadCancelled()
            try:
                chunk = next(stream)
            except StopIteration:
                break
            except STORE_ERRORS as error:  # only the store's: a disk error from sink() stays an OSError
                raise self._failure(error, f) from None
            view = memoryview(chunk)[: end - offset]
            sink(offset, view)
            offset += len(view)
        if offset < end:
            raise Transient(
                f"{f.path}: the store closed the stream after {offset - start} of {end - start} bytes"
            )
        return offset - start

    def _failure(self, error: Exception, f: RemoteFile) -> Exception:
        mapped = translate(error, self.uri, self.cfg, f"reading {f.path}")
        if isinstance(mapped, TemporaryDownloadError) and not isinstance(
            error, NotFoundError | FileNotFoundError | PreconditionError
        ):
            return Transient(mapped.message)  # the engine retries from where the stream stopped
        return mapped  # refused, gone or replaced: fail (replaced or gone: planned again on retry)

    def close(self) -> None:
        """Connections belong to the store's pool; nothing per thread to close."""


def access_for(plan: Plan, options: Options) -> Access:
    """The store's ranged reads of `plan`'s objects, each file located by its path in the plan."""
    cfg = config_for(plan.source, options)
    return Access(plan.source.uri, ObjectSource(open_store(cfg), cfg, plan), _object_path)


def _object_path(f: RemoteFile) -> str:
    return f.path  # ObjectSource looks the file up by it: its key, ETag and version
