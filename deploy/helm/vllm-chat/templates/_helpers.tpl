{{- define "vllm-chat.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "vllm-chat.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "vllm-chat.trustedProxies" -}}
{{ required "proxy.trustedAddresses: the Ingress controller's pod addresses or subnet (values.yaml)" .Values.proxy.trustedAddresses }}
{{- end -}}
