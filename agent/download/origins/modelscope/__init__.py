"""ModelScope models (`ms://ORG/NAME[:REV]`): the hub's file list plans, its file URL serves bytes.

plan.py pins the revision to a commit and reads the file list at it (every file's size and
sha256, checked and bounded); bytes come over the hub's per-file URL at that commit, in ranges,
through the same engine as every kind (resume, dedup by sha256, peers, origin budget), with the
token to the hub only (LFS objects redirect to object storage, which gets none). The endpoint is
MODELSCOPE_ENDPOINT (a mirror); hubapi.py cites the `modelscope` client for each endpoint and field.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from praesto.agent.download.access import Access
from praesto.agent.download.api import Options, Plan, RemoteFile
from praesto.agent.download.origin import TOKEN, CredentialShape, http_transport
from praesto.agent.download.origins.modelscope import plan as ms_plan
from praesto.agent.download.origins.modelscope.hubapi import ENV_TOKEN, endpoint_of, file_url

from praesto.spec import Source


class ModelScope:
    """The ModelScope hub as an `Origin` (download/origin.py)."""

    # the cache's token.secretRef key (MODELSCOPE_API_TOKEN, the client's own variable);
    # the chart's credentials Secret: the same key
    credential = CredentialShape(TOKEN, key=ENV_TOKEN, cluster_key=ENV_TOKEN)

    def plan(self, source: Source, options: Options) -> Plan:
        return ms_plan.plan(source, options)

    def open(self, plan: Plan, options: Options) -> Access:
        endpoint = endpoint_of(options)

        def locate(f: RemoteFile) -> str:
            return file_url(endpoint, plan.source.location, plan.revision, f.path)

        return Access(endpoint, http_transport(endpoint, options.token, options), locate)

    def host(self, plan: Plan, options: Options) -> str:
        return urlsplit(endpoint_of(options)).netloc


def origin() -> ModelScope:
    return ModelScope()


__all__ = ["ModelScope", "origin"]
