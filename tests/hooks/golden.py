"""Golden files: a scenario's request and the response the hooks must give.

Regenerate deliberately with `PRAESTO_UPDATE_GOLDENS=1 pytest tests/hooks/test_hooks_golden.py`
and review the diff: the files are the assertions.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from praesto.hooks.common import format_time
from praesto.hooks.config import HooksConfig
from praesto.hooks.modelcache import HOOKS

from testkit.hook_objects import NOW
from tests.hooks.scenarios import SCENARIOS

GOLDEN_DIR = Path(__file__).parent / "golden"
UPDATE = os.environ.get("PRAESTO_UPDATE_GOLDENS") == "1"
CONFIG = HooksConfig(
    downloader_image="ghcr.io/praesto/praesto:test",
    agent_service_account="praesto-node-agent",
    namespace="praesto-system",
    hf_endpoint="https://hf-mirror.example.com",
    allowed_downloader_images=("registry.example/praesto:*",),  # pvc-token-and-overrides uses :custom
)


def path_of(name: str) -> Path:
    return GOLDEN_DIR / f"{name}.json"


def load(name: str) -> dict[str, Any]:
    path = path_of(name)
    if UPDATE:
        hook, build = SCENARIOS[name]
        request = build()
        response = HOOKS[hook](request, CONFIG, NOW)
        GOLDEN_DIR.mkdir(exist_ok=True)
        doc = {"hook": hook, "now": format_time(NOW), "request": request, "response": response}
        path.write_text(json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; run with PRAESTO_UPDATE_GOLDENS=1 and review it")
    return json.loads(path.read_text())  # type: ignore[no-any-return]
