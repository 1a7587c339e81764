"""A ConfigMap volume as the kubelet writes and updates it, for processes that read one (the agent's
--trust-dir): the kubelet's AtomicWriter (kubernetes v1.37.2, pkg/volume/util/atomic_writer.go
`Write`), step for step.

Each version of the data goes into a new timestamped folder (`..2006_01_02_15_04_05.<random>`),
a `..data_tmp` symlink to it is renamed over `..data` (the one atomic step), every key is a
symlink `<key> -> ..data/<key>`, keys gone from the data lose their symlink, and the old folder
is removed. A reader thus sees the old version or the new one, never a mix.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

DATA_DIR = "..data"
NEW_DATA_DIR = "..data_tmp"


def project(target: Path, data: Mapping[str, bytes]) -> None:
    """Write `data` (key -> bytes) into the volume at `target` as the kubelet does, replacing the
    version there if any."""
    target.mkdir(parents=True, exist_ok=True)
    data_link = target / DATA_DIR
    old = os.readlink(data_link) if data_link.is_symlink() else None
    stamp = time.strftime("..%Y_%m_%d_%H_%M_%S.", time.gmtime())
    folder = Path(tempfile.mkdtemp(prefix=stamp, dir=target))
    folder.chmod(0o755)
    for key, value in data.items():
        (folder / key).write_bytes(value)
        (folder / key).chmod(0o644)
    staged = target / NEW_DATA_DIR
    with contextlib.suppress(FileNotFoundError):
        staged.unlink()
    staged.symlink_to(folder.name)
    os.rename(staged, data_link)  # the atomic step
    for key in data:
        if not (target / key).is_symlink():
            (target / key).symlink_to(f"{DATA_DIR}/{key}")
    for entry in target.iterdir():
        if not entry.name.startswith("..") and entry.is_symlink() and entry.name not in data:
            entry.unlink()
    if old is not None:
        shutil.rmtree(target / old, ignore_errors=True)
