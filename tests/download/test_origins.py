"""The origins table: one row per URI scheme the spec accepts, each an `Origin` the engine can ask.

The download core names no kind: the engine is handed an `Access` (access.py), the dispatcher,
credentials, CLI and origin budget ask the table (agent/download/origins/).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from praesto.agent.download.origin import CREDENTIAL_FORMS, SETTINGS, CredentialShape
from praesto.agent.download.origins import ORIGINS, origin_for

from praesto.spec import URI_SCHEMES

DOWNLOAD = Path(__file__).resolve().parents[2] / "agent" / "download"


def test_every_scheme_the_spec_accepts_has_one_origin() -> None:
    assert sorted(ORIGINS) == sorted(URI_SCHEMES)


@pytest.mark.parametrize("scheme", sorted(ORIGINS))
def test_each_origin_answers_what_the_engine_asks(scheme: str) -> None:
    found = origin_for(scheme)
    assert callable(found.plan) and callable(found.open) and callable(found.host)
    assert isinstance(found.credential, CredentialShape)
    assert found.credential.form in CREDENTIAL_FORMS


def test_a_settings_shape_says_how_to_read_both_inputs() -> None:
    with pytest.raises(AssertionError):
        CredentialShape(SETTINGS)


def test_the_download_core_imports_no_origin() -> None:
    """engine.py and the rest of the core import no origin: only praesto.agent.download.fetch joins
    the core and the origins (tests/test_import_graph.py: no package cycle, every import counted)."""
    for path in sorted(DOWNLOAD.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert ".origins" not in node.module, f"{path.name} imports {node.module}"
