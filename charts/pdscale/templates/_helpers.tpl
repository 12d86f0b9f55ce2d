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
