{{- define "epp.name" -}}{{ .Release.Name }}-epp{{- end -}}
{{- define "epp.labels" -}}
app.kubernetes.io/name: warmroute
app.kubernetes.io/component: endpoint-picker
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- define "epp.selector" -}}
app.kubernetes.io/name: warmroute
app.kubernetes.io/component: endpoint-picker
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
