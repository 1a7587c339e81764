"""Object stores (`s3://`, `gs://`, `az://BUCKET/PREFIX`): listed, digested and read through obstore.

plan.py lists the prefix (HEAD for what the listing lacks; storesums.py asks for the store's own
checksums), creds.py turns a credentials Secret, the environment or the cluster's workload
identity into the store's client settings, fetch.py streams pinned ranged reads (If-Match on the
planned ETag, the planned version).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from praesto.agent.download.access import Access
from praesto.agent.download.api import DownloadError, Options, Plan
from praesto.agent.download.origin import SETTINGS, CredentialShape
from praesto.agent.download.origins.objstore import plan as store_plan
from praesto.agent.download.origins.objstore.creds import settings_from_env, settings_from_secret
from praesto.agent.download.origins.objstore.fetch import access_for

from praesto.spec import Source


class ObjectStore:
    """S3, GCS and Azure Blob as an `Origin` (download/origin.py)."""

    credential = CredentialShape(SETTINGS, from_secret=settings_from_secret, from_env=settings_from_env)

    def plan(self, source: Source, options: Options) -> Plan:
        return store_plan.plan(source, options)

    def open(self, plan: Plan, options: Options) -> Access:
        return access_for(plan, options)

    def host(self, plan: Plan, options: Options) -> str:
        """The bucket at its endpoint (#21 item 7: a tenant's own S3-compatible server with a bucket
        named like another tenant's AWS bucket is another origin, so it neither shares nor holds that
        bucket's places). The endpoint is the one the download uses (plan.config_for: the cache's
        Secret, else the agent's environment); none is the cloud's own, per account for Azure."""
        bucket = plan.source.location.split("/", 1)[0]
        try:
            config = store_plan.config_for(plan.source, options).config
        except DownloadError:  # planning opened the store with this very config, so this is unreachable
            config = {}
        endpoint = str(config.get("endpoint") or config.get("base_url") or "")
        account = str(config.get("account_name") or "")
        at = urlsplit(endpoint).netloc.lower() if endpoint else (f"{account}." if account else "") + "default"
        return f"{plan.source.scheme}://{at}/{bucket}"


def origin() -> ObjectStore:
    return ObjectStore()


__all__ = ["ObjectStore", "origin"]
