"""Which chart values each object of a template is made from, read from the template source.

A value that reaches a process through the Pod template (a flag, env, a volume) rolls it by itself;
one that reaches it through another object the Pod uses (a mounted ConfigMap or Secret, its
ServiceAccount) does not, so tests/chart/test_chart_rollouts.py asks of those objects which
`.Values` paths their templates read. Helm has no such query, so this reads the Go template
source: every action of the `---` document that declares the object's kind, the `if`/`with`/`range`
blocks around it, the file's preamble (before its first `apiVersion:`), variables (`$x :=
.Values.a` then `$x.b` is `a.b`), `with` blocks (`.b` inside `with .Values.a`), and the named
templates it includes, transitively (`include (printf "prefix.%s" ...)` counts every template
of that prefix). It over-approximates (both branches of an `if`, every document of that kind in
the file), which only makes the check stricter.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from testkit.helm_chart import CHART_DIR, Obj, render

TEMPLATES = CHART_DIR / "templates"
_ACTION = re.compile(r"\{\{-?(.*?)-?\}\}", re.S)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|`[^`]*`')
_INCLUDE = re.compile(r'\b(?:include|template)\s+"([^"]+)"')
_INCLUDE_PREFIX = re.compile(r'\binclude\s+\(printf\s+"([^"%]*)%s')
_VALUES = re.compile(r"\.Values((?:\.[A-Za-z_]\w*)*)")
_VARIABLE = re.compile(r"\$([A-Za-z_]\w*)((?:\.[A-Za-z_]\w*)*)")
_RELATIVE = re.compile(r"(?<![\w$)\].])\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")
_DOT = re.compile(r"(?<![\w$)\].])\.(?![\w.])")
_ASSIGN = re.compile(r"^(\$\w+)(?:\s*,\s*(\$\w+))?\s*:?=\s*(.*)$", re.S)
_PATH = re.compile(r"^(\$?\w*\.Values(?:\.\w+)+|\$\w+(?:\.\w+)*|\.\w+(?:\.\w+)*)(\s*\|.*)?$", re.S)
ROOT_DOT = "<root>"  # the dot is the chart's root context
BUILTINS = frozenset({"Values", "Release", "Chart", "Capabilities", "Template", "Files", "Subcharts"})


@dataclass(frozen=True)
class Ref:
    """A values path (`a.b.c`; "" is all of .Values) and where the template reads it."""

    path: str
    where: str


@dataclass
class _Binding:
    path: str | None  # the values path a variable stands for, when it is one
    refs: frozenset[Ref] = frozenset()


@dataclass
class _Block:
    dot: str | None  # ROOT_DOT, a values path, or None (unknown: relative fields are not values)
    refs: frozenset[Ref]


@dataclass
class _Scan:
    """One pass over a template file, or over a named template's body (`define_name`)."""

    source: Path
    define_name: str = ""
    variables: dict[str, _Binding] = field(default_factory=dict)
    stack: list[_Block] = field(default_factory=lambda: [_Block(ROOT_DOT, frozenset())])

    @property
    def dot(self) -> str | None:
        return self.stack[-1].dot

    def where(self, line: int, through: str = "") -> str:
        """`templates/x.yaml:12`, or a chain of named templates: `templates/x.yaml:12 → a → b (file:line)`."""
        here = f"{self.source.relative_to(CHART_DIR)}:{line}"
        if self.define_name:
            return f"{self.define_name} → {through}" if through else f"{self.define_name} ({here})"
        return f"{here} → {through}" if through else here

    def refs(self, expression: str, line: int) -> frozenset[Ref]:
        """The values one expression reads (its includes' too)."""
        included = set(_INCLUDE.findall(expression))
        for prefix in _INCLUDE_PREFIX.findall(expression):
            included |= {name for name in _defines() if name.startswith(prefix)}
        found = {Ref(r.path, self.where(line, r.where)) for name in included for r in _define_refs(name)}
        code = _STRING.sub('""', expression)
        found |= {Ref(m.group(1).lstrip("."), self.where(line)) for m in _VALUES.finditer(code)}
        for var, fields in _VARIABLE.findall(code):
            if fields.startswith(".Values") or var not in self.variables:
                continue
            bound = self.variables[var]
            if bound.path is not None:
                found.add(Ref(_join(bound.path, fields.lstrip(".")), self.where(line)))
            found |= bound.refs
        if self.dot is not None and self.dot != ROOT_DOT:
            relative = [f for f in _RELATIVE.findall(code) if f.split(".")[0] not in BUILTINS]
            found |= {Ref(_join(self.dot, f), self.where(line)) for f in relative}
            if _DOT.search(code):
                found.add(Ref(self.dot, self.where(line)))
        return frozenset(found)

    def path_of(self, expression: str) -> str | None:
        """The values path an expression stands for (`.Values.a | default dict` is `a`), else None."""
        match = _PATH.match(expression.strip())
        if not match or _INCLUDE.search(expression):
            return None
        term = match.group(1)
        if ".Values" in term:
            return term.split(".Values", 1)[1].lstrip(".")
        if term.startswith("$"):
            var, _, rest = term[1:].partition(".")
            bound = self.variables.get(var)
            return _join(bound.path, rest) if bound and bound.path is not None else None
        if self.dot is None or self.dot == ROOT_DOT:
            return None
        return _join(self.dot, term.lstrip("."))

    def action(self, body: str, line: int) -> frozenset[Ref]:
        """Take one action in; the values it reads (a block's opener: also kept for what it encloses)."""
        keyword, _, rest = body.partition(" ")
        if keyword == "end":
            self.stack.pop()
            return frozenset()
        if keyword in ("define", "block"):
            self.stack.append(_Block(ROOT_DOT, frozenset()))
            return frozenset()
        if keyword == "else":  # the branch depends on the condition of the block it continues
            opened = self.stack.pop()
            sub, _, expression = rest.strip().partition(" ")
            refs = self.refs(expression, line) if sub in ("if", "with") else frozenset()
            dot = self.path_of(expression) if sub == "with" else self.dot
            self.stack.append(_Block(dot, opened.refs | refs))
            return refs
        if keyword in ("if", "with", "range"):
            assignment = _ASSIGN.match(rest.strip())
            expression = assignment.group(3) if assignment else rest
            refs = self.refs(expression, line)
            dot = self.path_of(expression) if keyword != "if" else self.dot
            if assignment:
                element = assignment.group(2) or assignment.group(1)
                self.variables[element.lstrip("$")] = _Binding(self.path_of(expression), refs)
            self.stack.append(_Block(dot, refs | self.stack[-1].refs))
            return refs
        assignment = _ASSIGN.match(body)
        if assignment and not assignment.group(2):
            expression = assignment.group(3)
            refs = self.refs(expression, line)
            path = self.path_of(expression)
            self.variables[assignment.group(1).lstrip("$")] = _Binding(path, frozenset() if path else refs)
            return frozenset() if path is not None else refs
        return self.refs(body, line)


def _join(path: str, fields: str) -> str:
    return ".".join(p for p in (path, fields) if p)


def _actions(text: str) -> list[tuple[int, int, str]]:
    """(offset, line, body) of each action that is not a comment."""
    out = []
    for match in _ACTION.finditer(text):
        body = match.group(1).strip()
        if not body.startswith("/*"):
            out.append((match.start(), text.count("\n", 0, match.start()) + 1, body))
    return out


@functools.cache
def _defines() -> dict[str, tuple[Path, int, str]]:
    """Every named template of the chart: name -> (file, line of its `define`, body)."""
    found: dict[str, tuple[Path, int, str]] = {}
    for path in sorted(TEMPLATES.glob("*")):
        text = path.read_text()
        depth, start, name = 0, (0, 0), ""
        for offset, line, body in _actions(text):
            keyword = body.split(None, 1)[0] if body else ""
            if keyword == "define" and depth == 0:
                name, start = re.findall(r'"([^"]+)"', body)[0], (offset, line)
            if keyword in ("define", "if", "with", "range", "block"):
                depth += 1
            elif keyword == "end":
                depth -= 1
                if depth == 0 and name:
                    body_start = text.index("}}", start[0]) + 2
                    found[name] = (path, start[1], text[body_start:offset])
                    name = ""
    return found


_IN_PROGRESS: set[str] = set()


@functools.cache
def _define_refs(name: str) -> frozenset[Ref]:
    """What a named template reads, called with the root context (every one here is)."""
    if name not in _defines() or name in _IN_PROGRESS:
        return frozenset()
    path, first_line, body = _defines()[name]
    _IN_PROGRESS.add(name)
    try:
        scan = _Scan(path, define_name=name)
        found: set[Ref] = set()
        for _, line, action in _actions(body):
            found |= scan.action(action, first_line + line - 1)
        return frozenset(found)
    finally:
        _IN_PROGRESS.discard(name)


def document_refs(template: Path, kind: str) -> frozenset[Ref]:
    """The values the documents of `template` that declare `kind:` are made from."""
    text = template.read_text()
    lines = text.splitlines(keepends=True)
    starts = [0, *(sum(map(len, lines[:i])) for i, ln in enumerate(lines) if re.match(r"^---\s*$", ln))]
    ends = [*starts[1:], len(text)]
    api = re.search(r"^apiVersion:", text, re.M)
    preamble_end = api.start() if api else len(text)
    wanted = [
        (start, end)
        for start, end in zip(starts, ends, strict=True)
        if re.search(rf"^kind:\s*{re.escape(kind)}\s*$", text[start:end], re.M)
    ]
    scan = _Scan(template)
    found: set[Ref] = set()
    entered: set[int] = set()
    for offset, line, body in _actions(text):
        for index, (start, end) in enumerate(wanted):
            if start <= offset < end and index not in entered:  # the blocks this document is inside
                entered.add(index)
                found |= scan.stack[-1].refs
        refs = scan.action(body, line)
        if offset < preamble_end or any(start <= offset < end for start, end in wanted):
            found |= refs
    return frozenset(found)


def rendered_by_template(values: Obj) -> list[tuple[Path, Obj]]:
    """(template file, object) of every object a render makes (Helm's engine, as `helm template`)."""
    out: list[tuple[Path, Obj]] = []
    for name, text in sorted(render(values).items()):
        if name.endswith("NOTES.txt") or "/charts/" in name:
            continue
        template = CHART_DIR / name.split("/", 1)[1]
        out += [(template, doc) for doc in yaml.safe_load_all(text) if doc]
    return out


# --- what a workload's Pods use besides their template -------------------------------------------

WORKLOAD_KINDS = ("DaemonSet", "Deployment", "StatefulSet", "Job", "CronJob")
ENV_FROM = (("ConfigMap", "configMapRef"), ("Secret", "secretRef"))
ENV_KEY_FROM = (("ConfigMap", "configMapKeyRef"), ("Secret", "secretKeyRef"))
_WORD_SEPARATORS = re.compile(r"[=/,\s]+")


def pod_spec(workload: Obj) -> Obj:
    spec = workload["spec"]["jobTemplate"]["spec"] if workload["kind"] == "CronJob" else workload["spec"]
    pod: Obj = spec["template"]["spec"]
    return pod


def used_objects(pod: Obj) -> tuple[set[tuple[str, str]], set[str]]:
    """(kind, name) of what a Pod uses besides its template (its ServiceAccount, ConfigMap and Secret
    volumes, envFrom, valueFrom), and the words of its env values and args (names it may read by API)."""
    used = {("ServiceAccount", str(pod.get("serviceAccountName", "default")))}
    for volume in pod.get("volumes", []):
        for source in [volume, *volume.get("projected", {}).get("sources", [])]:
            if "configMap" in source:
                used.add(("ConfigMap", source["configMap"]["name"]))
            if "secret" in source:
                used.add(("Secret", source["secret"].get("secretName") or source["secret"]["name"]))
    words: set[str] = set()
    for container in [*pod["containers"], *pod.get("initContainers", [])]:
        for env_from in container.get("envFrom", []):
            used |= {(kind, env_from[key]["name"]) for kind, key in ENV_FROM if key in env_from}
        for env in container.get("env", []):
            value_from = env.get("valueFrom", {})
            used |= {(kind, value_from[key]["name"]) for kind, key in ENV_KEY_FROM if key in value_from}
            words |= set(_WORD_SEPARATORS.split(str(env.get("value", ""))))
        for arg in [*container.get("command", []), *container.get("args", [])]:
            words |= set(_WORD_SEPARATORS.split(arg))
    return used, words


def makers(rendered: list[tuple[Path, Obj]], kind: str, name: str) -> list[tuple[Path, Obj, str]]:
    """The rendered objects `kind/name` is made from, with how: itself, and for a Secret the
    cert-manager Certificate that writes it, that Certificate's Issuer and the Issuer's CA Secret."""
    found: list[tuple[Path, Obj, str]] = []
    todo: list[tuple[str, str, str]] = [(kind, name, f"{kind}/{name}")]
    seen: set[tuple[str, str]] = set()
    while todo:
        kind, name, chain = todo.pop()
        if (kind, name) in seen:
            continue
        seen.add((kind, name))
        for template, obj in rendered:
            spec = obj.get("spec") or {}
            if obj["kind"] == kind and obj["metadata"]["name"] == name:
                found.append((template, obj, chain))
                if kind == "Certificate":
                    todo.append(("Issuer", spec["issuerRef"]["name"], f"{chain} <- its Issuer"))
                if kind == "Issuer" and "ca" in spec:
                    todo.append(("Secret", spec["ca"]["secretName"], f"{chain} <- its CA Secret"))
            if kind == "Secret" and obj["kind"] == "Certificate" and spec.get("secretName") == name:
                todo.append(("Certificate", obj["metadata"]["name"], f"{chain} <- Certificate"))
    return found


def read_through_other_objects(values: Obj) -> dict[str, set[str]]:
    """Each values path that an object the workloads of one render use is made from -> where the
    template reads it, into which object, used by which workload."""
    rendered = rendered_by_template(values)
    found: dict[str, set[str]] = {}
    for _, workload in rendered:
        if workload["kind"] not in WORKLOAD_KINDS:
            continue
        used, words = used_objects(pod_spec(workload))
        used |= {
            (obj["kind"], obj["metadata"]["name"])
            for _, obj in rendered
            if obj["kind"] in ("ConfigMap", "Secret") and obj["metadata"]["name"] in words
        }
        reader = f"{workload['kind']}/{workload['metadata']['name']}"
        for kind, name in sorted(used):
            for template, obj, chain in makers(rendered, kind, name):
                for ref in document_refs(template, obj["kind"]):
                    found.setdefault(ref.path, set()).add(f"{ref.where} into {chain}, used by {reader}")
    return found
