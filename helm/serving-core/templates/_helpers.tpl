{{/*
Names and labels, after the `helm create` scaffold.
*/}}
{{- define "serving-core.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: "<release>-<chart>", or the release name when it already contains
the chart name. Truncated to 63 characters (DNS label) minus room for the
"-worker" and "-batch" suffixes of the placeholder workloads.
*/}}
{{- define "serving-core.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 56 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 56 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 56 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "serving-core.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "serving-core.labels" -}}
helm.sh/chart: {{ include "serving-core.chart" . }}
app.kubernetes.io/name: {{ include "serving-core.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ include "serving-core.imageTag" . | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: serving-core
{{- end }}

{{/*
Selector labels of one component ("server", "worker", "batch"): call with
(dict "ctx" $ "component" "server"). The component keeps the Service and the
PodDisruptionBudget on the server pods only.
*/}}
{{- define "serving-core.selectorLabels" -}}
app.kubernetes.io/name: {{ include "serving-core.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "serving-core.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "serving-core.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Images. The app tag defaults to the chart's appVersion, which chart.yml sets
to the image tag it publishes with. The nginx image follows the app image:
image.yml pushes "<repo>" and "<repo>-nginx" with the same tags.
*/}}
{{- define "serving-core.imageTag" -}}
{{- .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "serving-core.image" -}}
{{- $ref := printf "%s:%s" .Values.image.repository (include "serving-core.imageTag" .) }}
{{- if .Values.image.digest }}{{ $ref = printf "%s@%s" $ref .Values.image.digest }}{{ end }}
{{- $ref }}
{{- end }}

{{- define "serving-core.nginxImage" -}}
{{- $img := .Values.nginx.image }}
{{- $repo := $img.repository | default (printf "%s-nginx" .Values.image.repository) }}
{{- $ref := printf "%s:%s" $repo ($img.tag | default (include "serving-core.imageTag" .)) }}
{{- if $img.digest }}{{ $ref = printf "%s@%s" $ref $img.digest }}{{ end }}
{{- $ref }}
{{- end }}

{{/*
Fixed paths shared by the templates. gunicorn listens on a unix socket in an
emptyDir that only the app and nginx containers mount: nothing else in the
cluster can reach gunicorn past nginx.
*/}}
{{- define "serving-core.socketDir" -}}/run/serving{{- end }}
{{- define "serving-core.bind" -}}unix:/run/serving/gunicorn.sock{{- end }}
{{- define "serving-core.metricsDir" -}}/run/metrics{{- end }}
{{- define "serving-core.nginxConfDir" -}}/etc/nginx/serving-core{{- end }}

{{/*
serving key -> SERVING_* variable and how to print it. Integers go through
int64 because Helm reads every number as a float (1048576 would print as
1.048576e+06). "auto" entries are left unset at 0 so serving-core resolves
them from the container's CPU limit; "optional" ones are left unset when empty.
*/}}
{{- define "serving-core.settings" -}}
handler: {env: SERVING_HANDLER, kind: string}
workers: {env: SERVING_WORKERS, kind: auto}
workerClass: {env: SERVING_WORKER_CLASS, kind: string}
workerConnections: {env: SERVING_WORKER_CONNECTIONS, kind: int}
threads: {env: SERVING_THREADS, kind: auto}
maxBatchSize: {env: SERVING_MAX_BATCH_SIZE, kind: int}
maxWaitMs: {env: SERVING_MAX_WAIT_MS, kind: number}
batchPolicy: {env: SERVING_BATCH_POLICY, kind: string}
maxQueue: {env: SERVING_MAX_QUEUE, kind: auto}
requestTimeoutSeconds: {env: SERVING_REQUEST_TIMEOUT_S, kind: number}
maxBodyBytes: {env: SERVING_MAX_BODY_BYTES, kind: int}
gracefulTimeoutSeconds: {env: SERVING_GRACEFUL_TIMEOUT_S, kind: number}
keepaliveSeconds: {env: SERVING_KEEPALIVE_S, kind: number}
logLevel: {env: SERVING_LOG_LEVEL, kind: string}
cacheUrl: {env: SERVING_CACHE_URL, kind: optional}
redisUrl: {env: SERVING_REDIS_URL, kind: optional}
{{- end }}

{{/*
Checks that JSON Schema cannot express; each message says what to change.
*/}}
{{- define "serving-core.validate" -}}
{{- $s := .Values.serving }}
{{- if and (gt (int64 $s.maxQueue) 0) (lt (int64 $s.maxQueue) (int64 $s.maxBatchSize)) }}
{{- fail (printf "serving.maxQueue (%d) is smaller than serving.maxBatchSize (%d): raise serving.maxQueue so that a full batch can queue" (int64 $s.maxQueue) (int64 $s.maxBatchSize)) }}
{{- end }}
{{- if eq (int .Values.nginx.port) (int .Values.nginx.metricsPort) }}
{{- fail (printf "nginx.port and nginx.metricsPort are both %d: give the metrics port its own number" (int .Values.nginx.port)) }}
{{- end }}
{{- if and .Values.autoscaling.enabled (gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) }}
{{- fail (printf "autoscaling.minReplicas (%d) is larger than autoscaling.maxReplicas (%d)" (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) }}
{{- end }}
{{- if and .Values.autoscaling.enabled (not .Values.autoscaling.targetCPUUtilizationPercentage) (not .Values.autoscaling.podsMetric.enabled) }}
{{- fail "autoscaling.enabled needs a metric: set autoscaling.targetCPUUtilizationPercentage or enable autoscaling.podsMetric" }}
{{- end }}
{{- if and .Values.worker.enabled (not $s.redisUrl) }}
{{- fail "worker.enabled needs serving.redisUrl: the async workers consume the Redis job queue" }}
{{- end }}
{{- $settings := include "serving-core.settings" . | fromYaml }}
{{- range $var := .Values.extraEnv }}
{{- range $key, $setting := $settings }}
{{- if eq $var.name $setting.env }}
{{- fail (printf "extraEnv sets %s, which the chart sets from serving.%s: set serving.%s instead" $setting.env $key $key) }}
{{- end }}
{{- end }}
{{- if has $var.name (list "SERVING_BIND" "SERVING_METRICS_DIR") }}
{{- fail (printf "extraEnv sets %s, which the chart manages (gunicorn's socket and the metrics emptyDir): remove it" $var.name) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Environment of every container that runs serving-core (server, worker, batch).
*/}}
{{- define "serving-core.env" -}}
{{- $s := .Values.serving }}
{{- range $key, $setting := include "serving-core.settings" . | fromYaml }}
{{- $value := get $s $key }}
{{- if eq $setting.kind "int" }}
- name: {{ $setting.env }}
  value: {{ int64 $value | quote }}
{{- else if eq $setting.kind "auto" }}
{{- if gt (int64 $value) 0 }}
- name: {{ $setting.env }}
  value: {{ int64 $value | quote }}
{{- end }}
{{- else if eq $setting.kind "optional" }}
{{- if $value }}
- name: {{ $setting.env }}
  value: {{ $value | quote }}
{{- end }}
{{- else }}
- name: {{ $setting.env }}
  value: {{ toString $value | quote }}
{{- end }}
{{- end }}
- name: SERVING_BIND
  value: {{ include "serving-core.bind" . | quote }}
- name: SERVING_METRICS_DIR
  value: {{ include "serving-core.metricsDir" . | quote }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Pod-level settings shared by every workload of the release.
*/}}
{{- define "serving-core.podCommon" -}}
serviceAccountName: {{ include "serving-core.serviceAccountName" . }}
automountServiceAccountToken: {{ .Values.serviceAccount.automount }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
