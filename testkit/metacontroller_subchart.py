"""A test-only stand-in for the chart's one dependency, metacontroller-helm, for wherever Helm needs it present.

charts/praesto/Chart.yaml declares `metacontroller-helm` (alias `metacontroller`) from
oci://ghcr.io/metacontroller, fetched by `helm dependency build`; ghcr.io cannot be reached
here. Without it `helm lint --strict` fails (Helm v4.3.2 pkg/chart/v2/lint/rules/dependencies.go:
"chart directory is missing these dependencies", a warning --strict makes fatal) and
`helm install` refuses ("found in Chart.yaml, but missing in charts/ directory").

The stand-in has the name and version Chart.yaml pins (read from there, never re-typed) and
holds what the tests look at, not Metacontroller itself:

* `crds/`: Metacontroller's own CRDs (CompositeController, DecoratorController,
  ControllerRevision), exactly as its 4.17.2 chart ships them (tests/chart/data), so an install
  of the chart can create our controllers;
* `templates/`: the ServiceAccount, ClusterRole and ClusterRoleBinding, templated from
  `clusterRole.rules` as metacontroller-helm 4.x does, defaulting to the same `*/*/*` grant and
  leaving out an empty aggregationRule like 4.17.2's templates/clusterrole.yaml (the API server
  refuses an empty one). No workload is installed: nothing of Metacontroller runs from it (the
  tiers start Metacontroller's stand-in themselves);
* `templates/statefulset.yaml`: only when the stand-in-only value `standinRenderWorkload` is
  true (never in an install), Metacontroller's container args, env and resources exactly as
  4.17.2's templates/statefulset.yaml renders them (`toYaml .Values.commandArgs`, `.env`,
  `.resources`), with its default values.yaml, so tests and the tiers read what the chart gives
  Metacontroller (`rendered_command_args`, `rendered_env`, `chart_metacontroller_flags`).

It is never written into the working tree's chart: callers pass a temporary directory.

    sub = write_standin_subchart(chart_dir / "charts")   # charts/metacontroller-helm/
    chart = chart_copy_with_dependency(tmp_path)         # tmp_path/praesto, dependency present
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml

from testkit.client_rate_limit import MetacontrollerFlags
from testkit.helm_chart import CHART_DIR, ROOT, one, render_objects

METACONTROLLER_CRDS = ROOT / "tests" / "chart" / "data" / "metacontroller-crds.yaml"


def dependency() -> dict[str, Any]:
    """Chart.yaml's metacontroller-helm entry (name, alias, version, repository, condition)."""
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    (entry,) = [d for d in chart["dependencies"] if d["name"] == "metacontroller-helm"]
    return dict(entry)


def _chart_yaml() -> str:
    dep = dependency()
    return yaml.safe_dump(
        {
            "apiVersion": "v2",
            "name": dep["name"],
            "version": dep["version"],
            "appVersion": f"v{dep['version']}",
            "description": "TEST-ONLY stand-in for metacontroller-helm (its CRDs and RBAC only); "
            "not the real chart.",
        },
        sort_keys=False,
    )


_VALUES = """\
rbac:
  create: true
nameOverride: ""
fullnameOverride: ""
serviceAccount:
  create: true
  name: ""
commandArgs:
  - --zap-log-level=4
  - --discovery-interval=20s
  - --cache-flush-interval=30m
  - --health-probe-bind-address=:8081
env: []
resources: {}
standinRenderWorkload: false
clusterRole:
  aggregationRule: {}
  rules:
    - apiGroups: ["*"]
      resources: ["*"]
      verbs: ["*"]
"""

_TEMPLATES = {
    "_helpers.tpl": """\
{{- define "standin.name" -}}{{ default .Chart.Name .Values.nameOverride }}{{- end }}
{{- define "standin.fullname" -}}{{ printf "%s-%s" .Release.Name (include "standin.name" .) }}{{- end }}
""",
    "rbac.yaml": """\
{{- if .Values.rbac.create }}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ include "standin.fullname" . }}
  namespace: {{ .Release.Namespace }}
---
kind: ClusterRole
apiVersion: rbac.authorization.k8s.io/v1
metadata:
  name: {{ include "standin.fullname" . }}
{{- if .Values.clusterRole.aggregationRule }}
aggregationRule:
  {{- toYaml .Values.clusterRole.aggregationRule | nindent 2 }}
{{- end }}
rules:
  {{- toYaml .Values.clusterRole.rules | nindent 2 }}
---
kind: ClusterRoleBinding
apiVersion: rbac.authorization.k8s.io/v1
metadata:
  name: {{ include "standin.fullname" . }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {{ include "standin.fullname" . }}
subjects:
  - kind: ServiceAccount
    name: {{ include "standin.fullname" . }}
    namespace: {{ .Release.Namespace }}
{{- end }}
""",
    "statefulset.yaml": """\
{{- if .Values.standinRenderWorkload }}
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: {{ include "standin.fullname" . }}
  namespace: {{ .Release.Namespace }}
spec:
  serviceName: ""
  selector:
    matchLabels:
      app.kubernetes.io/name: {{ include "standin.name" . }}
  template:
    metadata:
      labels:
        app.kubernetes.io/name: {{ include "standin.name" . }}
    spec:
      containers:
        - name: metacontroller
          image: stand-in.invalid/metacontroller:never-pulled
          {{- with .Values.env }}
          env:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          command:
            - {{ .Values.command | default "/usr/bin/metacontroller" }}
          args:
            {{- toYaml .Values.commandArgs | nindent 12 }}
          resources:
            {{- toYaml .Values.resources | nindent 12 }}
{{- end }}
""",
}


def write_standin_subchart(dest_charts_dir: Path) -> Path:
    """Write the stand-in as `dest_charts_dir/metacontroller-helm/` (a chart's charts/ folder); its path."""
    name: str = dependency()["name"]
    sub = dest_charts_dir / name
    (sub / "templates").mkdir(parents=True)
    (sub / "crds").mkdir()
    (sub / "Chart.yaml").write_text(_chart_yaml())
    (sub / "values.yaml").write_text(_VALUES)
    for template, text in _TEMPLATES.items():
        (sub / "templates" / template).write_text(text)
    shutil.copyfile(METACONTROLLER_CRDS, sub / "crds" / METACONTROLLER_CRDS.name)
    return sub


def chart_copy_with_dependency(tmp: Path) -> Path:
    """A copy of charts/praesto at `tmp/praesto` whose charts/ holds the stand-in; its path."""
    target = tmp / "praesto"
    shutil.copytree(CHART_DIR, target, ignore=shutil.ignore_patterns("charts"))
    write_standin_subchart(target / "charts")
    return target


def rendered_container(tmp: Path, values: dict[str, Any] | None = None) -> dict[str, Any]:
    """Metacontroller's container as the chart renders it with `values` (the subchart's StatefulSet)."""
    chart = chart_copy_with_dependency(tmp)
    shown = {**(values or {})}
    shown["metacontroller"] = {**(shown.get("metacontroller") or {}), "standinRenderWorkload": True}
    workload = one(render_objects(shown, chart_dir=chart), "StatefulSet")
    container: dict[str, Any] = workload["spec"]["template"]["spec"]["containers"][0]
    return container


def rendered_command_args(tmp: Path, values: dict[str, Any] | None = None) -> list[str]:
    """Metacontroller's args as the chart renders them with `values`."""
    args: list[str] = rendered_container(tmp, values)["args"]
    return args


def rendered_env(tmp: Path, values: dict[str, Any] | None = None) -> dict[str, str]:
    """The plain-value environment the chart gives Metacontroller's container (GOMEMLIMIT...)."""
    env = rendered_container(tmp, values).get("env") or []
    return {e["name"]: str(e["value"]) for e in env if "value" in e}


def chart_metacontroller_flags(tmp: Path, values: dict[str, Any] | None = None) -> MetacontrollerFlags:
    """The settings the chart gives Metacontroller, for the stand-in to run at (`Metacontroller(flags=...)`)."""
    return MetacontrollerFlags.from_args(rendered_command_args(tmp, values))
