{{/* The release's base name: the release name, with "natsagent" added when it does not already say it. */}}
{{- define "natsagent.fullname" -}}
{{- if contains "natsagent" .Release.Name -}}
{{- .Release.Name | trunc 53 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-natsagent" .Release.Name | trunc 53 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels on every object of the release: natsagent.podLabels on pods, which add their selector labels. */}}
{{- define "natsagent.commonLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/part-of: natsagent
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}
{{- define "natsagent.labels" -}}
{{ include "natsagent.commonLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The selector labels of one component: include with (list . "gateway"). */}}
{{- define "natsagent.selector" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: natsagent
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* The image of one component: include with (list . "gateway"). */}}
{{- define "natsagent.image" -}}
{{- $root := index . 0 -}}
{{- printf "%s/%s:%s" (trimSuffix "/" $root.Values.image.registry) (index . 1) (default $root.Chart.AppVersion $root.Values.image.tag) -}}
{{- end -}}

{{/* The natsagent.yaml of every pod: .Values.config under the keys the chart owns. */}}
{{- define "natsagent.config" -}}
{{- $owned := dict
  "nats" (dict "url" .Values.nats.url "replicas" .Values.nats.replicas)
  "gateway" (dict "listen" (printf "0.0.0.0:%d" (int .Values.gateway.port)))
  "worker" (dict "concurrency" .Values.worker.concurrency "shutdown_grace" (printf "%ds" (int .Values.worker.shutdownGraceSeconds)))
-}}
{{- $cfg := mustMergeOverwrite (deepCopy .Values.config) $owned -}}
{{- if .Values.serviceMonitor.enabled -}}
{{- $metrics := dig "telemetry" "metrics" dict $cfg -}}
{{- if or (eq (toString (dig "enabled" true $metrics)) "false") (dig "listen" "" $metrics) -}}
{{- fail "serviceMonitor.enabled scrapes /metrics on the gateway's and the workers' own ports: leave config.telemetry.metrics.enabled on and config.telemetry.metrics.listen empty" -}}
{{- end -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* The pod and container security settings both components share. */}}
{{- define "natsagent.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}
{{- define "natsagent.securityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}
