"""Regenerate the committed CSI stubs from `csi/proto/csi.proto`.

The stubs are committed so that the image and the type checker need no
protoc; this script is the only way they change, and a test runs it into a
temporary directory and compares bytes, so the committed files never drift
from the .proto. Output depends only on the .proto and the pinned
grpcio-tools version.

Usage: python scripts/gen_csi_stubs.py [--out DIR]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "csi" / "proto"
PROTO_NAME = "csi.proto"
OUTPUTS = ("csi_pb2.py", "csi_pb2.pyi", "csi_pb2_grpc.py")
# grpc's plugin imports the messages module as a top-level module; inside the
# installed package it lives at praesto.csi.proto.
BARE_IMPORT = "import csi_pb2 as csi__pb2"
PACKAGE_IMPORT = "from praesto.csi.proto import csi_pb2 as csi__pb2"


def generate(out_dir: Path) -> list[Path]:
    """Run protoc (grpcio-tools) and write the three stub files into out_dir."""
    from grpc_tools import protoc

    well_known = str(resources.files("grpc_tools") / "_proto")
    with tempfile.TemporaryDirectory() as work:
        # copy the .proto so the descriptor's file name is exactly "csi.proto"
        shutil.copyfile(PROTO_DIR / PROTO_NAME, Path(work) / PROTO_NAME)
        args = [
            "grpc_tools.protoc",
            f"-I{work}",
            f"-I{well_known}",
            f"--python_out={work}",
            f"--pyi_out={work}",
            f"--grpc_python_out={work}",
            PROTO_NAME,
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {PROTO_DIR / PROTO_NAME}")
        grpc_file = Path(work) / "csi_pb2_grpc.py"
        text = grpc_file.read_text()
        if BARE_IMPORT not in text:
            raise RuntimeError(f"{grpc_file.name}: expected `{BARE_IMPORT}` from the grpc plugin")
        grpc_file.write_text(text.replace(BARE_IMPORT, PACKAGE_IMPORT))
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for name in OUTPUTS:
            shutil.copyfile(Path(work) / name, out_dir / name)
            written.append(out_dir / name)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PROTO_DIR, help="directory for the stubs")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
