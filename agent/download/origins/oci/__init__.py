"""OCI / ModelPack artifacts (`oci://HOST/REPOSITORY[:TAG|@DIGEST]`) from a registry or its mirrors.

plan.py fetches the manifest (an index: the model's platform) and maps its layers to files
(media.py: ModelPack, ORAS), registry.py speaks to the registry and its mirrors (PRAESTO_OCI_MIRRORS)
with auth.py's login and token challenges, fetch.py gives the engine each blob's URL; archive
layers are unpacked by the download core (unpack.py).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from praesto.agent.download.access import Access
from praesto.agent.download.api import Options, Plan
from praesto.agent.download.origin import REGISTRY_LOGIN, CredentialShape
from praesto.agent.download.origins.oci import plan as registry_plan
from praesto.agent.download.origins.oci.fetch import access_for, blob_base

from praesto import names
from praesto.spec import Source


class Oci:
    """A registry as an `Origin` (download/origin.py)."""

    # a kubernetes.io/dockerconfigjson Secret (kubectl create secret docker-registry)
    credential = CredentialShape(
        REGISTRY_LOGIN, key=names.DOCKER_CONFIG_KEY, cluster_key=names.DOCKER_CONFIG_KEY
    )

    def plan(self, source: Source, options: Options) -> Plan:
        return registry_plan.plan(source, options)

    def open(self, plan: Plan, options: Options) -> Access:
        return access_for(plan, options)

    def host(self, plan: Plan, options: Options) -> str:
        """The registry (or mirror) host the blobs come from."""
        return urlsplit(blob_base(plan)).netloc


def origin() -> Oci:
    return Oci()


__all__ = ["Oci", "origin"]
