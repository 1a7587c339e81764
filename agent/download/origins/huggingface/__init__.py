"""Hugging Face Hub models (`hf://ORG/NAME[:REV]`): the Hub's API plans, `resolve/` serves bytes.

plan.py resolves the revision and lists files through `huggingface_hub` (hubclient.py keeps its
connections under the egress rule); bytes come over `resolve/` URLs at the Hub endpoint
(`--endpoint`, HF_ENDPOINT: a mirror) with the token to the Hub only; with `Options.xet`, files the
Hub stores in Xet come whole through the Xet CAS (xetfetch.py, xetpath.py, the format core xet/).
"""

from __future__ import annotations

from urllib.parse import quote, urlsplit

from praesto.agent.download.access import Access
from praesto.agent.download.api import Options, Plan, RemoteFile
from praesto.agent.download.origin import TOKEN, CredentialShape, http_transport
from praesto.agent.download.origins.huggingface.endpoint import endpoint_of
from praesto.agent.download.origins.huggingface.xetfetch import XetOrigin
from praesto.agent.download.origins.huggingface.xetpath import XetRoute
from praesto.agent.download.origins.huggingface.xetstore import ChunkStore, chunk_store_bytes

from praesto import store
from praesto.spec import Source


class HuggingFace:
    """The Hub as an `Origin` (download/origin.py)."""

    # the cache's token.secretRef key (HF_TOKEN, then token); the chart's credentials Secret: HF_TOKEN
    credential = CredentialShape(TOKEN, cluster_key="HF_TOKEN")

    def plan(self, source: Source, options: Options) -> Plan:
        # Imported here, the one place that needs it: plan.py loads huggingface_hub, which reads its
        # own environment variables on import; the chunk store (eviction, room, scrub) and the Xet
        # route live in this package and must not (tests/test_settings_inventory.py).
        from praesto.agent.download.origins.huggingface import plan as hub_plan

        return hub_plan.plan(source, options)

    def open(self, plan: Plan, options: Options) -> Access:
        endpoint = endpoint_of(options)
        base = f"{endpoint}/{plan.source.location}/resolve/{plan.revision}"

        def locate(f: RemoteFile) -> str:
            return f"{base}/{quote(f.path)}"

        xet = options.xet and any(f.xet_hash for f in plan.files)
        # xet_chunks False: the node has no room for chunks above its reserve (agent/room.py)
        keep = options.blobs_dir if options.xet_chunks else None
        chunks = ChunkStore(store.xet_chunks_beside(keep), chunk_store_bytes(plan)) if keep else None
        repo, revision = plan.source.location, plan.revision
        route = XetRoute(XetOrigin(endpoint, repo, revision, options, chunks)) if xet else None
        # the Hub the platform configured is trusted as it is; where it redirects is checked
        return Access(endpoint, http_transport(endpoint, options.token, options), locate, route)

    def host(self, plan: Plan, options: Options) -> str:
        return urlsplit(endpoint_of(options)).netloc


def origin() -> HuggingFace:
    return HuggingFace()


__all__ = ["HuggingFace", "origin"]
