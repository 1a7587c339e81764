"""A real S3 server on loopback for tests and benches: `moto` in server mode, own process.

A separate process (not `ThreadedMotoServer` in the test process) so that IAM
authentication can be switched on through moto's environment without touching the
test process's settings, and so a bench measures the client, not moto sharing its GIL.
With `auth=True` moto checks signatures: the first few actions (bucket and user set-up
through `admin()`) run unauthenticated, every later request needs the access key that
`create_key()` returned.

    with S3Server(tmp_path) as s3:
        s3.client().create_bucket(Bucket="models")
        env = s3.env()  # AWS_ENDPOINT_URL, keys, region for a subprocess
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3

from testkit.ports import free_port

STARTUP_DEADLINE = 30.0
REGION = "us-east-1"
ADMIN_KEY = ("testing", "testing")


class S3Server:
    def __init__(self, workdir: Path, *, auth_actions: int | None = None) -> None:
        """`auth_actions`: how many unauthenticated set-up calls moto allows before it checks keys."""
        self.workdir = workdir
        self.auth_actions = auth_actions
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "moto.log"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> S3Server:
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        if self.auth_actions is not None:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(self.auth_actions)
        deadline = time.monotonic() + STARTUP_DEADLINE
        while True:  # a port taken between free_port() and the bind: try another
            self.port = free_port()
            with open(self.log_path, "wb") as log:
                self.process = subprocess.Popen(
                    [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            if self._wait_ready(deadline):
                return self
            self.process.kill()
            self.process.wait()
            if time.monotonic() > deadline:
                raise RuntimeError(f"moto server did not start: {self.log_path.read_text()[-2000:]}")

    def _wait_ready(self, deadline: float) -> bool:
        assert self.process is not None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.endpoint}/moto-api/data.json", timeout=2):
                    return True
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.05)
        return False

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def client(self, key: tuple[str, str] = ADMIN_KEY) -> Any:
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=key[0],
            aws_secret_access_key=key[1],
            region_name=REGION,
        )

    def create_key(self) -> tuple[str, str]:
        """An IAM user with full access and its access key (counts as set-up actions)."""
        iam = boto3.client(
            "iam",
            endpoint_url=self.endpoint,
            aws_access_key_id=ADMIN_KEY[0],
            aws_secret_access_key=ADMIN_KEY[1],
            region_name=REGION,
        )
        iam.create_user(UserName="praesto")
        policy = (
            '{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}'
        )
        iam.put_user_policy(UserName="praesto", PolicyName="all", PolicyDocument=policy)
        key = iam.create_access_key(UserName="praesto")["AccessKey"]
        return key["AccessKeyId"], key["SecretAccessKey"]

    def env(self, key: tuple[str, str] = ADMIN_KEY) -> dict[str, str]:
        """Environment for a `praesto-agent download s3://…` subprocess."""
        return {
            "AWS_ACCESS_KEY_ID": key[0],
            "AWS_SECRET_ACCESS_KEY": key[1],
            "AWS_REGION": REGION,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
        }


class _PrivateBucket(BaseHTTPRequestHandler):
    """What S3 answers an unsigned request for a private bucket (moto 5.2.5 answers 500 there)."""

    def do_GET(self) -> None:
        body = (
            b"<?xml version='1.0'?><Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
        )
        self.send_response(403)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def private_bucket_endpoint() -> Iterator[str]:
    """An S3 endpoint that refuses anonymous requests with 403 AccessDenied, as S3 does."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _PrivateBucket)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
