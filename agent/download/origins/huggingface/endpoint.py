"""The Hub endpoint a plan and its bytes go to, apart from plan.py so that reading it (and the
chunk store, the Xet route) does not load `huggingface_hub`, which plan.py imports."""

from __future__ import annotations

from praesto.agent.download.api import Options

DEFAULT_ENDPOINT = "https://huggingface.co"


def endpoint_of(options: Options) -> str:
    """The Hub to ask: Options.endpoint (the process edge fills it from --endpoint or HF_ENDPOINT)."""
    return (options.endpoint or DEFAULT_ENDPOINT).rstrip("/")
