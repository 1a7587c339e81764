{{/*
Names and labels: the one place every template takes them from.
*/}}

{{- define "praesto.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Prefix of every object name: the release name when it already says praesto. */}}
{{- define "praesto.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "praesto.hooksName" -}}{{ include "praesto.fullname" . }}-hooks{{- end }}
{{- define "praesto.nodeName" -}}{{ include "praesto.fullname" . }}-node-agent{{- end }}
{{- define "praesto.tlsSecretName" -}}{{ include "praesto.fullname" . }}-hooks-tls{{- end }}
{{- define "praesto.caName" -}}{{ include "praesto.fullname" . }}-ca{{- end }}
{{- define "praesto.selfSignedIssuerName" -}}{{ include "praesto.fullname" . }}-selfsigned{{- end }}
{{- define "praesto.webhookName" -}}{{ include "praesto.fullname" . }}-admission{{- end }}

{{/* The Service DNS names the serving certificate must cover. */}}
{{- define "praesto.hooksDNSNames" -}}
{{- $svc := include "praesto.hooksName" . -}}
{{- $ns := .Release.Namespace -}}
{{- list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) | toJson -}}
{{- end }}

{{- define "praesto.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels of one component; call with (list $ "component"). */}}
{{- define "praesto.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "praesto.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/* Full label set of one component; call with (list $ "component"). */}}
{{- define "praesto.labels" -}}
{{- $root := index . 0 -}}
helm.sh/chart: {{ include "praesto.chart" $root }}
{{ include "praesto.selectorLabels" . }}
app.kubernetes.io/version: {{ $root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
app.kubernetes.io/part-of: praesto
{{- end }}

{{/* Image reference; call with (list $ .Values.<component>.image). Empty fields fall back to .Values.image. */}}
{{- define "praesto.image" -}}
{{- $root := index . 0 -}}
{{- $img := index . 1 | default dict -}}
{{- $repo := $img.repository | default $root.Values.image.repository -}}
{{- $tag := $img.tag | default $root.Values.image.tag | default $root.Chart.AppVersion -}}
{{- printf "%s:%s" $repo $tag -}}
{{- end }}

{{/* The restricted container security context every Praesto container starts from. */}}
{{- /* praesto-orphans' heartbeat (hooks/orphans/cli.py), in its own memory emptyDir. */}}
{{- define "praesto.orphansHeartbeatDir" -}}/run/praesto-orphans{{- end }}
{{- define "praesto.orphansHeartbeat" -}}{{ include "praesto.orphansHeartbeatDir" . }}/heartbeat{{- end }}

{{- define "praesto.restrictedSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- /* The node agent's finalizer on ModelCacheNodes: praesto/names.py FINALIZER_NODE_AGENT (a chart test compares). */}}
{{- define "praesto.agentFinalizer" -}}praesto.io/node-agent{{- end }}
{{- define "praesto.agentServiceAccount" -}}{{ include "praesto.nodeName" . }}{{- end }}

{{- /* The platform's signing trust (verification.trust): one ConfigMap, mounted by the agent and the hooks. */}}
{{- define "praesto.trustConfigMap" -}}{{ printf "%s-trust" (include "praesto.fullname" .) }}{{- end }}
{{- define "praesto.trustDir" -}}/etc/praesto/cluster-trust{{- end }}
