{{/*
TLS for the one HTTPS listener of praesto-hooks, which both the API server
(admission) and Metacontroller (hooks) call. Both clients need the CA inline
at render time: Metacontroller 4.17.2 resolves `webhook.caBundle.secretRef` and
`configMapRef` through its cached client (pkg/hooks/cabundle.go,
pkg/server/server.go mgr.GetClient()), which would start a cluster-wide Secret
or ConfigMap informer and so need list/watch on every Secret in the cluster.

"praesto.tls" computes the material once per render and memoizes it on the
root context (shared by every template of this chart), so the Secret, the
webhook configurations and the controllers all carry the same CA:
  caCrt, caKey  base64 PEM of the CA (caKey empty when not kept)
  crt, key      base64 PEM of the serving certificate (self-signed mode only)

Self-signed mode: the serving Secret already in the cluster is reused, so an
upgrade never swaps the CA under running clients; first install generates it.
cert-manager mode: the chart's CA (kept in the "<fullname>-ca" Secret, reused
the same way) backs a cert-manager CA Issuer that issues and renews the
serving certificate. Delete the Secret and upgrade to rotate the CA.
*/}}
{{- define "praesto.tls" -}}
{{- if not (hasKey . "praestoTLS") -}}
{{- $wh := .Values.webhooks -}}
{{- $days := int $wh.selfSigned.validityDays -}}
{{- $svc := include "praesto.hooksName" . -}}
{{- $tls := dict "caCrt" "" "caKey" "" "crt" "" "key" "" -}}
{{- if $wh.certManager.enabled -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "praesto.caName" .) -}}
{{- if and $existing $existing.data (index $existing.data "tls.crt") (index $existing.data "tls.key") -}}
{{- $_ := set $tls "caCrt" (index $existing.data "tls.crt") -}}
{{- $_ := set $tls "caKey" (index $existing.data "tls.key") -}}
{{- else -}}
{{- $ca := genCA (printf "%s-ca" $svc) $days -}}
{{- $_ := set $tls "caCrt" ($ca.Cert | b64enc) -}}
{{- $_ := set $tls "caKey" ($ca.Key | b64enc) -}}
{{- end -}}
{{- else -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "praesto.tlsSecretName" .) -}}
{{- if and $existing $existing.data (index $existing.data "tls.crt") (index $existing.data "tls.key") (index $existing.data "ca.crt") -}}
{{- $_ := set $tls "crt" (index $existing.data "tls.crt") -}}
{{- $_ := set $tls "key" (index $existing.data "tls.key") -}}
{{- $_ := set $tls "caCrt" (index $existing.data "ca.crt") -}}
{{- else -}}
{{- $ca := genCA (printf "%s-ca" $svc) $days -}}
{{- $cert := genSignedCert (printf "%s.%s.svc" $svc .Release.Namespace) nil (include "praesto.hooksDNSNames" . | fromJsonArray) $days $ca -}}
{{- $_ := set $tls "crt" ($cert.Cert | b64enc) -}}
{{- $_ := set $tls "key" ($cert.Key | b64enc) -}}
{{- $_ := set $tls "caCrt" ($ca.Cert | b64enc) -}}
{{- end -}}
{{- end -}}
{{- $_ := set . "praestoTLS" $tls -}}
{{- end -}}
{{- end }}

{{/* The CA bundle (base64 PEM) every client of the hooks trusts. */}}
{{- define "praesto.caBundle" -}}
{{- include "praesto.tls" . -}}
{{- .praestoTLS.caCrt -}}
{{- end }}

{{/* Base URL of the hooks' HTTPS Service, as Metacontroller and the docs name it. */}}
{{- define "praesto.hooksURL" -}}
{{- printf "https://%s.%s.svc" (include "praesto.hooksName" .) .Release.Namespace -}}
{{- end }}
