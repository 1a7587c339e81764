"""The image recipe: no Docker here, so the Dockerfile's invariants are checked by parsing it.
The wheel its builder stage makes is built for real, from `git archive HEAD`, in tests/test_wheel.py."""

from __future__ import annotations

import fnmatch
import re
import shlex

from testkit.dockerfile import build_args, stages
from testkit.helm_chart import ROOT
from testkit.installed_wheel import pyproject

COMPILERS = re.compile(r"\b(gcc|g\+\+|clang|build-essential|make|python3-dev|libc6-dev|cargo|rustc)\b")
# Modules a console script loads only for one subcommand or at serve time; the smoke step imports them too.
RUNTIME_MODULES = {"praesto.hooks.serving.server", "praesto.agent.daemon", "praesto.csi.server"}


def test_multi_stage_with_a_digest_pinned_base() -> None:
    all_stages = stages()
    assert len(all_stages) >= 2
    args = build_args()
    for stage in all_stages:
        image = stage[0][1].split()[0]
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
        assert re.fullmatch(r"[\w./-]+:[\w.-]+@sha256:[0-9a-f]{64}", image), f"unpinned base {image}"


def test_runtime_stage_is_non_root_and_has_no_build_tools() -> None:
    final = stages()[-1]
    users = [rest for keyword, rest in final if keyword == "USER"]
    assert users, "the runtime stage must set USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0
    runs = " ".join(rest for keyword, rest in final if keyword == "RUN")
    assert not COMPILERS.search(runs), runs
    assert "pip install" not in runs
    assert "util-linux" in runs and " mount" in runs  # the CSI plugin's mount(8)
    copies = [rest for keyword, rest in final if keyword == "COPY"]
    assert copies and all(c.startswith("--from=") for c in copies), "runtime copies only the built venv"


def test_builder_copies_the_packages_including_the_csi_stubs() -> None:
    builder = stages()[0]
    copied = " ".join(rest for keyword, rest in builder if keyword == "COPY")
    for source in ("pyproject.toml", "setup.py", "README.md", "praesto", "hooks", "agent", "csi"):
        assert re.search(rf"\b{re.escape(source)} ", copied), source
    assert (ROOT / "csi" / "proto" / "csi_pb2.py").is_file()
    assert (ROOT / "csi" / "proto" / "csi_pb2_grpc.py").is_file()


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; a pattern also matches a path's parents."""
    verdict = False
    parts = path.split("/")
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern.lstrip("!").rstrip("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if pat == "**" or any(
            fnmatch.fnmatch(p, pat) or fnmatch.fnmatch(p, pat.replace("**/", "*/")) for p in prefixes
        ):
            verdict = not negate
    return verdict


def test_dockerignore_keeps_the_context_small_but_complete() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for needed in (
        "pyproject.toml",
        "setup.py",
        "README.md",
        "praesto/names.py",
        "hooks/serving/server.py",
        "csi/proto/csi_pb2.py",
    ):
        assert not _ignored(needed, patterns), needed
    for unwanted in (
        ".venv/bin/python",
        ".git/HEAD",
        "tests/chart/test_dockerfile.py",
        "e2e/run.sh",
        "bench/x.py",
    ):
        assert _ignored(unwanted, patterns), unwanted


def builder_run() -> str:
    return " ".join(rest for keyword, rest in stages()[0] if keyword == "RUN")


def test_the_builder_builds_with_exactly_the_declared_backend() -> None:
    """The image installs pyproject's [build-system].requires, read from the file, and builds as the tests do."""
    run = builder_run()
    assert "tomllib.load(open('pyproject.toml', 'rb'))['build-system']['requires']" in run, run
    assert "pip wheel --no-deps --no-build-isolation" in run, run
    requires = pyproject()["build-system"]["requires"]
    pins = [r.removeprefix("setuptools==") for r in requires if r.startswith("setuptools==")]
    assert pins, f"pin the build backend: {requires}"
    # 77 is the first setuptools that understands `license = "Apache-2.0"` (PEP 639).
    assert pyproject()["project"]["license"] == "Apache-2.0"
    assert tuple(int(part) for part in pins[0].split(".")[:2]) >= (77, 0), pins


def test_the_smoke_step_imports_every_entry_point_module() -> None:
    """A module the wheel lacks fails the image build, whichever process would have needed it."""
    imported: set[str] = set()
    for command in builder_run().split("&&"):
        words = shlex.split(command)
        if words[-2:-1] == ["-c"] and words[-1].startswith("import "):
            imported |= {name.strip() for name in words[-1].removeprefix("import ").split(",")}
    entry_modules = {target.split(":")[0] for target in pyproject()["project"]["scripts"].values()}
    assert entry_modules | RUNTIME_MODULES <= imported, sorted(entry_modules | RUNTIME_MODULES - imported)
    assert "cd / " in builder_run(), "import from the install, not from the copied sources in the WORKDIR"
