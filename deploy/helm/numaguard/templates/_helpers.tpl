{{/* A role's image: image.repository-<role>, e.g. ghcr.io/numaguard/numaguard-exporter */}}
{{- define "numaguard.image" -}}
{{ .root.Values.image.repository }}-{{ .role }}:{{ .root.Values.image.tag | default .root.Chart.AppVersion }}
{{- end -}}

{{- define "numaguard.webConfig" -}}
{{- if .Values.webConfig.secretName }}
            - --web.config.file=/etc/numaguard/web/web-config.yml
{{- end }}
{{- if .Values.webConfig.kubernetesAuth }}
            - --web.kubernetes-auth
{{- end }}
{{- end -}}

{{/* Prometheus' own token, for webConfig.kubernetesAuth */}}
{{- define "numaguard.scraperToken" -}}
{{- if .Values.webConfig.kubernetesAuth }}
      bearerTokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
{{- end }}
{{- end -}}

{{/* system:auth-delegator for a component that asks about its scrapers */}}
{{- define "numaguard.authDelegator" -}}
{{- if .root.Values.webConfig.kubernetesAuth }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ .account }}-auth-delegator
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:auth-delegator
subjects:
  - kind: ServiceAccount
    name: {{ .account }}
    namespace: {{ .root.Release.Namespace }}
{{- end }}
{{- end -}}
