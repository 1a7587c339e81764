{{- /*
Upgrades roll what they change, and nothing else (chart README, "Upgrades: what rolls").

A value a process reads from its own Pod template (a flag, an env var, a volume) rolls that
workload by itself when it changes. A value that reaches a process through another object and
is read only once, when the process starts, must reach the Pod template too, or a changed value
leaves the running Pods on the old one. Each such input is hashed here, from the values that
make the other object, into a `checksum.praesto.io/<input>` annotation on exactly the Pod
templates of the processes that read it:

  identity  credentials.identity: the agent's ServiceAccount annotations and labels. The
            cloud's webhook (AWS IRSA, Azure workload identity) writes the role its
            ServiceAccount names into a Pod when the Pod is created, and the agent keeps the
            environment it started with (agent/settings.py store_env). Read by the agent
            (node DaemonSet); each PVC-mode downloader Job is a new Pod anyway.
  trust     verification.trust: the trust ConfigMap, which the agent and the hooks load once
            at start (praesto/trustpolicy.py load_trust_dir).

Hashed from values, never from generated material, so rendering the same values again gives the
same annotations (no roll). Read live, hence not here: the hooks' TLS certificate, key and
webhook client CA (gunicorn builds its SSL context per connection, hooks/serving/whole_request_worker.py),
the Secret named by credentials.secretRef.name (read by the agent at each download attempt).
*/}}

{{- define "praesto.checksum.identity" -}}
{{- if include "praesto.identityEnabled" . -}}
{{- $id := .Values.credentials.identity -}}
{{- dict "annotations" ($id.serviceAccountAnnotations | default dict) "labels" ($id.serviceAccountLabels | default dict) | toJson | sha256sum -}}
{{- end -}}
{{- end }}

{{- define "praesto.checksum.trust" -}}
{{- with .Values.verification.trust -}}
{{- toJson . | sha256sum -}}
{{- end -}}
{{- end }}

{{- /* `checksum.praesto.io/<input>: <sha256>` for each input of `inputs` that is set; call with (list $ (list "identity" "trust")). */}}
{{- define "praesto.rollChecksums" -}}
{{- $root := index . 0 -}}
{{- range $input := index . 1 }}
{{- with include (printf "praesto.checksum.%s" $input) $root }}
checksum.praesto.io/{{ $input }}: {{ . | quote }}
{{- end }}
{{- end }}
{{- end }}

{{- /* What the node agent reads once from other objects (the CSI plugin, in the same Pod, reads none of them). */}}
{{- define "praesto.agentRollChecksums" -}}
{{- include "praesto.rollChecksums" (list . (list "identity" "trust")) -}}
{{- end }}

{{- define "praesto.hooksRollChecksums" -}}
{{- include "praesto.rollChecksums" (list . (list "trust")) -}}
{{- end }}

{{- /*
The node DaemonSet's updateStrategy (nodeAgent.updateStrategy). maxSurge must stay 0: a surge Pod
would run beside the old one on the same node, two agents writing one node-local store (the agent
is its only writer) and two CSI plugins serving and registering the same kubelet sockets
(<csi.kubeletDir>/plugins/csi.praesto.io/csi.sock, plugins_registry/csi.praesto.io-reg.sock),
the old one removing the new one's socket as it exits.
*/}}
{{- define "praesto.agentUpdateStrategy" -}}
{{- $strategy := .Values.nodeAgent.updateStrategy -}}
{{- $rolling := $strategy.rollingUpdate | default dict -}}
{{- if and (hasKey $rolling "maxSurge") (not (has (toString $rolling.maxSurge) (list "0" "0%"))) -}}
{{- fail (printf "nodeAgent.updateStrategy.rollingUpdate.maxSurge is %v: a second agent Pod on a node would write the same store and take the CSI plugin's sockets from the first; remove maxSurge (the chart keeps it 0) and pace the roll with maxUnavailable" $rolling.maxSurge) -}}
{{- end -}}
type: {{ $strategy.type }}
{{- if eq $strategy.type "RollingUpdate" }}
rollingUpdate:
  maxUnavailable: {{ $rolling.maxUnavailable | default 1 | toJson }}
  maxSurge: 0
{{- end }}
{{- end }}
