"""Validate hook children against their real schemas: our CRDs, and Kubernetes' own."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from praesto import names

ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = ROOT / "charts" / "praesto" / "crds"
K8S_VERSION = kubernetes_validate.utils.latest_version()


@cache
def crd(kind: str) -> dict[str, Any]:
    for path in sorted(CRD_DIR.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if doc["spec"]["names"]["kind"] == kind:
            return doc  # type: ignore[no-any-return]
    raise LookupError(f"no CRD for {kind} in {CRD_DIR}")


@cache
def _validator(kind: str) -> jsonschema.protocols.Validator:
    schema = crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return jsonschema.Draft7Validator(schema)


def crd_errors(obj: dict[str, Any]) -> list[str]:
    """Every way `obj` fails its CRD's OpenAPI schema (CEL rules are checked separately)."""
    return [
        f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}"
        for e in _validator(obj["kind"]).iter_errors(obj)
    ]


def validate_child(child: dict[str, Any]) -> None:
    """Raise if a child the hook returned would be refused by the API server's schema."""
    if child["apiVersion"] == names.API_VERSION:
        errors = crd_errors(child)
        assert not errors, errors
    else:
        kubernetes_validate.validate(child, K8S_VERSION, strict=True)
