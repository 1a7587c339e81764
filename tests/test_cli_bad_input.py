"""The four command lines with bad input, run as users run them: the venv's console scripts.

Issue #36 item 6, row by row: each bad input gets one line on stderr naming the cause and the
fix, exit 2, before any byte moves (the local hub saw no request), nothing written and no
staging left; `--version` and `--help` say what users need. praesto-hooks' rows are in
test_cli_hooks_bad_input.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest
from praesto.agent.download.destination import PRAESTO_PREFIX
from praesto.agent.download.publish import STAGING_IN_DEST

from praesto import names
from praesto.spec import URI_EXAMPLES
from testkit.egress import LOOPBACK_FLAG
from testkit.hub import LocalHub

BIN = Path(sys.executable).parent  # the venv's console scripts, as installed by pyproject.toml
PROGRAMS = ("praesto", "praesto-hooks", "praesto-agent", "praesto-csi")
FILES = {"config.json": b'{"model_type": "test"}', "weights.bin": os.urandom(300_000)}


def run(program: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / program), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def refused(done: subprocess.CompletedProcess[str], *words: str) -> str:
    """Exit 2 with one line on stderr that holds `words`; the line."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[LocalHub]:
    with LocalHub(tmp_path / "hub") as server:
        server.add_repo("org/model", FILES)
        yield server


def download(hub: LocalHub, dest: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return run("praesto-agent", "download", "hf://org/model", "--dest", str(dest), "--endpoint", hub.endpoint,
               LOOPBACK_FLAG, *extra)  # fmt: skip


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_dest_that_is_a_file_is_refused_before_fetching(hub: LocalHub, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "model").write_text("a file")
    for dest in (work / "model", work / "model" / "below"):
        refused(download(hub, dest), f"--dest {dest}", "not a directory", "give a directory")
    assert hub.requests == []  # not even planned
    assert sorted(os.listdir(work)) == ["model"]  # no staging beside it


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A folder this user cannot write: a read-only tmpfs for root (root ignores modes), 0555 otherwise."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_an_unwritable_dest_or_staging_dir_is_refused_before_fetching(
    hub: LocalHub, tmp_path: Path, read_only_dir: Path
) -> None:
    cause = "is on a read-only filesystem" if os.geteuid() == 0 else "is not writable by this user"
    fix = "give a directory this user may write"
    refused(
        download(hub, read_only_dir / "model"), f"--dest {read_only_dir}/model: {read_only_dir} {cause}", fix
    )
    refused(download(hub, read_only_dir), f"--dest {read_only_dir}: {read_only_dir} {cause}", fix)
    staged = download(hub, tmp_path / "ok", "--staging-dir", str(read_only_dir / "stage"))
    refused(staged, "--staging-dir", cause, fix)
    assert hub.requests == [] and not (tmp_path / "ok").exists()
    assert os.listdir(read_only_dir) == []


def test_a_dest_holding_the_users_files_is_refused_unless_allowed(hub: LocalHub, tmp_path: Path) -> None:
    dest = tmp_path / "project"
    dest.mkdir()
    mine = {"config.json": b"my own config", "notes.txt": b"keep me"}
    for name, data in mine.items():
        (dest / name).write_bytes(data)
    refused(download(hub, dest), "holds files Praesto did not write (config.json, notes.txt)",
            "--allow-existing-files")  # fmt: skip
    assert tree(dest) == mine and hub.requests == []
    allowed = download(hub, dest, "--allow-existing-files")
    assert allowed.returncode == 0, allowed.stderr
    got = tree(dest)
    assert got["notes.txt"] == b"keep me" and got["config.json"] == FILES["config.json"]
    assert names.COMPLETE_FILE in got
    again = download(hub, dest)  # now a Praesto download: the flag is not needed to run it again
    assert again.returncode == 0 and "0 B fetched" in again.stdout, again.stderr


def test_an_empty_dest_or_a_fresh_volume_is_filled(hub: LocalHub, tmp_path: Path) -> None:
    for dest in (tmp_path / "empty", tmp_path / "volume"):
        dest.mkdir()
    (tmp_path / "volume" / "lost+found").mkdir()
    for dest in (tmp_path / "empty", tmp_path / "volume"):
        done = download(hub, dest, "--quiet")
        assert done.returncode == 0, done.stderr
        assert {k: v for k, v in tree(dest).items() if not k.startswith(".praesto")} == FILES


def test_every_marker_and_staging_name_marks_a_praesto_folder() -> None:
    for name in (*names.MARKER_FILES, STAGING_IN_DEST):
        assert name.startswith(PRAESTO_PREFIX), name


def test_the_download_says_planned_and_complete_once(hub: LocalHub, tmp_path: Path) -> None:
    for quiet in ((), ("--quiet",)):
        dest = tmp_path / f"out{len(quiet)}"
        done = download(hub, dest, *quiet)
        assert done.returncode == 0, done.stderr
        lines = (done.stdout + done.stderr).splitlines()
        planned = [line for line in lines if line.startswith("planned:") or " planned source=" in line]
        published = [line for line in lines if line.startswith("complete:") or " published dest=" in line]
        assert len(planned) == 1 and len(published) == 1, lines  # the command's own words, once
        assert any(line.startswith("progress:") for line in lines) is not bool(quiet)


def test_a_missing_credentials_dir_is_refused_naming_it(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    line = refused(run("praesto-agent", "download", "s3://models/llama", "--dest", str(dest),
                       "--credentials-dir", "/missing"), "--credentials-dir /missing does not exist")  # fmt: skip
    assert "Secret" in line
    a_file = tmp_path / "creds"
    a_file.write_text("x")
    from_env = run("praesto-agent", "download", "s3://models/llama", "--dest", str(dest),
                   env={names.ENV_CREDENTIALS_DIR: str(a_file)})  # fmt: skip
    refused(from_env, f"--credentials-dir {a_file} is not a directory", names.ENV_CREDENTIALS_DIR)
    assert sorted(os.listdir(tmp_path)) == ["creds"]


def test_a_malformed_egress_allow_list_is_refused_before_any_work(tmp_path: Path) -> None:
    """`--egress-allowed-cidrs` and its variable, for `download` and `run` alike: one line, exit 2."""
    dest = tmp_path / "out"
    flag = run(
        "praesto-agent",
        "download",
        "hf://org/model",
        "--dest",
        str(dest),
        "--egress-allowed-cidrs",
        "10.0.0.0/33",
    )
    refused(flag, "--egress-allowed-cidrs", names.ENV_EGRESS_ALLOWED_CIDRS, "'10.0.0.0/33' is not a CIDR")
    from_env = run("praesto-agent", "run", "--node-name", "n", "--base-path", str(tmp_path),
                   env={names.ENV_EGRESS_ALLOWED_CIDRS: "in-cluster"})  # fmt: skip
    refused(from_env, "--egress-allowed-cidrs", "'in-cluster' is not a CIDR", "10.0.0.0/8")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("program", "args"),
    [
        ("praesto-agent", ["--log-level", "LOUD", "wait", "--path", "."]),
        ("praesto-agent", ["wait", "--path", ".", "--log-level", "LOUD"]),
        ("praesto-agent", ["download", "hf://org/model", "--dest", "x", "--log-level=LOUD"]),
        ("praesto-hooks", ["--log-level", "LOUD"]),
        ("praesto-csi", ["--log-level", "LOUD", "--node-name", "n"]),
    ],
)
def test_an_unknown_log_level_is_refused(program: str, args: list[str]) -> None:
    line = refused(run(program, *args), "--log-level", "'LOUD'")
    assert "INFO" in line.upper()  # the fix: the levels there are


def test_a_log_level_from_the_environment_is_checked_too() -> None:
    refused(
        run("praesto-agent", "wait", "--path", ".", env={names.ENV_LOG_LEVEL: "loud"}),
        "--log-level",
        "'loud'",
    )
    ok = run(
        "praesto-agent", "wait", "--path", ".", "--timeout", "0.01", env={names.ENV_LOG_LEVEL: "warning"}
    )
    assert ok.returncode == 1 and "after 0.01s" in ok.stderr  # lower case is fine (the chart's values)


@pytest.mark.parametrize(
    ("program", "args", "flag", "wanted"),
    [
        ("praesto-agent", ["download", "hf://a/b", "--dest", "x", "--concurrency", "abc"], "--concurrency", "a positive integer"),
        ("praesto-agent", ["download", "hf://a/b", "--dest", "x", "--concurrency", "0"], "--concurrency", "a positive integer"),
        ("praesto-agent", ["download", "hf://a/b", "--dest", "x", "--part-size", "1.5"], "--part-size", "a positive integer"),
        ("praesto-agent", ["wait", "--path", ".", "--timeout", "soon"], "--timeout", "a number of seconds"),
        ("praesto-hooks", ["--workers", "abc"], "--workers", "a positive integer"),
        ("praesto-hooks", ["--threads", "0"], "--threads", "a positive integer"),
        ("praesto-hooks", ["--timeout", "-1"], "--timeout", "a positive integer"),
        ("praesto-hooks", ["--max-request-bytes", "1M"], "--max-request-bytes", "a positive integer"),
        ("praesto-hooks", ["--request-timeout", "nan"], "--request-timeout", "a number of seconds"),
        ("praesto-csi", ["--unassigned-after", "abc"], "--unassigned-after", "a number of seconds"),
        ("praesto-csi", ["--registration-check-seconds", "-2"], "--registration-check-seconds", "a number of seconds"),
    ],
)  # fmt: skip
def test_a_malformed_number_names_the_flag_and_what_it_expects(
    program: str, args: list[str], flag: str, wanted: str
) -> None:
    given = args[-1]
    line = refused(run(program, *args), f"{flag}: expected {wanted}", f"got {given!r}", "--help")
    assert "invalid" not in line  # not argparse's `invalid _positive value`


@pytest.mark.parametrize("scheme", ["s3", "gs", "az"])
def test_a_malformed_object_store_uri_shows_that_schemes_own_example(scheme: str, tmp_path: Path) -> None:
    uri = f"{scheme}://Not_A_Bucket/prefix"
    line = refused(run("praesto-agent", "download", uri, "--dest", str(tmp_path / "x")), uri)
    assert line.endswith(f"e.g. {URI_EXAMPLES[scheme]}")
    assert all(URI_EXAMPLES[other] not in line for other in URI_EXAMPLES if other != scheme)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("program", PROGRAMS)
def test_version_prints_the_distributions_version(program: str) -> None:
    done = run(program, "--version")
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{program} {version('praesto')}\n", "")


@pytest.mark.parametrize(("program", "commands"), [("praesto", ("render", "plan")),
                                                   ("praesto-agent", ("download", "wait", "run"))])  # fmt: skip
def test_help_lists_the_commands_and_every_source_form(program: str, commands: tuple[str, ...]) -> None:
    done = run(program, "--help")
    assert done.returncode == 0 and done.stderr == ""
    lines = done.stdout.splitlines()
    for command in commands:  # each with a one-line description
        assert any(line.split()[:1] == [command] and len(line.split()) > 2 for line in lines), command
    for example in URI_EXAMPLES.values():
        assert example in done.stdout, example
    for internal in ("process edge", "nothing below reads", "tests only"):
        assert internal not in done.stdout


def test_praesto_without_a_command_or_with_an_unknown_one_is_refused() -> None:
    assert run("praesto").returncode == 2
    refused(run("praesto", "deploy"), "unknown command 'deploy'", "render, plan")
    refused(run("praesto", "render", "--nodes"), "praesto render", "--help")
