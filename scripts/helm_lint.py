"""`make lint`'s chart check: the real `helm lint --strict` (helm v4.3.2, built by `make tools-bin`).

--strict makes warnings fatal, and Helm warns when charts/ lacks a declared dependency (v4.3.2
pkg/chart/v2/lint/rules/dependencies.go, validateDependencyInChartsDir). The dependency is
fetched from ghcr.io by `helm dependency build`, which cannot be reached here, so the lint runs
on a temporary copy of the chart whose charts/ holds the test-only stand-in of metacontroller-helm
(testkit/metacontroller_subchart.py); the working tree is never written.

Linted with the chart's defaults, then with the values of every `helm install`/`upgrade` line
the documentation prints (testkit/documented_helm.py), so a documented value the schema or a
template refuses fails here too.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testkit.documented_helm import documents, helm_lines, value_flags
from testkit.helm_chart import ROOT
from testkit.metacontroller_subchart import chart_copy_with_dependency
from testkit.tools import tool


def value_sets() -> dict[str, list[str]]:
    """label -> value flags: the defaults, then each documented install/upgrade's own."""
    sets: dict[str, list[str]] = {"defaults": []}
    for document in documents():
        for line in helm_lines(document):
            words = line.argv()
            if len(words) > 1 and words[1] in ("install", "upgrade") and value_flags(line):
                sets.setdefault(line.where, value_flags(line))
    return sets


def main() -> int:
    helm = str(tool("helm"))
    failed = 0
    sets = value_sets()
    with tempfile.TemporaryDirectory(prefix="praesto-helm-lint-") as tmp:
        chart = chart_copy_with_dependency(Path(tmp))
        for label, flags in sets.items():
            done = subprocess.run(
                [helm, "lint", "--strict", str(chart), *flags],
                cwd=ROOT,  # documented `-f path` flags are relative to the repository
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                failed += 1
                print(
                    f"helm lint --strict ({label}: {' '.join(flags) or 'chart defaults'}):", file=sys.stderr
                )
                print(done.stdout + done.stderr, file=sys.stderr)
    if failed:
        return 1
    print(f"helm lint --strict: charts/praesto clean with {len(sets)} value sets")
    return 0


if __name__ == "__main__":
    sys.exit(main())
