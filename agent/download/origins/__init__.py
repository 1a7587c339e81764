"""The one table of source kinds the downloader knows: URI scheme -> the package of its origin.

Each package exposes `origin() -> Origin` (download/origin.py). The table names packages by module
path and imports one the first time a source of its scheme is planned or fetched, so a kind's client
library (huggingface_hub, obstore, modelscope's endpoints) is loaded only when used: huggingface_hub
reads its own environment variables at import, which the agent must not do for a node that never
fetches from the Hub. The kinds import only the download core (the Origin protocol is
download/origin.py), so this lazy edge is the only one between the table and the kinds: no cycle.
The dispatcher (praesto.agent.download.fetch) imports this table and the core.
Adding a kind is one row here and one package beside the others.
"""

from __future__ import annotations

import importlib
from functools import cache

from praesto.agent.download.origin import Origin

ORIGINS: dict[str, str] = {
    "hf": "praesto.agent.download.origins.huggingface",
    "s3": "praesto.agent.download.origins.objstore",
    "gs": "praesto.agent.download.origins.objstore",
    "az": "praesto.agent.download.origins.objstore",
    "oci": "praesto.agent.download.origins.oci",
    "ms": "praesto.agent.download.origins.modelscope",
}


@cache
def origin_for(scheme: str) -> Origin:
    """The origin of `scheme`'s sources; KeyError names a scheme no row has (spec.parse_uri refuses
    those before a download starts, so reaching it is a programming error)."""
    module = importlib.import_module(ORIGINS[scheme])
    found: Origin = module.origin()
    return found


__all__ = ["ORIGINS", "Origin", "origin_for"]
