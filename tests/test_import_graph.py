"""The import graph between packages has no cycles, and the ground package imports only itself.

Read from the source with `ast` (nothing is imported), under the names the wheel installs
(setup.py's FOLDERS: hooks/ is `praesto.hooks`, agent/ is `praesto.agent`, ...). Every import
counts: at module level, inside functions, and under `if TYPE_CHECKING:`, since a type-only
import is still a dependency a reader has to follow. A package is one folder: `praesto.agent`
is agent/*.py, and `praesto.agent.peers` is agent/peers/*.py, a package of its own.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GROUND = "praesto"  # the contract package every part imports; it imports none of them


def folders() -> dict[str, str]:
    """Installed package -> folder, as setup.py maps them (read from setup.py itself)."""
    spec = importlib.util.spec_from_file_location("praesto_setup", ROOT / "setup.py")
    assert spec is not None and spec.loader is not None
    setup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup)
    return dict(setup.FOLDERS)


def modules() -> dict[str, tuple[Path, str]]:
    """Module name -> (file, the package it belongs to), for every module the wheel installs."""
    found: dict[str, tuple[Path, str]] = {}
    for package, folder in folders().items():
        base = ROOT / folder
        for path in sorted(base.rglob("*.py")):
            relative = path.relative_to(base)
            if not all(
                (base / Path(*relative.parts[:i]) / "__init__.py").is_file()
                for i in range(len(relative.parts))
            ):
                continue  # not inside a package the wheel installs (a script folder, __pycache__)
            parts = [package, *relative.with_suffix("").parts]
            if parts[-1] == "__init__":
                name = ".".join(parts[:-1])
                found[name] = (path, name)
            else:
                name = ".".join(parts)
                found[name] = (path, ".".join(parts[:-1]))
    return found


def imported(path: Path, module: str, is_package: bool) -> Iterator[str]:
    """Every module name `path` imports (absolute, relative resolved; names as written)."""
    tree = ast.parse(path.read_text(), str(path))
    here = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here[: len(here) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def module_graph(package: str) -> dict[str, set[str]]:
    """Module -> the other modules of the same `package` it imports."""
    found = modules()
    own = {name: path for name, (path, pkg) in found.items() if pkg == package and name != package}
    return {
        name: {t for t in imported(path, name, False) if t in own and t != name} for name, path in own.items()
    }


def package_graph() -> dict[str, set[str]]:
    """Package -> the other packages its modules import."""
    found = modules()
    packages = {package for _path, package in found.values()}
    graph: dict[str, set[str]] = {package: set() for package in packages}
    for name, (path, package) in found.items():
        for target in imported(path, name, path.name == "__init__.py"):
            if target not in found:
                continue  # not ours (or `from module import a_function`: the module counted already)
            other = found[target][1]
            if other != package:
                graph[package].add(other)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one package (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def test_the_graph_covers_every_part() -> None:
    graph = package_graph()
    for package in (
        "praesto",
        "praesto.hooks",
        "praesto.hooks.admission",
        "praesto.agent",
        "praesto.agent.download",
        "praesto.agent.peers",
        "praesto.agent.budget",
        "praesto.csi",
    ):
        assert package in graph, package
    assert "praesto.agent.download" in graph["praesto.agent"]  # edges are found at all


def test_no_import_cycles_between_packages() -> None:
    found = cycles(package_graph())
    assert found == [], "packages that import each other (a cycle): " + "; ".join(
        " <-> ".join(c) for c in found
    )


def test_the_agents_collaborators_import_each_other_one_way() -> None:
    """agent/*.py: no module reaches back into one that imports it (once, pod-start accounting
    type-imported the reconciler that built it, to reach into its private store and lock)."""
    found = cycles(module_graph("praesto.agent"))
    assert found == [], "agent modules that import each other: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_ground_package_imports_no_part() -> None:
    graph = package_graph()
    assert graph[GROUND] == set(), f"{GROUND}/ imports {sorted(graph[GROUND])}; it is the ground floor"


def test_a_cycle_is_found() -> None:
    """The check itself: a two-package cycle and a three-package one are both reported."""
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    assert cycles(graph) == [["a", "b"], ["c", "d", "e"]]


# The one door to the API server per process (issue 39 item 3): only these modules import the
# `kubernetes` client. The ground's two are shared by every door: the error mapping
# (praesto/kubeerrors.py, after kopf's errors.py) and the reflector's list/watch edge, which every
# process's reflectors run on (praesto/listwatch.py; it maps its own 410 to `Expired`). The CSI
# driver calls no Kubernetes API: it has no door.
KUBERNETES_DOORS: dict[str, set[str]] = {
    GROUND: {"praesto.kubeerrors", "praesto.listwatch"},
    "praesto.agent": {"praesto.agent.kube"},
    "praesto.hooks": {"praesto.hooks.kube"},
    "praesto.csi": set(),
}


def process_of(package: str) -> str:
    """The process (a key of `KUBERNETES_DOORS`) whose part `package` is: the longest prefix."""
    return max((p for p in KUBERNETES_DOORS if package == p or package.startswith(p + ".")), key=len)


def kubernetes_importers() -> dict[str, Path]:
    """Every installed module that imports `kubernetes` (or a module below it), with its file."""
    return {
        name: path
        for name, (path, _package) in modules().items()
        if any(
            t == "kubernetes" or t.startswith("kubernetes.")
            for t in imported(path, name, path.name == "__init__.py")
        )
    }


def test_only_each_process_door_imports_kubernetes() -> None:
    """The client's exceptions are mapped once (praesto.kubeerrors) and its calls made in one door per
    process, so a client change or a new error kind is handled in one place, not in each caller."""
    found = modules()
    assert {process_of(package) for _path, package in found.values()} == set(KUBERNETES_DOORS)
    stray = sorted(
        str(path.relative_to(ROOT))
        for name, path in kubernetes_importers().items()
        if name not in KUBERNETES_DOORS[process_of(found[name][1])]
    )
    assert stray == [], (
        "these import `kubernetes` outside their process's door (agent/kube.py, hooks/kube.py; "
        "csi has none): " + ", ".join(stray) + "; call the API through the door, catch praesto.kubeerrors"
    )


def test_every_door_exists() -> None:
    """The rule names real modules (a renamed door would otherwise let every import through unseen)."""
    found = modules()
    for doors in KUBERNETES_DOORS.values():
        for door in doors:
            assert door in found, door
