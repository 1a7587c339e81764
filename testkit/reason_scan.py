"""Every reason our code can write, found by reading the code (Python's own `ast`), not by a list.

The reasons live where they are used (constants in `praesto/names.py`, `agent/status.py`, literals
in the hooks), so a list kept beside the docs would drift. A *reason* is a one-word CamelCase
string literal (the Kubernetes convention for condition and Event reasons) that reaches a place
named like a reason:

* a name, attribute or tuple element named `*reason*`, bound anywhere (`REASON_CACHED = ...`,
  `reason = "A" if x else "B"`, `phase, reason = ..., "VolumeLost"`, `REASONS = (...)`);
* a `reason=` keyword, a `"reason":` dict key, or the positional argument at a parameter named
  `*reason*` of a function or class defined in the scanned code (`condition(before, READY, False,
  "X", ...)`, `Decision(True, "X")`), matched by name;
* the tuple element a function returns where a caller unpacks it into a reason
  (`phase, reason, message = _job_state(job)` makes `_job_state`'s `return (p, "Creating", m)` count),
  and a local name that carries one (`problem = ("WaitingForServiceAccount", ...)`,
  `phase, (reason, message) = ..., problem`).

The scan follows those bindings to a fixed point. It over-reports rather than misses: anything it
finds must be in the docs' table, and the test also checks it still finds known reasons of every
kind, so the scan itself cannot silently go blind.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

REASON_WORD = re.compile(r"^[A-Z][A-Za-z0-9]+$")
REASON_NAME = re.compile(r"reason", re.I)


def _literals(node: ast.AST) -> Iterator[str]:
    """CamelCase string constants anywhere inside an expression (branches, `or` defaults, `str()`)."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and REASON_WORD.match(sub.value):
            yield sub.value


def _name_of(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _branches(node: ast.AST) -> Iterator[ast.AST]:
    """The values an expression can take: both sides of `a if c else b`, each operand of `a or b`."""
    if isinstance(node, ast.IfExp):
        yield from _branches(node.body)
        yield from _branches(node.orelse)
    elif isinstance(node, ast.BoolOp):
        for value in node.values:
            yield from _branches(value)
    else:
        yield node


@dataclass
class _Scope:
    """One function (or a module's top level): its bindings and its returns."""

    name: str
    assigns: list[tuple[ast.AST, ast.AST]] = field(default_factory=list)  # (target, value)
    returns: list[ast.AST] = field(default_factory=list)
    calls: list[ast.Call] = field(default_factory=list)
    dict_reasons: list[ast.AST] = field(default_factory=list)
    reason_params: list[int] = field(default_factory=list)


def _scopes(tree: ast.Module) -> Iterator[_Scope]:
    def collect(scope: _Scope, body: Iterable[ast.AST]) -> Iterator[_Scope]:
        for stmt in body:
            for node in _own_nodes(stmt):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    inner = _Scope(node.name, reason_params=_reason_positions(_parameters(node)))
                    yield from collect(inner, node.body)
                elif isinstance(node, ast.ClassDef):  # `Decision(True, "X")`: its constructor's parameters
                    yield _Scope(node.name, reason_params=_reason_positions(_constructor(node)))
                elif isinstance(node, ast.Assign):
                    scope.assigns.extend((t, node.value) for t in node.targets)
                elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
                    scope.assigns.append((node.target, node.value))
                elif isinstance(node, ast.Return) and node.value is not None:
                    scope.returns.append(node.value)
                elif isinstance(node, ast.Call):
                    scope.calls.append(node)
                elif isinstance(node, ast.Dict):
                    scope.dict_reasons.extend(
                        v
                        for k, v in zip(node.keys, node.values, strict=True)
                        if isinstance(k, ast.Constant)
                        and isinstance(k.value, str)
                        and REASON_NAME.search(k.value)
                    )
        yield scope

    yield from collect(_Scope("<module>"), tree.body)


def _own_nodes(stmt: ast.AST) -> Iterator[ast.AST]:
    """Nodes of a statement, stopping at (but yielding) nested functions, which are scopes of their
    own; a lambda's body belongs to the function it is written in."""
    todo = [stmt]
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            todo.extend(ast.iter_child_nodes(node))


def _parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """Positional parameters as a caller counts them (a method's self or cls left out)."""
    params = [a.arg for a in (*function.args.posonlyargs, *function.args.args)]
    return params[1:] if params[:1] in (["self"], ["cls"]) else params


def _constructor(cls: ast.ClassDef) -> list[str]:
    """`__init__`'s parameters, else the annotated fields in order (a dataclass or NamedTuple)."""
    for stmt in cls.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == "__init__":
            return _parameters(stmt)
    return [s.target.id for s in cls.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]


def _reason_positions(params: list[str]) -> list[int]:
    return [i for i, name in enumerate(params) if REASON_NAME.search(name)]


@dataclass
class _Found:
    reasons: dict[str, set[str]] = field(default_factory=dict)  # reason -> "file:line" where seen

    def add(self, node: ast.AST, where: str) -> bool:
        grew = False
        for value in _literals(node):
            places = self.reasons.setdefault(value, set())
            grew |= not places
            places.add(f"{where}:{getattr(node, 'lineno', 0)}")
        return grew


def scan(paths: Iterable[Path], root: Path) -> dict[str, set[str]]:
    """Every reason literal in the given Python files, with the places it was found."""
    scopes: list[tuple[str, _Scope]] = []
    for path in paths:
        tree = ast.parse(path.read_text(), str(path))
        scopes.extend((str(path.relative_to(root)), s) for s in _scopes(tree))
    params: dict[str, set[int]] = {}
    for _, scope in scopes:
        params.setdefault(scope.name, set()).update(scope.reason_params)
    # function name -> what its callers read as a reason: a tuple position, or None for the whole value
    returning: dict[str, set[int | None]] = {}
    carriers: dict[int, set[str]] = {id(s): set() for _, s in scopes}  # local names holding a reason
    carried: dict[int, dict[str, set[int]]] = {id(s): {} for _, s in scopes}  # local tuples holding one
    found = _Found()

    def reason_target(scope: _Scope, target: ast.AST, value: ast.AST, where: str) -> bool:
        """Bind `value` to `target`; True when this taught the scan something new."""
        grew = False
        if isinstance(target, (ast.Tuple, ast.List)):
            for i, element in enumerate(target.elts):
                grew |= tuple_element(scope, element, value, i, where)
            return grew
        name = _name_of(target)
        if name and (REASON_NAME.search(name) or name in carriers[id(scope)]):
            for branch in _branches(value):
                grew |= found.add(branch, where)
                grew |= follow(scope, branch, None)
        return grew

    def tuple_element(scope: _Scope, target: ast.AST, value: ast.AST, i: int, where: str) -> bool:
        grew = False
        for branch in _branches(value):
            if isinstance(branch, (ast.Tuple, ast.List)) and i < len(branch.elts):
                grew |= reason_target(scope, target, branch.elts[i], where)
            elif _holds_reason(scope, target):
                grew |= follow(scope, branch, i)
        return grew

    def _holds_reason(scope: _Scope, target: ast.AST) -> bool:
        if isinstance(target, (ast.Tuple, ast.List)):
            return any(_holds_reason(scope, e) for e in target.elts)
        name = _name_of(target)
        return bool(name and (REASON_NAME.search(name) or name in carriers[id(scope)]))

    def follow(scope: _Scope, value: ast.AST, index: int | None) -> bool:
        """A reason (element `index` of a tuple, when set) comes from `value`: a call's return or a local."""
        grew = False
        if isinstance(value, ast.Call) and (name := _name_of(value.func)):
            before = len(returning.setdefault(name, set()))
            returning[name].add(index)
            grew = len(returning[name]) > before
        elif isinstance(value, ast.Name):
            if index is None and value.id not in carriers[id(scope)]:
                carriers[id(scope)].add(value.id)
                grew = True
            elif index is not None and index not in carried[id(scope)].setdefault(value.id, set()):
                carried[id(scope)][value.id].add(index)
                grew = True
        return grew

    grew = True
    while grew:
        grew = False
        for where, scope in scopes:
            for target, value in scope.assigns:
                grew |= reason_target(scope, target, value, where)
                name = _name_of(target)
                for i in carried[id(scope)].get(name or "", ()):
                    grew |= tuple_element(scope, ast.Name(id="reason"), value, i, where)
            for value in scope.dict_reasons:
                grew |= found.add(value, where) | follow(scope, value, None)
            for call in scope.calls:
                positions = params.get(_name_of(call.func) or "", set())
                args = [a for i, a in enumerate(call.args) if i in positions]
                args += [k.value for k in call.keywords if k.arg and REASON_NAME.search(k.arg)]
                for arg in args:
                    grew |= found.add(arg, where) | follow(scope, arg, None)
            reason = ast.Name(id="reason")
            for position in returning.get(scope.name, ()):
                for value in scope.returns:
                    if position is None:
                        grew |= reason_target(scope, reason, value, where)
                    else:
                        grew |= tuple_element(scope, reason, value, position, where)
    return found.reasons
