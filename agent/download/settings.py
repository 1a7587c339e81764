"""The settings of `praesto-agent download` from its environment: read once, at the process edge.

The PVC-mode Job sets these variables (hooks/pvc_job.py); a user may too. Everything below the
CLI gets the values through `Options`, never from the environment; what downloads take from the
environment this process started with (the proxies, the OCI mirrors, the store clients' own variables
that origins/objstore/creds.py store_config reads) is read here once, as `environment`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from praesto.agent.download.api import EngineSettings

from praesto import kinds, names


@dataclass(frozen=True)
class DownloadSettings:
    # HF_ENDPOINT: the Hugging Face endpoint or mirror; --endpoint wins; unset: huggingface.co
    hf_endpoint: str | None = None
    # Each token kind's own variable, by scheme (praesto/kinds.py: HF_TOKEN for hf, MODELSCOPE_API_TOKEN
    # for ms); --token-file wins. A token goes only to its own kind's hub: an exported HF_TOKEN never
    # reaches ModelScope. Memory only, never logged or repr()ed.
    tokens: Mapping[str, str] = field(default_factory=dict, repr=False)
    # PRAESTO_CA_BUNDLE: an extra PEM CA bundle every byte fetch trusts besides the system roots
    ca_bundle: str | None = None
    # PRAESTO_TERMINATION_LOG: where a finished download writes its result for the sync hook
    termination_log: str | None = None
    # What downloads take from the environment as the process started (EngineSettings.from_environment:
    # the proxies, the OCI mirrors, the object-store clients' variables); the CLI adds its flags to it.
    environment: EngineSettings = field(default_factory=EngineSettings, repr=False)
    # PRAESTO_EGRESS_ALLOWED_CIDRS: internal networks the source may reach (download/egress.py);
    # --egress-allowed-cidrs wins; unset: every loopback, link-local, metadata and private address refused
    egress_allowed_cidrs: str = ""
    # PRAESTO_XET: "true", Hugging Face files stored in Xet come through the Xet CAS
    # (download/origins/huggingface/xetpath.py); --xet wins; unset: off
    xet: bool = False
    # MODELSCOPE_ENDPOINT: the ModelScope hub or mirror (the sync hook sets it from the chart's
    # downloader.modelscopeEndpoint); unset: modelscope.cn
    modelscope_endpoint: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> DownloadSettings:
        return cls(
            hf_endpoint=env.get(names.ENV_HF_ENDPOINT) or None,
            tokens={
                kind.scheme: env[kind.credential.env]
                for kind in kinds.KINDS
                if kind.credential.shape == kinds.TOKEN and env.get(kind.credential.env)
            },
            modelscope_endpoint=env.get(names.ENV_MODELSCOPE_ENDPOINT) or None,
            ca_bundle=env.get(names.ENV_CA_BUNDLE) or None,
            egress_allowed_cidrs=env.get(names.ENV_EGRESS_ALLOWED_CIDRS) or "",
            xet=env.get(names.ENV_XET) == "true",
            termination_log=env.get(names.ENV_TERMINATION_LOG) or None,
            environment=EngineSettings.from_environment(env),
        )

    def token_for(self, scheme: str) -> str | None:
        """The token of `scheme`'s own variable; None for kinds whose credential is not a token."""
        return self.tokens.get(scheme)
