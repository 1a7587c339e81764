"""Download benchmark: praesto-agent vs `hf download` vs `aria2c`, same origin, same disk.

    python -m bench.download_bench [--size-gib 2] [--cap-mbps 10] [--workdir /var/tmp]

Sets up the local hub API (tests/support/hub.py) on loopback with LFS bytes redirected
to nginx (sendfile, Range), generates a repo of a few large shards plus small files on
the destination's disk, and times each tool into a fresh directory on that disk with
`sync` included. Two scenarios: uncapped, and nginx `limit_rate` per connection (a CDN's
per-connection cap; design.md "Benchmark conditions"). Ours verifies every byte; the
others do not. Prints seconds, MB/s, speed ratio vs the best baseline (>1 = faster)
and our peak RSS (rusage of the child process).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support.hub import LocalHub

REPO = "bench/model"
SHARDS = 4
SMALL_FILES = 40


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _generate(hub: LocalHub, work: Path, size: int) -> None:
    small = {f"config/part{i // 10}/file{i}.json": os.urandom(200 + i) for i in range(SMALL_FILES)}
    small["config.json"] = b'{"architectures": ["Bench"]}'
    small["tokenizer.json"] = os.urandom(3 << 20)
    hub.add_repo(REPO, small)
    shard_size = (size - (3 << 20)) // SHARDS
    for n in range(SHARDS):
        path = work / f"shard{n}"
        with path.open("wb") as handle:
            left = shard_size + n * 4099  # unequal sizes: no two shards alike
            while left:
                block = os.urandom(min(left, 8 << 20))
                handle.write(block)
                left -= len(block)
        hub.add_large_file(REPO, f"model-{n + 1:05d}-of-{SHARDS:05d}.safetensors", path)


class Nginx:
    def __init__(self, work: Path, root: Path) -> None:
        self.work = work
        self.root = root
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, rate: str, access_log: Path | None = None) -> None:
        """(Re)start with a per-connection `rate`; `access_log` records bytes sent per request."""
        self.stop()
        log = (
            f"log_format sent '$bytes_sent'; access_log {access_log} sent" if access_log else "access_log off"
        )
        conf = self.work / "nginx.conf"
        user = "user root;" if os.geteuid() == 0 else ""
        conf.write_text(f"""{user}
worker_processes 2;
daemon off;
pid {self.work}/nginx.pid;
error_log {self.work}/nginx-error.log warn;
events {{ worker_connections 1024; }}
http {{
  {log};
  sendfile on; tcp_nopush on;
  client_body_temp_path {self.work}/nginx-tmp; proxy_temp_path {self.work}/nginx-tmp;
  fastcgi_temp_path {self.work}/nginx-tmp; uwsgi_temp_path {self.work}/nginx-tmp; scgi_temp_path {self.work}/nginx-tmp;
  default_type application/octet-stream;
  server {{
    listen 127.0.0.1:{self.port};
    location / {{ root {self.root}; limit_rate {rate}; }}
  }}
}}
""")
        self.proc = subprocess.Popen(["nginx", "-c", str(conf), "-e", str(self.work / "nginx-error.log")])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("nginx did not start; see " + str(self.work / "nginx-error.log"))

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


def _timed(cmd: list[str], env: dict[str, str], dest: Path) -> tuple[float, float]:
    """(seconds including sync, peak RSS MiB of the child)."""
    shutil.rmtree(dest, ignore_errors=True)
    subprocess.run(["sync"], check=True)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    subprocess.run(["sync"], check=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        raise RuntimeError(f"{cmd[0]} failed ({proc.returncode}): {err[-2000:]}")
    return seconds, usage.ru_maxrss / 1024


def _bytes_in(dest: Path) -> int:
    return sum(
        p.stat().st_size
        for p in dest.rglob("*")
        if p.is_file() and ".cache" not in p.parts and not p.name.startswith(".praesto")
    )


def _scenario(name: str, hub: LocalHub, work: Path, total: int, env: dict[str, str]) -> list[str]:
    dest = work / "dest"
    urls = work / "aria2.txt"
    commit = hub.repos[REPO].refs["main"]
    with urls.open("w") as handle:
        for path in hub.repos[REPO].commits[commit]:
            handle.write(f"{hub.endpoint}/{REPO}/resolve/{commit}/{path}\n  out={path}\n")
    tools = {
        "praesto-agent": [sys.executable, "-m", "praesto.agent.cli", "download", f"hf://{REPO}",
                          "--dest", str(dest), "--endpoint", hub.endpoint, "--quiet"],
        "hf download": [str(Path(sys.executable).parent / "hf"), "download", REPO, "--local-dir", str(dest),
                        "--format", "quiet"],
        "aria2c -x8 -s8 -j8": ["aria2c", "-x8", "-s8", "-j8", "-i", str(urls), "-d", str(dest), "-q",
                               "--allow-overwrite=true", "--auto-file-renaming=false"],
    }  # fmt: skip
    times: dict[str, float] = {}
    rss = 0.0
    for tool, cmd in tools.items():
        seconds, peak = _timed(cmd, {**env, "HF_HOME": str(work / "hf-home")}, dest)
        got = _bytes_in(dest)
        if got != total:
            raise RuntimeError(f"{tool} wrote {got} bytes, expected {total}")
        times[tool] = seconds
        if tool == "praesto-agent":
            rss = peak
    best_name = min((t for t in times if t != "praesto-agent"), key=times.__getitem__)
    lines = [f"{name}:"]
    for tool, seconds in times.items():
        lines.append(f"  {tool:20s} {seconds:7.2f} s  {total / seconds / 1e6:8.1f} MB/s")
    ratio = times[best_name] / times["praesto-agent"]
    lines.append(f"  ratio vs best baseline ({best_name}): {ratio:.2f}x  (>= 1.00 is parity or better)")
    lines.append(f"  praesto-agent peak RSS: {rss:.0f} MiB")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-gib", type=float, default=2.0)
    parser.add_argument(
        "--cap-mbps", type=float, default=10.0, help="per-connection cap, MB/s (capped scenario)"
    )
    parser.add_argument("--workdir", default="/var/tmp", help="on the disk to measure (not a tmpfs)")
    args = parser.parse_args()
    for tool in ("nginx", "aria2c"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            print(f"{tool} is missing: run scripts/install.sh", file=sys.stderr)
            return 2
    os.environ["PATH"] = os.environ.get("PATH", "") + ":/usr/sbin"
    work = Path(tempfile.mkdtemp(prefix="praesto-bench-", dir=args.workdir))
    nginx = Nginx(work, work / "hub" / "blobs")
    try:
        size = int(args.size_gib * (1 << 30))
        with LocalHub(work / "hub", cdn_base=nginx.url) as hub:
            t0 = time.perf_counter()
            _generate(hub, work, size)
            total = sum(f.size for f in hub.repos[REPO].commits[hub.repos[REPO].refs["main"]].values())
            print(f"repo: {total / 2**30:.2f} GiB, {SHARDS} shards + {SMALL_FILES + 2} small files "
                  f"(generated in {time.perf_counter() - t0:.1f}s) under {work}; load {os.getloadavg()[0]:.2f}")  # fmt: skip
            env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HUB_DISABLE_XET": "1",
                   "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "HF_TOKEN": ""}  # fmt: skip
            env.pop("HF_TOKEN")
            out: list[str] = []
            nginx.start("0")
            out += _scenario("uncapped", hub, work, total, env)
            nginx.start(f"{int(args.cap_mbps * 1e6)}")
            out += _scenario(f"capped at {args.cap_mbps:g} MB/s per connection", hub, work, total, env)
            print("\n".join(out))
            print(f"load average after: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    finally:
        nginx.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
