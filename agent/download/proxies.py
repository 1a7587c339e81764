"""HTTP_PROXY / HTTPS_PROXY / NO_PROXY for byte fetches, from the environment the process edge read.

http.client ignores these variables; byte fetches tunnel through the proxy with CONNECT (for
http:// origins too, which a proxy must then allow), the way the metadata client (httpx) reaches
https origins through it. The names and their precedence are urllib's
(`urllib.request.getproxies_environment`: the lowercase name wins), read from the mapping the
edge handed in (`EngineSettings.from_environment`, the environment as the process started), never from
`os.environ` at the point of use.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Mapping
from urllib.parse import urlsplit

SCHEMES = ("http", "https", "no")  # HTTP_PROXY, HTTPS_PROXY, NO_PROXY


def proxies_from_env(env: Mapping[str, str]) -> dict[str, str]:
    """{"http": ..., "https": ..., "no": ...} for the variables set in `env` (lowercase wins)."""
    proxies = {}
    for scheme in SCHEMES:
        value = env.get(f"{scheme}_proxy") or env.get(f"{scheme.upper()}_PROXY")
        if value:
            proxies[scheme] = value
    return proxies


def proxy_for(scheme: str, netloc: str, proxies: Mapping[str, str]) -> str | None:
    """host:port of the proxy for this origin, unless NO_PROXY spares it; None: connect directly."""
    proxy = proxies.get(scheme) or proxies.get("https" if scheme == "http" else "http")
    host = netloc.rsplit(":", 1)[0]
    # urllib's own NO_PROXY matching over the given mapping (CPython 3.11; typeshed leaves it out)
    if not proxy or urllib.request.proxy_bypass_environment(host, dict(proxies)):  # type: ignore[attr-defined]
        return None
    return urlsplit(proxy if "://" in proxy else f"http://{proxy}").netloc or None
