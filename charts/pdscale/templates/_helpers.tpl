{{/* Names are fixed and short: child objects never get truncated suffixes. */}}
{{- define "pdscale.name" -}}pdscale-operator{{- end -}}

{{- define "pdscale.serviceAccountName" -}}
{{- default "pdscale-operator" .Values.serviceAccount.name -}}
{{- end -}}

{{- define "pdscale.labels" -}}
app.kubernetes.io/name: pdscale
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "pdscale.selectorLabels" -}}
app.kubernetes.io/name: pdscale
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/*
The namespaces the operator serves, comma-separated; empty only with rbac.clusterWide (all
namespaces). Namespaced by default: operator.watchNamespaces, or else the release's own.
*/}}
{{- define "pdscale.servedNamespaces" -}}
{{- if .Values.rbac.clusterWide -}}
{{- if .Values.operator.watchNamespaces -}}
{{- fail "rbac.clusterWide serves every namespace: leave operator.watchNamespaces empty, or set rbac.clusterWide=false" -}}
{{- end -}}
{{- else if .Values.operator.watchNamespaces -}}
{{- join "," .Values.operator.watchNamespaces -}}
{{- else -}}
{{- .Release.Namespace -}}
{{- end -}}
{{- end -}}
