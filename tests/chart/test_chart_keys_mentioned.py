"""Every chart key that code, messages and docs tell users to set exists in values.schema.json.

A refusal that names a key the chart rejects ("set the chart's agent.basePath",
when the key is localCache.basePath) sends users into a second error.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from testkit.helm_chart import CHART_DIR, ROOT, value_key_exists

SCHEMA = json.loads((CHART_DIR / "values.schema.json").read_text())
TOP_LEVEL = sorted(SCHEMA["properties"], key=len, reverse=True)
# "the chart's localCache.basePath", "chart value nodeAgent.reserve", "chart key credentials.secretRef"
AFTER_CHART = re.compile(
    r"chart(?:'s)?(?: (?:value|key)s?)? `?([a-zA-Z][A-Za-z0-9]*(?:\.[A-Za-z][A-Za-z0-9]*)+)"
)
# a dotted key in backticks or quotes that starts with a top-level value: `nodeAgent.reserve`
QUOTED = re.compile(
    r"[`'\"](" + "|".join(map(re.escape, TOP_LEVEL)) + r")((?:\.[A-Za-z][A-Za-z0-9]*)+)[`'\"]"
)
SOURCES = [
    *(ROOT / d for d in ("agent", "hooks", "csi", "praesto")),
    CHART_DIR / "templates",
    ROOT / "README.md",
    CHART_DIR / "README.md",
    ROOT / "docs",
]


def files() -> list[Path]:
    out: list[Path] = []
    for source in SOURCES:
        if source.is_file():
            out.append(source)
        elif source.is_dir():
            out += [p for p in source.rglob("*") if p.suffix in (".py", ".md", ".txt", ".tpl", ".yaml")]
    return [p for p in out if "proto" not in p.parts]


DOMAIN = re.compile(r"\.(io|com|org|dev|k8s)$")  # API groups and driver names, not keys


def mentioned() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in files():
        text = path.read_text(errors="replace")
        for match in AFTER_CHART.finditer(text):
            found.setdefault(match.group(1).rstrip("."), []).append(str(path.relative_to(ROOT)))
        for match in QUOTED.finditer(text):
            found.setdefault(match.group(1) + match.group(2), []).append(str(path.relative_to(ROOT)))
    return {key: where for key, where in found.items() if not DOMAIN.search(key)}


def test_the_scan_finds_the_keys_we_know_are_mentioned() -> None:
    keys = mentioned()
    assert {"localCache.basePath", "credentials.secretRef"} <= set(keys)


def test_every_mentioned_chart_key_exists() -> None:
    missing = {key: where for key, where in mentioned().items() if not value_key_exists(key)}
    assert missing == {}, f"keys the chart's schema does not have: {missing}"
