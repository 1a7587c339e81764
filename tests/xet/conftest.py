"""One small repository uploaded by the real hf_xet client to a XetDouble, per test module."""

from __future__ import annotations

import random
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from testkit.xet import HfXet, Uploaded, XetDouble, running_double

MIB = 1024 * 1024


def repository(folder: Path) -> dict[str, bytes]:
    """Files that exercise every scheme and dedup: repeated blocks, float-like data (bg4-lz4),
    text (lz4), random bytes (stored plain), and two files sharing half their content."""
    rnd = random.Random(40)
    block = rnd.randbytes(256 * 1024)
    shared = rnd.randbytes(1 * MIB)
    files = {
        "config.json": b'{"architectures": ["Tiny"], "hidden_size": 64}\n',
        "model.bin": block * 32,  # 8 MiB of one repeated 256 KiB block
        "weights.f32": b"".join(struct.pack("<f", 1.0 + rnd.random() / 1000) for _ in range(200_000)),
        "notes.txt": b"".join(
            b"line %d of the model card, mostly the same words\n" % i for i in range(20_000)
        ),
        "shard-a.bin": shared + rnd.randbytes(1 * MIB),
    }
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return files


@dataclass
class Repo:
    double: XetDouble
    client: HfXet
    folder: Path
    files: dict[str, bytes]
    uploaded: dict[str, Uploaded]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Repo]:
    folder = tmp_path_factory.mktemp("xet-repo")
    files = repository(folder)
    with running_double() as double:
        client = HfXet(double, tmp_path_factory.mktemp("xet-cache"))
        uploaded = client.upload([folder / name for name in files])
        yield Repo(double, client, folder, files, {Path(u.path).name: u for u in uploaded})
