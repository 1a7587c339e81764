{{- /*
Cluster-wide credentials and download settings (issue 7). One place computes
what the node agent and the PVC-mode downloader Job receive; the refusals below
run on every render (included from credentials.yaml).
*/}}

{{- define "praesto.identityEnabled" -}}
{{- $id := .Values.credentials.identity -}}
{{- if or $id.serviceAccountAnnotations $id.serviceAccountLabels }}true{{ end -}}
{{- end }}

{{- define "praesto.validateCredentials" -}}
{{- $id := .Values.credentials.identity -}}
{{- $ann := $id.serviceAccountAnnotations | default dict -}}
{{- $labels := $id.serviceAccountLabels | default dict -}}
{{- $identity := include "praesto.identityEnabled" . -}}
{{- if and $identity .Values.credentials.secretRef.name -}}
{{- fail "credentials: identity and secretRef are both set; a cluster uses one kind of credential: keep credentials.identity (workload identity) or credentials.secretRef (a Secret with keys), and remove the other" -}}
{{- end -}}
{{- if and $identity (not (or (hasKey $ann "eks.amazonaws.com/role-arn") (hasKey $ann "iam.gke.io/gcp-service-account") (hasKey $ann "azure.workload.identity/client-id"))) -}}
{{- fail "credentials.identity.serviceAccountAnnotations: no workload-identity annotation is set, so the ServiceAccounts would get no cloud identity; add eks.amazonaws.com/role-arn (AWS IRSA), iam.gke.io/gcp-service-account (GKE) or azure.workload.identity/client-id (Azure)" -}}
{{- end -}}
{{- range $ns := $id.downloaderNamespaces -}}
{{- if not (has $ns $.Values.credentials.namespaces) -}}
{{- fail (printf "credentials.identity.downloaderNamespaces: %s is not in credentials.namespaces, so its caches may not use the cluster's identity and the downloader ServiceAccount there would only be an identity any Pod of that namespace could borrow; add %s to credentials.namespaces or remove it from downloaderNamespaces" $ns $ns) -}}
{{- end -}}
{{- end -}}
{{- if and (hasKey $ann "azure.workload.identity/client-id") (ne (get $labels "azure.workload.identity/use" | toString) "true") -}}
{{- fail "credentials.identity.serviceAccountLabels: azure.workload.identity/client-id is set without the label azure.workload.identity/use: \"true\", so Azure would inject no token; add that label" -}}
{{- end -}}
{{- end }}

{{- /* Labels the agent and downloader Pods carry for workload identity (Azure reads them on the Pod). */}}
{{- define "praesto.identityPodLabels" -}}
{{- if include "praesto.identityEnabled" . }}
{{- with .Values.credentials.identity.serviceAccountLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}
{{- end }}

{{- /* Env both the agent and the downloader Job get: identity flag, proxies, CA bundle path. */}}
{{- define "praesto.downloadEnvMap" -}}
{{- $out := dict -}}
{{- if include "praesto.identityEnabled" . }}{{ $_ := set $out "PRAESTO_WORKLOAD_IDENTITY" "true" }}{{ end -}}
{{- with .Values.downloads.proxy.httpProxy }}{{ $_ := set $out "HTTP_PROXY" . }}{{ end -}}
{{- with .Values.downloads.proxy.httpsProxy }}{{ $_ := set $out "HTTPS_PROXY" . }}{{ end -}}
{{- with .Values.downloads.proxy.noProxy }}{{ $_ := set $out "NO_PROXY" . }}{{ end -}}
{{- with .Values.downloads.oci.mirrors }}{{ $_ := set $out "PRAESTO_OCI_MIRRORS" (toJson .) }}{{ end -}}
{{- with .Values.downloads.egress.allowedCIDRs }}{{ $_ := set $out "PRAESTO_EGRESS_ALLOWED_CIDRS" (join "," .) }}{{ end -}}
{{- if (.Values.downloads.xet | default dict).enabled }}{{ $_ := set $out "PRAESTO_XET" "true" }}{{ end -}}
{{- toJson $out -}}
{{- end }}

{{- /* Who creates the downloader Jobs: the Metacontroller ServiceAccount (issue 21 item 3). */}}
{{- define "praesto.downloaderJobCreator" -}}
{{- with .Values.credentials.identity.downloaderJobCreator -}}
{{ . }}
{{- else -}}
{{- if not .Values.metacontroller.enabled -}}
{{- fail "credentials.identity.downloaderJobCreator: metacontroller.enabled is false, so the chart cannot tell which user creates the downloader Jobs; set it to your Metacontroller's ServiceAccount user, e.g. system:serviceaccount:metacontroller:metacontroller" -}}
{{- end -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ .Release.Name }}-metacontroller
{{- end -}}
{{- end }}

{{- /* The users the Job controller creates Pods as: its own ServiceAccount when the controller-manager
runs with --use-service-account-credentials (kubeadm and most distributions), else the manager's. */}}
{{- define "praesto.jobControllerUsers" -}}
['system:serviceaccount:kube-system:job-controller', 'system:kube-controller-manager']
{{- end }}

{{- define "praesto.caBundleFile" -}}/etc/praesto/ca/ca.crt{{- end }}
