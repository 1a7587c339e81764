"""OCI blobs for the same engine the Hub uses: each layer a file the engine fetches by URL.

The plan (plan.py) already holds each blob's URL at the endpoint that served the manifest
(`RemoteFile.key`), so that is where a file's bytes are; the transport is the registry's
(registry.RegistryTransport: its `Authorization`, renewed on a 401). Ranged GETs, redirects to
storage (no `Authorization` off the registry's origin), resume, peers, dedup by sha256 and the
origin budget are the engine's, as for every origin.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from praesto.agent.download.access import Access
from praesto.agent.download.api import Options, Plan, RemoteFile
from praesto.agent.download.origins.oci.registry import Endpoint, transport_for

from praesto.ocireference import reference_of


def blob_url(f: RemoteFile) -> str:
    assert f.key is not None, f.path  # plan.py gives every layer its blob URL
    return f.key


def blob_base(plan: Plan) -> str:
    """scheme://host[:port] of the endpoint the plan's blobs come from."""
    first = next((f.key for f in plan.files if f.key), "")
    parts = urlsplit(first)
    return f"{parts.scheme}://{parts.netloc}"


def access_for(plan: Plan, options: Options) -> Access:
    ref = reference_of(plan.source.location, plan.source.revision)
    base = blob_base(plan)
    endpoint = Endpoint(base, mirror=urlsplit(base).netloc != ref.api_host)
    return Access(base, transport_for(endpoint, ref, options), blob_url)
