"""S3 prefix download: this downloader vs boto3 `download_file` vs `aws s3 sync`, same run.

    python -m bench.objstore_bench [--size-gib 2] [--objects 32] [--rounds 3] [--workdir /var/tmp]

Clients run interleaved, `--rounds` rounds; min/median/max per client, ratio of medians.

Origin: moto in server mode on loopback (its own process). The set is `--objects`
equal shards plus a few small files under one prefix. Each client runs as its own
process writing to the same disk, `sync` included in its time; its peak RSS is
reported, and moto's too (moto spills objects over ~5 MiB to temp files, so its RSS
stays low; but every GET, ranged or not, reads the whole object and holds that object's
lock, so a request costs O(object size) and ranges of one object are served one at a time).
That is why the set is 64 MiB objects (2 GiB: moto peaks near 1.8 GiB RSS, the run takes
about 80 s), and why this downloader runs with --part-size equal to the object size here: a
part per object, objects in parallel; the boto3 clients keep their defaults.
boto3 runs with its default TransferConfig (8 MiB ranges, 10 threads per object, objects
one after another); `aws s3 sync` (10 concurrent requests across objects) when the aws
CLI is installed, else the same parallelism rebuilt with boto3 threads.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import ROUNDS, interleaved, median, print_table, ratio
from testkit.s3server import S3Server

BUCKET = "bench-models"
PREFIX = "llm"
MiB = 1 << 20

BOTO3_PER_OBJECT = """
import sys, boto3, os
from pathlib import Path
bucket, prefix, dest = sys.argv[1:4]
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
    for obj in page.get("Contents", []):
        path = Path(dest) / obj["Key"][len(prefix) + 1:]
        path.parent.mkdir(parents=True, exist_ok=True)
        s3.download_file(bucket, obj["Key"], str(path))  # default TransferConfig
"""

BOTO3_SYNC_STYLE = """
import sys, boto3, os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from boto3.s3.transfer import TransferConfig
bucket, prefix, dest = sys.argv[1:4]
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
keys = [o["Key"] for p in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
        for o in p.get("Contents", [])]
config = TransferConfig(max_concurrency=1)  # aws s3 sync: 10 requests in flight across all objects
def one(key):
    path = Path(dest) / key[len(prefix) + 1:]
    path.parent.mkdir(parents=True, exist_ok=True)
    s3.download_file(bucket, key, str(path), Config=config)
with ThreadPoolExecutor(10) as pool:
    list(pool.map(one, keys))
"""


def _generate(server: S3Server, work: Path, size: int, objects: int) -> int:
    client = server.client()
    client.create_bucket(Bucket=BUCKET)
    shard = max(MiB, size // objects)
    block = os.urandom(MiB)
    total = 0
    for n in range(objects):
        path = work / "shard.bin"
        with open(path, "wb") as out:
            for i in range(shard // MiB):
                out.write(block[i % 7 :] + block[: i % 7] if n == 0 else bytes([n]) + block[1:])
        client.upload_file(str(path), BUCKET, f"{PREFIX}/model-{n:05d}-of-{objects:05d}.safetensors")
        total += path.stat().st_size
        path.unlink()
    for name, data in {
        "config.json": b'{"model_type": "llama"}',
        "tokenizer.json": os.urandom(2 * MiB),
    }.items():
        client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{name}", Body=data)
        total += len(data)
    return total


def _timed(cmd: list[str], env: dict[str, str], dest: Path) -> tuple[float, float]:
    """(seconds including sync, peak RSS MiB of the child)."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    subprocess.run(["sync"], check=True)
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    subprocess.run(["sync"], check=True)
    seconds = time.monotonic() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{cmd[:4]} failed: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
    return seconds, usage.ru_maxrss / 1024


def _bytes_in(dest: Path) -> int:
    return sum(p.stat().st_size for p in dest.rglob("*") if p.is_file() and not p.name.startswith(".praesto"))


def _moto_rss(server: S3Server) -> float:
    assert server.process is not None
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-gib", type=float, default=2.0)
    parser.add_argument("--objects", type=int, default=32)
    parser.add_argument("--workdir", default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"interleaved rounds (>= {ROUNDS})")
    args = parser.parse_args()
    args.rounds = max(ROUNDS, args.rounds)
    work = Path(tempfile.mkdtemp(prefix="praesto-objbench-", dir=args.workdir))
    try:
        with S3Server(work / "moto") as server:
            t0 = time.monotonic()
            total = _generate(server, work, int(args.size_gib * (1 << 30)), args.objects)
            print(f"set: {total / (1 << 30):.2f} GiB in {args.objects} objects + 2 small files "
                  f"(uploaded in {time.monotonic() - t0:.0f}s)")  # fmt: skip
            env = {**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")}, **server.env()}
            uri, dest = f"s3://{BUCKET}/{PREFIX}", work / "dest"
            part_mib = str(max(1, total // args.objects // MiB + 1))
            praesto = [sys.executable, "-m", "praesto.agent.cli", "download", uri, "--dest", str(dest / "m"),
                       "--quiet", "--part-size", part_mib, "--concurrency", "16"]  # fmt: skip
            aws = shutil.which("aws")
            sync_style = (
                [
                    "aws",
                    "s3",
                    "sync",
                    "--only-show-errors",
                    "--endpoint-url",
                    server.endpoint,
                    f"{uri}/",
                    str(dest),
                ]
                if aws
                else [sys.executable, "-c", BOTO3_SYNC_STYLE, BUCKET, PREFIX, str(dest)]
            )
            clients = [
                ("praesto-agent download", praesto, dest / "m"),
                ("boto3 download_file (default TransferConfig)",
                 [sys.executable, "-c", BOTO3_PER_OBJECT, BUCKET, PREFIX, str(dest)], dest),
                ("aws s3 sync" if aws else "boto3, aws-s3-sync-style threads", sync_style, dest),
            ]  # fmt: skip
            peaks: dict[str, list[float]] = {name: [] for name, _, _ in clients}

            def run(name: str, cmd: list[str], where: Path) -> Callable[[], float]:
                def once() -> float:
                    seconds, rss = _timed(cmd, env, dest)
                    got = _bytes_in(where)
                    assert got == total, f"{name}: {got} of {total} bytes"
                    peaks[name].append(rss)
                    return seconds

                return once

            samples = interleaved({name: run(name, cmd, where) for name, cmd, where in clients}, args.rounds)
            print_table(
                f"download of {total / 2**30:.1f} GiB in {args.objects} objects from a local S3 server: "
                f"seconds incl. sync, {args.rounds} interleaved rounds",
                samples,
            )
            for name, values in samples.items():
                print(
                    f"  {name:48s} median {total / median(values) / MiB:6.0f} MiB/s, peak RSS {max(peaks[name]):5.0f} MiB"
                )
            ours = clients[0][0]
            for name, _, _ in clients[1:]:
                print(f"ratio of medians {name} / praesto: {ratio(samples[name], samples[ours]):.2f}x")
            print(f"moto server peak RSS: {_moto_rss(server):.0f} MiB")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
