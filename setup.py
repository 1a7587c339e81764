"""Packages discovered, not listed: each top-level folder installs under the one `praesto` package.

pyproject.toml holds the metadata. The package list is computed here because
setuptools' own discovery (`[tool.setuptools.packages.find]`) cannot put a prefix
on what it finds under a folder: `hooks/admission` must install as
`praesto.hooks.admission`, not `admission`. A hand-kept list once shipped a wheel
without `praesto.agent.budget` (issue 20); tests/test_wheel.py checks the wheel.
"""

from __future__ import annotations

from setuptools import find_packages, setup

# Installed package -> the folder that holds it (the layout docs/design fixes; no generic
# top-level names such as `hooks` or `agent` land in site-packages).
FOLDERS = {"praesto": "praesto", "praesto.hooks": "hooks", "praesto.agent": "agent", "praesto.csi": "csi"}
PACKAGE_DATA = {"praesto": ["py.typed"], "praesto.csi.proto": ["*.proto", "*.pyi"]}


def discovered() -> list[str]:
    """Each mapped package and every package below its folder, under the mapped name."""
    return [
        name
        for package, folder in FOLDERS.items()
        for name in [package, *(f"{package}.{sub}" for sub in find_packages(where=folder))]
    ]


if __name__ == "__main__":
    setup(packages=discovered(), package_dir=FOLDERS, package_data=PACKAGE_DATA)
