{{/* The chart's name, or nameOverride */}}
{{- define "numaguard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Every object's name starts with this: the release's name when it contains the
chart's (release "numaguard": numaguard-exporter, as deploy/base), else
<release>-<name>; or fullnameOverride. */}}
{{- define "numaguard.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "numaguard.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Kubernetes' recommended labels, on every object */}}
{{- define "numaguard.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: numaguard
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* A component's selector: (dict "root" $ "component" "exporter") */}}
{{- define "numaguard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "numaguard.name" .root }}-{{ .component }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end -}}

{{/* A component's labels: the recommended ones and its selector */}}
{{- define "numaguard.componentLabels" -}}
{{ include "numaguard.labels" .root }}
{{ include "numaguard.selectorLabels" . }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* A component's ServiceAccount: (dict "root" $ "component" "exporter") */}}
{{- define "numaguard.serviceAccount" -}}
{{- $values := index .root.Values .component -}}
{{- if $values.serviceAccount.create -}}
{{- default (printf "%s-%s" (include "numaguard.fullname" .root) .component) $values.serviceAccount.name -}}
{{- else -}}
{{- required (printf "%s.serviceAccount.name: the account to run as, when create is false" .component) $values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* A role's image: its own repository or image.repository-<role>, then its tag
(default: the chart's appVersion) or its digest */}}
{{- define "numaguard.image" -}}
{{- $own := (index .root.Values .role).image -}}
{{- $repository := $own.repository | default (printf "%s-%s" .root.Values.image.repository .role) -}}
{{- $tag := $own.tag | default .root.Values.image.tag | default .root.Chart.AppVersion -}}
{{- if $own.digest -}}
{{ $repository }}:{{ $tag }}@{{ $own.digest }}
{{- else -}}
{{ $repository }}:{{ $tag }}
{{- end -}}
{{- end -}}

{{/* What the pod spec of a role shares: (dict "root" $ "role" "exporter"), and
"affinity" when it is not the role's value as given */}}
{{- define "numaguard.podScheduling" -}}
{{- $values := index .root.Values .role -}}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with (hasKey . "affinity" | ternary .affinity $values.affinity) }}
affinity: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.podSecurityContext }}
securityContext: {{- toYaml . | nindent 2 }}
{{- end }}
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

{{/* How Prometheus reaches a component: (dict "root" $) */}}
{{- define "numaguard.scrape" -}}
{{- $monitor := .root.Values.serviceMonitor -}}
{{- with $monitor.scrapeTimeout }}
      scrapeTimeout: {{ . }}
{{- end }}
{{- with $monitor.scheme }}
      scheme: {{ . }}
{{- end }}
{{- with $monitor.tlsConfig }}
      tlsConfig: {{- toYaml . | nindent 8 }}
{{- end }}
{{- with $monitor.basicAuth }}
      basicAuth: {{- toYaml . | nindent 8 }}
{{- end }}
{{- include "numaguard.scraperToken" .root }}
{{- with $monitor.metricRelabelings }}
      metricRelabelings: {{- toYaml . | nindent 8 }}
{{- end }}
{{- end -}}

{{/* system:auth-delegator for a component that asks about its scrapers */}}
{{- define "numaguard.authDelegator" -}}
{{- if and .root.Values.webConfig.kubernetesAuth .root.Values.rbac.create }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ include "numaguard.fullname" .root }}-{{ .component }}-auth-delegator
  labels:
    {{- include "numaguard.labels" .root | nindent 4 }}
    numaguard.io/component: kubernetes-auth
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:auth-delegator
subjects:
  - kind: ServiceAccount
    name: {{ include "numaguard.serviceAccount" . }}
    namespace: {{ .root.Release.Namespace }}
{{- end }}
{{- end -}}
