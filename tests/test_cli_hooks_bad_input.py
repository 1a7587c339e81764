"""`praesto-hooks` with bad TLS files or a bad --bind, run as the image runs it (the venv's script).

Issue #36 item 6: a missing certificate or key used to end in a traceback from gunicorn's TLS
setup, and `--bind notaport` in five bind retries (gunicorn reads a bare word as a host on its
default port). Both are one line and exit 2 now, before gunicorn starts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit.server import make_tls_files
from tests.test_cli_bad_input import refused, run

GUNICORN_STARTED = ("Starting gunicorn", "Retrying", "Booting worker", "Listening at")


def hooks(*args: str) -> str:
    """praesto-hooks refused with one line (before gunicorn said anything); that line."""
    done = run("praesto-hooks", *args)
    line = refused(done)
    assert not any(word in done.stderr for word in GUNICORN_STARTED), done.stderr
    return line


def test_a_missing_certificate_or_key_is_one_line(tmp_path: Path) -> None:
    pair = make_tls_files(tmp_path / "tls")
    missing = tmp_path / "absent.pem"
    line = hooks("--certfile", str(missing), "--keyfile", str(pair.key_path))
    assert f"--certfile {missing}: No such file or directory" in line and "readable PEM" in line
    line = hooks("--certfile", str(pair.cert_path), "--keyfile", str(missing))
    assert f"--keyfile {missing}: No such file or directory" in line
    tls = ("--certfile", str(pair.cert_path), "--keyfile", str(pair.key_path))
    assert f"--client-ca-file {missing}" in hooks(*tls, "--client-ca-file", str(missing))


def test_a_certificate_and_a_key_that_are_not_a_pair_is_one_line(tmp_path: Path) -> None:
    one, other = make_tls_files(tmp_path / "one"), make_tls_files(tmp_path / "other")
    line = hooks("--certfile", str(one.cert_path), "--keyfile", str(other.key_path))
    assert f"--certfile {one.cert_path} / --keyfile {other.key_path}" in line
    assert "the private key it was issued for" in line
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("not a certificate\n")
    assert "give a PEM certificate" in hooks("--certfile", str(not_pem), "--keyfile", str(one.key_path))


def test_only_one_of_certfile_and_keyfile_is_one_line(tmp_path: Path) -> None:
    assert "--certfile and --keyfile must be given together" in hooks("--certfile", str(tmp_path / "x"))


@pytest.mark.parametrize(
    "bind", ["notaport", "127.0.0.1:http", "127.0.0.1:70000", ":8443", "fd://x", "unix:"]
)
def test_a_bind_that_is_not_an_address_is_refused_before_gunicorn(bind: str) -> None:
    line = hooks("--bind", bind)
    assert "--bind: expected host:port (e.g. 0.0.0.0:8443)" in line and f"got {bind!r}" in line


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--max-connections-per-client", "1001"), "--max-connections-per-client must be at most 1000"),
        (("--max-connections-per-client", "0"), "--max-connections-per-client: expected a positive integer"),
        (("--min-body-rate", "1000"), "--min-body-rate must be at least 65536"),
    ],
)
def test_a_flood_limit_out_of_range_is_one_line(args: tuple[str, ...], needle: str) -> None:
    assert needle in hooks(*args)
