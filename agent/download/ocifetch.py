"""OCI blobs for the same engine the Hub uses: each layer a file the engine fetches by URL.

The plan (ociplan.py) already holds each blob's URL at the endpoint that served the
manifest, so the engine's "resolve URL" is that; the transport is the registry's
(ociregistry.RegistryTransport: its `Authorization`, renewed on a 401). Ranged GETs,
redirects to storage (no `Authorization` off the registry's origin), resume, peers,
dedup by sha256 and the origin budget are the Hub path unchanged.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from praesto.agent.download.api import Options, Plan, RemoteFile
from praesto.agent.download.engine import Engine
from praesto.agent.download.ociregistry import Endpoint, transport_for

from praesto.ocireference import reference_of


class OciEngine(Engine):
    """The Hub engine with blob URLs instead of resolve URLs."""

    def _resolve_url(self, f: RemoteFile) -> str:
        assert f.key is not None, f.path  # ociplan gives every layer its blob URL
        return f.key


def blob_base(plan: Plan) -> str:
    """scheme://host[:port] of the endpoint the plan's blobs come from."""
    first = next((f.key for f in plan.files if f.key), "")
    parts = urlsplit(first)
    return f"{parts.scheme}://{parts.netloc}"


def engine_for(plan: Plan, staging: Path, options: Options) -> Engine:
    ref = reference_of(plan.source.location, plan.source.revision)
    base = blob_base(plan)
    endpoint = Endpoint(base, mirror=urlsplit(base).netloc != ref.api_host)
    return OciEngine(plan, staging, base, options, transport=transport_for(endpoint, ref, options))
