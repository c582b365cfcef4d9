{{- define "numaguard.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "numaguard.webConfig" -}}
{{- if .Values.webConfig.secretName }}
            - --web.config.file=/etc/numaguard/web/web-config.yml
{{- end }}
{{- end -}}
