"""The settings of `praesto-agent download` from its environment: read once, at the process edge.

The PVC-mode Job sets these variables (hooks/pvc_job.py); a user may too. Everything below the
CLI gets the values through `Options`, never from the environment; the store clients' own
variables (AWS_*, GOOGLE_*, AZURE_*, proxies) reach objcreds.store_config as `store_env`, the
environment this process started with.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from praesto import names


@dataclass(frozen=True)
class DownloadSettings:
    # HF_ENDPOINT: the Hugging Face endpoint or mirror; --endpoint wins; unset: huggingface.co
    hf_endpoint: str | None = None
    # HF_TOKEN: the Hub token; --token-file wins. Memory only, never logged or repr()ed.
    hf_token: str | None = field(default=None, repr=False)
    # PRAESTO_CA_BUNDLE: an extra PEM CA bundle every byte fetch trusts besides the system roots
    ca_bundle: str | None = None
    # PRAESTO_TERMINATION_LOG: where a finished download writes its result for the sync hook
    termination_log: str | None = None
    # The whole environment as the process started, for the store clients' settings (workload
    # identity, endpoints, proxies, CA: objcreds.store_config reads what it knows from it).
    store_env: Mapping[str, str] = field(default_factory=dict, repr=False)
    # PRAESTO_EGRESS_ALLOWED_CIDRS: internal networks the source may reach (download/egress.py);
    # --egress-allowed-cidrs wins; unset: every loopback, link-local, metadata and private address refused
    egress_allowed_cidrs: str = ""
    # PRAESTO_XET: "true", Hugging Face files stored in Xet come through the Xet CAS (download/xetpath.py);
    # --xet wins; unset: off
    xet: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> DownloadSettings:
        return cls(
            hf_endpoint=env.get(names.ENV_HF_ENDPOINT) or None,
            hf_token=env.get(names.ENV_HF_TOKEN) or None,
            ca_bundle=env.get(names.ENV_CA_BUNDLE) or None,
            egress_allowed_cidrs=env.get(names.ENV_EGRESS_ALLOWED_CIDRS) or "",
            xet=env.get(names.ENV_XET) == "true",
            termination_log=env.get(names.ENV_TERMINATION_LOG) or None,
            store_env=dict(env),
        )
