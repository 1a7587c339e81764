"""What every object-store emulator test checks, written once: a sample model tree,
plan -> download -> verified publication with a correct manifest, and the CLI runner."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from praesto.agent.download import Options, Plan
from praesto.agent.download.fetch import download, plan
from praesto.agent.download.origins.objstore.plan import revision_of

from praesto import names
from praesto.spec import Source, parse_uri
from testkit.egress import LOOPBACK, LOOPBACK_ENV
from testkit.model_tree import tree_of

MiB = 1 << 20


def sample_files() -> dict[str, bytes]:
    """Nested keys, an empty object and one multi-MiB object (fetched as several ranges)."""
    return {
        "config.json": b'{"model_type": "test"}',
        "model.safetensors": os.urandom(5 * MiB + 17),
        "tokenizer/vocab.txt": b"a\nb\nc\n" * 1000,
        "nested/deeper/weights-00001.bin": os.urandom(70_000),
        "empty.txt": b"",
    }


def source(uri: str) -> Source:
    parsed, errors = parse_uri(uri)
    assert parsed is not None and not errors, errors
    return parsed


def options(credentials: dict[str, str], **kwargs: object) -> Options:
    defaults: dict[str, object] = {"credentials": credentials, "part_size": 1 * MiB, "concurrency": 4,
                                   "egress": LOOPBACK}  # the emulators listen on loopback  # fmt: skip
    defaults.update(kwargs)
    return Options(**defaults)  # type: ignore[arg-type]


def check_prefix_download(
    uri: str, opts: Options, files: dict[str, bytes], dest: Path, ranged_reads: Callable[[], int]
) -> Plan:
    """plan() lists exactly the prefix with sizes and ETags; download() publishes it identical,
    the big object as ranged reads, with sha256s, ETags and the revision in the manifest."""
    resolved = plan(source(uri), opts)
    assert {f.path: f.size for f in resolved.files} == {p: len(d) for p, d in files.items()}
    assert all(f.etag for f in resolved.files)
    assert resolved.revision == revision_of(resolved.files)
    before = ranged_reads()

    result = download(resolved, dest, opts)

    assert tree_of(dest) == files
    assert result.bytes_from_origin == sum(len(d) for d in files.values())
    assert ranged_reads() - before >= 6  # 5 MiB + 17 bytes in 1 MiB parts
    manifest = json.loads((dest / names.MANIFEST_FILE).read_text())
    assert manifest["resolvedRevision"] == resolved.revision
    by_path = {f["path"]: f for f in manifest["files"]}
    assert set(by_path) == set(files)
    for f in resolved.files:
        assert by_path[f.path]["sha256"] == hashlib.sha256(files[f.path]).hexdigest()
        assert by_path[f.path]["etag"] == f.etag and by_path[f.path].get("version") == f.version
    assert (dest / names.COMPLETE_FILE).read_text().strip() == resolved.revision
    return resolved


def run_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`praesto-agent …` in a subprocess, with no cloud credentials leaking in from this one."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "HF_", "AZURE_", "GOOGLE_"))}
    base.update(LOOPBACK_ENV)  # the emulators listen on loopback
    return subprocess.run(
        [sys.executable, "-m", "praesto.agent.cli", *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def write_secret_dir(directory: Path, settings: dict[str, str]) -> Path:
    """A mounted Secret as the PVC-mode Job sees it: one file per key."""
    directory.mkdir()
    for key, value in settings.items():
        (directory / key).write_text(value)
    return directory
