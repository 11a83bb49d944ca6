{{/*
Names and labels, after the `helm create` scaffold.
*/}}
{{- define "serving-core.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: "<release>-<chart>", or the release name when it already contains
the chart name. Truncated to 63 characters (DNS label) minus room for the
"-metrics" suffix of the metrics Service.
*/}}
{{- define "serving-core.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 55 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 55 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 55 | trimSuffix "-" }}
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
Selector labels of one component: call with (dict "ctx" $ "component" "server").
"server" labels the server pods and what selects them; the metrics Service is
"metrics", so the ServiceMonitor selects it and never the API Service.
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
Images. The app tag defaults to the chart's appVersion, which image.yml sets
to the release it packages (v1.2.3 -> 1.2.3, the tag image.yml gives that
commit's images). The in-repo Chart.yaml carries a placeholder appVersion no
image has: "serving-core.validate" refuses to render it, so an unpackaged
chart never deploys a tag nothing pushed. With a digest and no tag the
reference is repository@digest. The nginx image follows the app image:
image.yml pushes "<repo>" and "<repo>-nginx" with the same tags.
*/}}
{{- define "serving-core.unreleased" -}}0.0.0-unreleased{{- end }}

{{- define "serving-core.imageTag" -}}
{{- .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "serving-core.nginxImageTag" -}}
{{- .Values.nginx.image.tag | default (include "serving-core.imageTag" .) }}
{{- end }}

{{- /*
(dict "repository" R "tag" T "digest" D "ctx" $) -> R:T, R:T@D or R@D.
global.imageRegistry, when set, replaces R's registry as Bitnami charts do (a
mirror or pull-through cache): ghcr.io/acme/app becomes
<imageRegistry>/acme/app. R's first part is its registry when it has a "." or
":" or is localhost, as Docker reads a reference; otherwise R is a Docker Hub
path and the registry is put in front of it.
*/}}
{{- define "serving-core.imageRef" -}}
{{- $ref := .repository }}
{{- with dig "imageRegistry" "" (.ctx.Values.global | default dict) }}
{{- $parts := splitList "/" $ref }}
{{- $first := first $parts }}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) }}
{{- $ref = join "/" (rest $parts) }}
{{- end }}
{{- $ref = printf "%s/%s" (trimSuffix "/" .) $ref }}
{{- end }}
{{- if ne .tag (include "serving-core.unreleased" .ctx) }}{{ $ref = printf "%s:%s" $ref .tag }}{{ end }}
{{- if .digest }}{{ $ref = printf "%s@%s" $ref .digest }}{{ end }}
{{- $ref }}
{{- end }}

{{/*
Pull secrets of every pod: global.imagePullSecrets (names or {name: ...}, as
Bitnami charts take them) then imagePullSecrets, each name once. Nothing when
both are empty.
*/}}
{{- define "serving-core.imagePullSecrets" -}}
{{- $names := list }}
{{- range concat (dig "imagePullSecrets" list (.Values.global | default dict)) .Values.imagePullSecrets }}
{{- $name := "" }}
{{- if kindIs "string" . }}{{ $name = . }}{{ else }}{{ $name = .name }}{{ end }}
{{- if and $name (not (has $name $names)) }}{{ $names = append $names $name }}{{ end }}
{{- end }}
{{- if $names }}
imagePullSecrets:
{{- range $names }}
  - name: {{ . | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Where every pod of the release may run: the pod knobs of scheduling, the same
for the server, worker, batch and test pods (a GPU node pool's taint,
selector and runtime class apply to all of them).
*/}}
{{- define "serving-core.podScheduling" -}}
{{- with .Values.runtimeClassName }}
runtimeClassName: {{ . }}
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

{{- define "serving-core.image" -}}
{{- include "serving-core.imageRef" (dict "repository" .Values.image.repository "tag" (include "serving-core.imageTag" .) "digest" .Values.image.digest "ctx" .) }}
{{- end }}

{{- define "serving-core.exporterImage" -}}
{{- with .Values.nginx.exporter.image }}
{{- include "serving-core.imageRef" (dict "repository" .repository "tag" .tag "digest" .digest "ctx" $) }}
{{- end }}
{{- end }}

{{/*
The Prometheus job of the release's nginx exporter targets: the
ServiceMonitor relabels them from the metrics Service's name (the app's job,
<fullname>-metrics) to this, so the app's up series count the app only.
*/}}
{{- define "serving-core.nginxJob" -}}
{{- printf "%s-nginx" (include "serving-core.fullname" .) }}
{{- end }}

{{- define "serving-core.nginxImage" -}}
{{- $img := .Values.nginx.image }}
{{- $repo := $img.repository | default (printf "%s-nginx" .Values.image.repository) }}
{{- include "serving-core.imageRef" (dict "repository" $repo "tag" (include "serving-core.nginxImageTag" .) "digest" $img.digest "ctx" .) }}
{{- end }}

{{/*
The scheme of a URL ("" if it has none): what picks a backend's branch
(streamSchemes, jobsSchemes).
*/}}
{{- define "serving-core.urlScheme" -}}
{{- if contains "://" (. | default "") }}{{ regexReplaceAll "://.*$" . "" }}{{ end }}
{{- end }}

{{/*
Fixed paths shared by the templates. gunicorn listens on a unix socket in an
emptyDir that only the app and nginx containers mount: nothing else in the
cluster can reach gunicorn past nginx.
*/}}
{{- define "serving-core.socketDir" -}}/run/serving{{- end }}
{{- /* gRPC takes its host from SERVING_BIND (serving_core/settings), so with
grpc.enabled gunicorn binds the pod's loopback instead of its socket: only
nginx, in the same pod, reaches either port. */}}
{{- define "serving-core.bind" -}}
{{- if .Values.grpc.enabled }}127.0.0.1:8000{{ else }}unix:/run/serving/gunicorn.sock{{ end }}
{{- end }}
{{- define "serving-core.metricsDir" -}}/run/metrics{{- end }}
{{- /* serving.apiKeysSecret, mounted read-only without subPath (a subPath
mount would never see the Secret change); the file is its key's value. */}}
{{- define "serving-core.apiKeysDir" -}}/run/api-keys{{- end }}
{{- define "serving-core.apiKeysPath" -}}/run/api-keys/keys{{- end }}

{{/*
serving key -> SERVING_* variable and how to print it. Integers go through
int64 because Helm reads every number as a float (1048576 would print as
1.048576e+06). "auto" entries are left unset at 0 so serving-core resolves
them from the container's CPU limit; "optional" ones are left unset when empty
(the handler: the image's own SERVING_HANDLER, set from its HANDLER_DIR build
argument, is what runs; the batch policy: serving-core's default, which the
chart does not repeat). An optional entry with a "secret" key reads its value
from that Secret ({name, key} under `serving`) when the plain value is empty:
a Redis URL carries its password. With SERVING_BIND and SERVING_METRICS_DIR
below, these are every field of serving_core.settings.Settings
(tests/deploy/test_chart_settings.py checks).
*/}}
{{- define "serving-core.settings" -}}
handler: {env: SERVING_HANDLER, kind: optional}
workers: {env: SERVING_WORKERS, kind: auto}
workerClass: {env: SERVING_WORKER_CLASS, kind: string}
workerConnections: {env: SERVING_WORKER_CONNECTIONS, kind: int}
threads: {env: SERVING_THREADS, kind: auto}
maxBatchSize: {env: SERVING_MAX_BATCH_SIZE, kind: int}
lendCores: {env: SERVING_LEND_CORES, kind: string}
maxWaitMs: {env: SERVING_MAX_WAIT_MS, kind: number}
batchPolicy: {env: SERVING_BATCH_POLICY, kind: optional}
maxQueue: {env: SERVING_MAX_QUEUE, kind: auto}
requestTimeoutSeconds: {env: SERVING_REQUEST_TIMEOUT_S, kind: number}
maxTokens: {env: SERVING_MAX_TOKENS, kind: int}
generationTimeoutSeconds: {env: SERVING_GENERATION_TIMEOUT_S, kind: number}
maxBodyBytes: {env: SERVING_MAX_BODY_BYTES, kind: int}
maxJsonDepth: {env: SERVING_MAX_JSON_DEPTH, kind: int}
maxStringChars: {env: SERVING_MAX_STRING_CHARS, kind: int}
bodyTimeoutSeconds: {env: SERVING_BODY_TIMEOUT_S, kind: number}
trustedProxies: {env: SERVING_TRUSTED_PROXIES, kind: list}
drainSeconds: {env: SERVING_DRAIN_S, kind: number}
gracefulTimeoutSeconds: {env: SERVING_GRACEFUL_TIMEOUT_S, kind: number}
keepaliveSeconds: {env: SERVING_KEEPALIVE_S, kind: number}
maxRequests: {env: SERVING_MAX_REQUESTS, kind: int}
maxRequestsJitter: {env: SERVING_MAX_REQUESTS_JITTER, kind: auto}
maxRssBytes: {env: SERVING_MAX_RSS_BYTES, kind: int}
hangMarginSeconds: {env: SERVING_HANG_MARGIN_S, kind: number}
logLevel: {env: SERVING_LOG_LEVEL, kind: string}
logFormat: {env: SERVING_LOG_FORMAT, kind: string}
docsEnabled: {env: SERVING_DOCS_ENABLED, kind: string}
device: {env: SERVING_DEVICE, kind: string}
dtype: {env: SERVING_DTYPE, kind: string}
modelProcess: {env: SERVING_MODEL_PROCESS, kind: string}
modelProcesses: {env: SERVING_MODEL_PROCESSES, kind: int}
cacheUrl: {env: SERVING_CACHE_URL, kind: optional, secret: cacheUrlSecret}
cacheSize: {env: SERVING_CACHE_SIZE, kind: int}
cacheTtlSeconds: {env: SERVING_CACHE_TTL_S, kind: number}
cachePerKey: {env: SERVING_CACHE_PER_KEY, kind: string}
cacheHeader: {env: SERVING_CACHE_HEADER, kind: string}
payloadLogUrl: {env: SERVING_PAYLOAD_LOG_URL, kind: optional, secret: payloadLogUrlSecret}
payloadLogRate: {env: SERVING_PAYLOAD_LOG_RATE, kind: number}
payloadLogErrors: {env: SERVING_PAYLOAD_LOG_ERRORS, kind: string}
payloadLogRedact: {env: SERVING_PAYLOAD_LOG_REDACT, kind: list}
payloadLogQueue: {env: SERVING_PAYLOAD_LOG_QUEUE, kind: int}
modelRevision: {env: SERVING_MODEL_REVISION, kind: optional}
jobsEnabled: {env: SERVING_JOBS_ENABLED, kind: string}
jobsUrl: {env: SERVING_JOBS_URL, kind: optional, secret: jobsUrlSecret}
jobsPath: {env: SERVING_JOBS_PATH, kind: string}
jobsMaxQueue: {env: SERVING_JOBS_MAX_QUEUE, kind: int}
jobsMaxStored: {env: SERVING_JOBS_MAX_STORED, kind: int}
jobsMaxPerCaller: {env: SERVING_JOBS_MAX_PER_CALLER, kind: int}
jobsTtlSeconds: {env: SERVING_JOBS_TTL_S, kind: number}
jobsMaxAttempts: {env: SERVING_JOBS_MAX_ATTEMPTS, kind: int}
jobsLeaseSeconds: {env: SERVING_JOBS_LEASE_S, kind: number}
followupQueue: {env: SERVING_FOLLOWUP_QUEUE, kind: optional}
apiKeys: {env: SERVING_API_KEYS, kind: optional}
apiKeysFile: {env: SERVING_API_KEYS_FILE, kind: optional, secretFile: apiKeysSecret}
privateEndpoints: {env: SERVING_PRIVATE_ENDPOINTS, kind: string}
publicMetadata: {env: SERVING_PUBLIC_METADATA, kind: string}
corsOrigins: {env: SERVING_CORS_ORIGINS, kind: list}
pipelineWithoutKeys: {env: SERVING_PIPELINE_WITHOUT_KEYS, kind: string}
{{- end }}

{{/*
Checks that JSON Schema cannot express; each message says what to change.
*/}}
{{- define "serving-core.validate" -}}
{{- $s := .Values.serving }}
{{- if and (gt (int64 $s.maxQueue) 0) (lt (int64 $s.maxQueue) (int64 $s.maxBatchSize)) }}
{{- fail (printf "serving.maxQueue (%d) is smaller than serving.maxBatchSize (%d): raise serving.maxQueue so that a full batch can queue" (int64 $s.maxQueue) (int64 $s.maxBatchSize)) }}
{{- end }}
{{- if .Values.grpc.enabled }}
{{- if has (int .Values.grpc.nginxPort) (list (int .Values.nginx.port) (int .Values.nginx.metricsPort)) }}
{{- fail (printf "grpc.nginxPort (%d) is also nginx.port or nginx.metricsPort: gRPC (HTTP/2) needs a listener of its own" (int .Values.grpc.nginxPort)) }}
{{- end }}
{{- if has (int .Values.grpc.port) (list 8000 (int .Values.grpc.nginxPort) (int .Values.nginx.port) (int .Values.nginx.metricsPort)) }}
{{- fail (printf "grpc.port (%d) is taken in the pod (gunicorn's 127.0.0.1:8000, or an nginx port): give the app's gRPC port its own number" (int .Values.grpc.port)) }}
{{- end }}
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
{{- range $key, $setting := include "serving-core.settings" . | fromYaml }}
{{- if and $setting.secret (get $s $key) (get $s $setting.secret).name }}
{{- fail (printf "serving.%s and serving.%s.name (%s) are both set: keep one, the Secret when the URL carries a password" $key $setting.secret (get $s $setting.secret).name) }}
{{- end }}
{{- if and $setting.secretFile (get $s $key) (get $s $setting.secretFile).name }}
{{- fail (printf "serving.%s and serving.%s.name (%s) are both set: keep one; the Secret is mounted and names its own file" $key $setting.secretFile (get $s $setting.secretFile).name) }}
{{- end }}
{{- end }}
{{- include "serving-core.validateWorker" . }}
{{- include "serving-core.validateModel" . }}
{{- include "serving-core.validateRollout" . }}
{{- include "serving-core.validateStream" . }}
{{- include "serving-core.validateOtel" . }}
{{- $b := .Values.batch }}
{{- if and $b.enabled (not $b.args) }}
{{- fail "batch.enabled needs batch.args, the arguments of `serving-core batch`: at least [--input, <file or URL>, --output, <file or URL>]" }}
{{- end }}
{{- if and $b.enabled $b.schedule $b.runId }}
{{- fail (printf "batch.runId (%s) names a one-shot Job's run, but batch.schedule (%s) makes a CronJob, which runs on its schedule: clear batch.runId, or batch.schedule for a single run (or run the CronJob now: kubectl create job --from=cronjob/<name> <name>-manual)" $b.runId $b.schedule) }}
{{- end }}
{{- if and $b.enabled (gt (int64 $b.completions) 1) }}
{{- range $arg := $b.args }}
{{- if or (eq $arg "--shards") (hasPrefix "--shards=" $arg) (eq $arg "--shard") (hasPrefix "--shard=" $arg) }}
{{- fail (printf "batch.args has %s, but batch.completions (%d) shards the input already: the chart passes --shards %d and each pod reads its index from JOB_COMPLETION_INDEX; remove it" $arg (int64 $b.completions) (int64 $b.completions)) }}
{{- end }}
{{- end }}
{{- end }}
{{- $unreleased := include "serving-core.unreleased" . }}
{{- if and (eq (include "serving-core.imageTag" .) $unreleased) (not .Values.image.digest) }}
{{- fail (printf "image.tag is empty and this is the in-repo chart, whose appVersion (%s) is no image's tag: set image.tag to a tag image.yml pushed, sha-<full commit sha> for any pushed commit or 1.2.3 for release v1.2.3 (or install the chart image.yml packaged for a release, which defaults to that release's images)" $unreleased) }}
{{- end }}
{{- if and (eq (include "serving-core.nginxImageTag" .) $unreleased) (not .Values.nginx.image.digest) }}
{{- fail "the nginx image has no tag: set nginx.image.tag (or image.tag, which it follows) to a tag image.yml pushed, e.g. sha-<full commit sha> or 1.2.3" }}
{{- end }}
{{- with .Values.nginx.exporter }}
{{- if .enabled }}
{{- $taken := dict (toString $.Values.nginx.port) "nginx.port" (toString $.Values.nginx.metricsPort) "nginx.metricsPort" }}
{{- if $.Values.grpc.enabled }}
{{- $_ := set $taken (toString $.Values.grpc.nginxPort) "grpc.nginxPort" }}
{{- $_ = set $taken (toString $.Values.grpc.port) "grpc.port" }}
{{- end }}
{{- range $name, $port := dict "nginx.exporter.port" .port "nginx.exporter.statusPort" .statusPort }}
{{- with get $taken (toString $port) }}
{{- fail (printf "%s (%s) is also %s: the pod's containers share one network namespace, so give each port its own number" $name (toString $port) .) }}
{{- end }}
{{- $_ := set $taken (toString $port) $name }}
{{- end }}
{{- end }}
{{- end }}
{{- $n := .Values.nginx }}
{{- $spool := int64 (include "serving-core.nginxBytes" $n.bodySpoolSize) }}
{{- $tmp := int64 (include "serving-core.quantityBytes" .Values.tmpSizeLimit) }}
{{- if and (gt $spool 0) (ge $spool $tmp) }}
{{- $written := ternary $n.bodySpoolSize (printf "%d" $spool) (kindIs "string" $n.bodySpoolSize) }}
{{- fail (printf "nginx.bodySpoolSize (%s, %d bytes) does not fit under tmpSizeLimit (%s, %d bytes), the size of nginx's /tmp, where it spools those bodies beside its other temporary files: lower nginx.bodySpoolSize or raise tmpSizeLimit (nginx's sizes are binary: 128m is 128Mi, under 256Mi)" $written $spool .Values.tmpSizeLimit $tmp) }}
{{- end }}
{{- /* Every SERVING_* variable is a serving-core setting the chart already
sets (from `serving`, or SERVING_BIND / SERVING_METRICS_DIR); any other name
makes Settings refuse to start, so refuse it here, at install time. */}}
{{- $settings := include "serving-core.settings" . | fromYaml }}
{{- range $var := .Values.extraEnv }}
{{- range $key, $setting := $settings }}
{{- if eq $var.name $setting.env }}
{{- fail (printf "extraEnv sets %s, which the chart sets from serving.%s: set serving.%s instead" $setting.env $key $key) }}
{{- end }}
{{- end }}
{{- if has $var.name (list "SERVING_BIND" "SERVING_METRICS_DIR" "SERVING_GRPC_PORT") }}
{{- fail (printf "extraEnv sets %s, which the chart manages (gunicorn's socket, the metrics emptyDir, grpc.port): remove it" $var.name) }}
{{- end }}
{{- if hasPrefix "SERVING_" $var.name }}
{{- fail (printf "extraEnv sets %s, which is not a serving-core setting (serving-core would refuse to start): check the name against the serving values in values.yaml" $var.name) }}
{{- end }}
{{- if hasKey $.Values.pipeline.stageUrls $var.name }}
{{- fail (printf "extraEnv sets %s, which pipeline.stageUrls sets too: keep it in pipeline.stageUrls" $var.name) }}
{{- end }}
{{- end }}
{{- range $name, $url := .Values.pipeline.stageUrls }}
{{- if hasPrefix "SERVING_" $name }}
{{- fail (printf "pipeline.stageUrls sets %s, but SERVING_* names are serving-core's settings and no stage's url_env is one: use the name the pipeline file's url_env gives" $name) }}
{{- end }}
{{- end }}
{{- $np := .Values.networkPolicy }}
{{- if and (include "serving-core.egressLimited" .) (not $np.egress) }}
{{- $redis := list }}
{{- range $key := list "cacheUrl" "jobsUrl" }}
{{- $url := get $s $key }}
{{- if or (and $url (not (hasPrefix "unix:" $url))) (get $s (printf "%sSecret" $key)).name }}
{{- $redis = append $redis (printf "serving.%s" $key) }}
{{- end }}
{{- end }}
{{- if $redis }}
{{- fail (printf "networkPolicy.enabled with pipeline.stageUrls limits the server pods' egress to DNS and the stages, but %s needs Redis: add a rule for it to networkPolicy.egress, e.g. [{to: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: redis}}}], ports: [{port: 6379, protocol: TCP}]}]" (join " and " $redis)) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
"true" when the server pods' NetworkPolicy limits egress (empty otherwise): a
pipeline's stages (pipeline.stageUrls) or networkPolicy.egress rules make it
list what the pods may reach. Without either, egress stays open: a handler
may call anything.
*/}}
{{- define "serving-core.egressLimited" -}}
{{- $np := .Values.networkPolicy }}
{{- if and $np.enabled (or .Values.pipeline.stageUrls $np.egress) }}true{{ end }}
{{- end }}

{{/*
Environment of the containers that run serving-core: the server's app
container (call with (dict "ctx" $ "server" true): it also gets SERVING_BIND,
gunicorn's socket), the worker container (dict "ctx" $ "bind" "0.0.0.0:9090"
"workers" N: its health/metrics address, and its own SERVING_WORKERS unless N
is 0), the stream container (the same, plus "stream" true: its
SERVING_STREAM_* settings) and the batch container (dict "ctx" $), the same settings, so all run
the same handler the same way. "container" names the container for the
traces' k8s.container.name (_otel.tpl). A pipeline's stage URLs (pipeline.stageUrls,
sorted by name) come before extraEnv.
*/}}
{{- define "serving-core.env" -}}
{{- $s := deepCopy .ctx.Values.serving }}
{{- $_ := set $s "jobsEnabled" (include "serving-core.jobsEnabled" .ctx) }}
{{- if .workers }}{{ $_ = set $s "workers" .workers }}{{ end }}
{{- range $key, $setting := include "serving-core.settings" .ctx | fromYaml }}
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
{{- $secret := dict }}
{{- if $setting.secret }}{{ $secret = get $s $setting.secret }}{{ end }}
{{- if $value }}
- name: {{ $setting.env }}
  value: {{ $value | quote }}
{{- else if $secret.name }}
- name: {{ $setting.env }}
  valueFrom:
    secretKeyRef:
      name: {{ $secret.name | quote }}
      key: {{ $secret.key | quote }}
{{- else if and $setting.secretFile (get $s $setting.secretFile).name $.server }}
{{- /* Mounted in the server's app container only (deployment.yaml): the
worker and batch containers serve no API. */}}
- name: {{ $setting.env }}
  value: {{ include "serving-core.apiKeysPath" $.ctx | quote }}
{{- end }}
{{- else if eq $setting.kind "list" }}
{{- if $value }}
- name: {{ $setting.env }}
  value: {{ join "," $value | quote }}
{{- end }}
{{- else }}
- name: {{ $setting.env }}
  value: {{ toString $value | quote }}
{{- end }}
{{- end }}
{{- if .bind }}
- name: SERVING_BIND
  value: {{ .bind | quote }}
{{- else if .server }}
- name: SERVING_BIND
  value: {{ include "serving-core.bind" .ctx | quote }}
{{- end }}
{{- if and .server .ctx.Values.grpc.enabled }}
- name: SERVING_GRPC_PORT
  value: {{ int64 .ctx.Values.grpc.port | quote }}
{{- end }}
- name: SERVING_METRICS_DIR
  value: {{ include "serving-core.metricsDir" .ctx | quote }}
{{- if .stream }}
{{- include "serving-core.streamEnv" .ctx }}
{{- end }}
{{- include "serving-core.modelEnv" .ctx }}
{{- include "serving-core.otelEnv" . }}
{{- range $name, $url := .ctx.Values.pipeline.stageUrls }}
- name: {{ $name }}
  value: {{ $url | quote }}
{{- end }}
{{- with .ctx.Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Environment of the nginx container. The serving-core-nginx image's entrypoint
(nginx/entrypoint.sh, which documents and checks each) renders its configuration
from these at start, the same templates the image runs everywhere else, so the
chart keeps no copy of nginx.conf; a changed value changes the pod template and
rolls the pods.
The SERVING_* names carry the app's own values: nginx derives its body limit,
proxy timeouts and upstream keep-alive from them.
*/}}
{{- define "serving-core.nginxEnv" -}}
{{- $s := .Values.serving }}
{{- $n := .Values.nginx }}
- name: NGINX_UPSTREAM
  value: {{ include "serving-core.bind" . | quote }}
- name: NGINX_PORT
  value: {{ int64 $n.port | quote }}
{{- if .Values.grpc.enabled }}
- name: NGINX_GRPC_PORT
  value: {{ int64 .Values.grpc.nginxPort | quote }}
- name: NGINX_GRPC_UPSTREAM
  value: {{ printf "127.0.0.1:%d" (int64 .Values.grpc.port) | quote }}
{{- end }}
- name: NGINX_METRICS_PORT
  value: {{ int64 $n.metricsPort | quote }}
- name: SERVING_MAX_BODY_BYTES
  value: {{ int64 $s.maxBodyBytes | quote }}
- name: SERVING_REQUEST_TIMEOUT_S
  value: {{ toString $s.requestTimeoutSeconds | quote }}
- name: SERVING_GENERATION_TIMEOUT_S
  value: {{ toString $s.generationTimeoutSeconds | quote }}
- name: SERVING_KEEPALIVE_S
  value: {{ toString $s.keepaliveSeconds | quote }}
- name: NGINX_UPSTREAM_KEEPALIVE
  value: {{ int64 $n.upstreamKeepalive | quote }}
- name: NGINX_UPSTREAM_MAX_CONNS
  value: {{ include "serving-core.upstreamMaxConns" . | quote }}
- name: NGINX_WORKER_PROCESSES
  value: {{ toString $n.workerProcesses | quote }}
- name: NGINX_WORKER_CONNECTIONS
  value: {{ int64 $n.workerConnections | quote }}
- name: NGINX_CONN_LIMIT_PER_CLIENT
  value: {{ int64 $n.connLimitPerClient | quote }}
- name: NGINX_BODY_SPOOL_BYTES
  {{- /* A YAML number is a float to Helm: int64 keeps 134217728 from becoming 1.34217728e+08. */}}
  {{- if kindIs "string" $n.bodySpoolSize }}
  value: {{ $n.bodySpoolSize | quote }}
  {{- else }}
  value: {{ int64 $n.bodySpoolSize | quote }}
  {{- end }}
- name: NGINX_CLIENT_TIMEOUT_S
  value: {{ int64 $n.clientTimeoutSeconds | quote }}
- name: NGINX_KEEPALIVE_TIMEOUT_S
  value: {{ int64 $n.keepaliveTimeoutSeconds | quote }}
- name: NGINX_RATE_LIMIT_RPS
  value: {{ int64 $n.rateLimit.requestsPerSecond | quote }}
- name: NGINX_RATE_LIMIT_BURST
  value: {{ int64 $n.rateLimit.burst | quote }}
{{- with $n.trustedProxies }}
- name: NGINX_TRUSTED_PROXIES
  value: {{ join "," . | quote }}
{{- end }}
- name: NGINX_LOG_LEVEL
  value: {{ $n.logLevel | quote }}
{{- if $n.exporter.enabled }}
- name: NGINX_STATUS_PORT
  value: {{ int64 $n.exporter.statusPort | quote }}
{{- end }}
{{- end }}

{{/*
The app container's startup and liveness probes: `serving-core healthcheck`
run inside it asks gunicorn on its unix socket (SERVING_BIND), which an
httpGet probe cannot reach. Going to the app directly means an nginx failure
fails only nginx's own probes and never restarts the model container. The
client's own timeout is a second under the kubelet's, which leaves Python
room to start: ~0.1 s idle, up to ~1.8 s in a container throttled at its CPU
limit (bench/probes.py), which is why readiness, the probe that runs every
5 s under load, is an httpGet instead (deployment.yaml).
Call with (dict "path" "/healthz" "probe" .Values.probes.liveness).
*/}}
{{- define "serving-core.appProbe" -}}
exec:
  command:
    - serving-core
    - healthcheck
    - --path
    - {{ .path }}
    - --timeout-s
    - {{ sub (int64 .probe.timeoutSeconds) 1 | quote }}
{{ toYaml .probe }}
{{- end }}

{{/*
Batch names. A CronJob's name must leave room for the 11-character suffix of
the Jobs it creates (52 characters); a one-shot Job's name carries the run's
identity instead (batch.yaml): a hash of its spec and batch.runId.
*/}}
{{- define "serving-core.batchName" -}}
{{- printf "%s-batch" (include "serving-core.fullname" . | trunc 46 | trimSuffix "-") }}
{{- end }}

{{/*
The batch command: `serving-core batch` with batch.args, and with more than
one completion `--shards <completions>`: each pod of the Indexed Job reads its
own index from JOB_COMPLETION_INDEX, which Kubernetes sets in every pod, so
the pods split one input with no overlap and no gap.
*/}}
{{- define "serving-core.batchArgs" -}}
{{- $b := .Values.batch }}
{{- $args := list }}
{{- range $b.args }}{{ $args = append $args (toString .) }}{{ end }}
{{- if gt (int64 $b.completions) 1 }}
{{- $args = concat $args (list "--shards" (toString (int64 $b.completions))) }}
{{- end }}
{{- toYaml $args }}
{{- end }}

{{/*
The Job spec that batch.yaml renders as a Job, or inside a CronJob's
jobTemplate: an Indexed Job of batch.completions pods, batch.parallelism at a
time, running the server's image, handler, settings and pod knobs without
nginx, Service or probes.

restartPolicy is Never: a failed pod stays for its logs and the Job starts a
new one, maybe on another node, up to backoffLimit times; the command is
resumable, so the new pod skips what the failed one wrote. (OnFailure would
restart the container in place, hiding a node's fault, and a Job that hits its
backoffLimit deletes those pods with their logs.) Never also allows the
podFailurePolicy, which by default does not count evictions and preemptions
(a node drain) against backoffLimit.
*/}}
{{- define "serving-core.batchJobSpec" -}}
{{- $b := .Values.batch }}
completionMode: Indexed
completions: {{ int64 $b.completions }}
parallelism: {{ int64 $b.parallelism }}
backoffLimit: {{ int64 $b.backoffLimit }}
{{- /* Helm merges a {} over the default policy's map, so none is {rules: []} (or null). */}}
{{- if dig "rules" list ($b.podFailurePolicy | default dict) }}
{{- with $b.podFailurePolicy }}
podFailurePolicy:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
{{- if gt (int64 $b.activeDeadlineSeconds) 0 }}
activeDeadlineSeconds: {{ int64 $b.activeDeadlineSeconds }}
{{- end }}
template:
  metadata:
    {{- with .Values.podAnnotations }}
    annotations:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    labels:
      {{- include "serving-core.labels" . | nindent 6 }}
      app.kubernetes.io/component: batch
      {{- include "serving-core.revisionLabel" . | nindent 6 }}
      {{- with .Values.podLabels }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
  spec:
    restartPolicy: Never
    serviceAccountName: {{ include "serving-core.serviceAccountName" . }}
    automountServiceAccountToken: {{ .Values.serviceAccount.automount }}
    {{- with include "serving-core.imagePullSecrets" . | trim }}{{ . | nindent 4 }}{{ end }}
    {{- with .Values.podSecurityContext }}
    securityContext:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- with include "serving-core.podScheduling" . | trim }}{{ . | nindent 4 }}{{ end }}
    {{- with include "serving-core.modelInitContainers" . | trim }}
    initContainers:
      {{- . | nindent 6 }}
    {{- end }}
    containers:
      - name: batch
        image: {{ include "serving-core.image" . | quote }}
        imagePullPolicy: {{ .Values.image.pullPolicy }}
        command: ["serving-core", "batch"]
        args:
          {{- include "serving-core.batchArgs" . | nindent 10 }}
        env:
          {{- include "serving-core.env" (dict "ctx" . "container" "batch") | trim | nindent 10 }}
        {{- with .Values.envFrom }}
        envFrom:
          {{- toYaml . | nindent 10 }}
        {{- end }}
        {{- with ($b.resources | default .Values.resources) }}
        resources:
          {{- toYaml . | nindent 10 }}
        {{- end }}
        {{- with .Values.securityContext }}
        securityContext:
          {{- toYaml . | nindent 10 }}
        {{- end }}
        volumeMounts:
          - name: metrics
            mountPath: {{ include "serving-core.metricsDir" . }}
          - name: tmp
            mountPath: /tmp
          {{- with include "serving-core.modelMount" . | trim }}{{ . | nindent 10 }}{{ end }}
          {{- with concat .Values.extraVolumeMounts $b.extraVolumeMounts }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
    volumes:
      # The root filesystem is read-only: Prometheus' multiprocess files and
      # /tmp are emptyDirs, as in the server pods.
      - name: metrics
        emptyDir:
          medium: Memory
          sizeLimit: 64Mi
      - name: tmp
        emptyDir:
          sizeLimit: {{ .Values.tmpSizeLimit }}
      {{- with include "serving-core.modelVolumes" . | trim }}{{ . | nindent 6 }}{{ end }}
      {{- with concat .Values.extraVolumes $b.extraVolumes }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
{{- end }}

{{/*
Sizes in bytes, to compare them. nginxBytes: nginx.bodySpoolSize, a number of
bytes or an nginx size, whose k, m and g are binary in either case (as
nginx/entrypoint.sh reads NGINX_BODY_SPOOL_BYTES). quantityBytes: a Kubernetes
quantity as values.schema.json takes them (Ki, Mi, Gi binary; k, M, G
decimal), e.g. tmpSizeLimit. Digits are read in base 10, as both do.
*/}}
{{- define "serving-core.nginxBytes" -}}
{{- if kindIs "string" . }}
{{- $units := dict "" 1 "k" 1024 "m" 1048576 "g" 1073741824 }}
{{- $unit := regexFind "[a-z]$" (lower .) }}
{{- if not (hasKey $units $unit) }}{{ fail (printf "%s is not an nginx size: write bytes, or a number and k, m or g" .) }}{{ end }}
{{- mul (atoi (trimSuffix $unit (lower .))) (get $units $unit) }}
{{- else }}{{ int64 . }}
{{- end }}
{{- end }}

{{- define "serving-core.quantityBytes" -}}
{{- $units := dict "" 1 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "k" 1000 "M" 1000000 "G" 1000000000 }}
{{- $unit := regexFind "[a-zA-Z]+$" (toString .) }}
{{- if not (hasKey $units $unit) }}{{ fail (printf "%s: the chart reads a size as a number and Ki, Mi, Gi, k, M or G" .) }}{{ end }}
{{- mul (atoi (trimSuffix $unit (toString .))) (get $units $unit) }}
{{- end }}

{{/*
nginx.upstreamMaxConns, "auto" resolved: what the app can hold at once, workers x
(maxQueue + maxBatchSize), as the app resolves them (maxQueue 0 is twice the
batch). workers 0 is what serving_core/cores.py usable_cores() reads from the
cgroup quota the kubelet derives from the CPU limit: the limit rounded down,
at least 1 (1500m -> 1, 500m -> 1, 3.7 -> 3). Rounding up would let nginx pass
twice what a 1500m pod holds. The app also caps it at the node's cores, which
a limit larger than the node would lower: the chart cannot see the node. 0
(off) when the workers cannot be known here: no serving.workers and no CPU
limit.
*/}}
{{- define "serving-core.upstreamMaxConns" -}}
{{- $s := .Values.serving -}}
{{- $set := .Values.nginx.upstreamMaxConns -}}
{{- if eq (toString $set) "auto" -}}
{{- $workers := int64 $s.workers -}}
{{- if eq $workers 0 -}}
{{- $cpu := toString (dig "limits" "cpu" "" (.Values.resources | default dict)) -}}
{{- if hasSuffix "m" $cpu -}}
{{- $workers = max 1 (int64 (floor (divf (float64 (trimSuffix "m" $cpu)) 1000))) -}}
{{- else if $cpu -}}
{{- $workers = max 1 (int64 (floor (float64 $cpu))) -}}
{{- end -}}
{{- end -}}
{{- $batch := int64 $s.maxBatchSize -}}
{{- $queue := int64 $s.maxQueue | default (mul 2 $batch) -}}
{{- mul $workers (add $queue $batch) -}}
{{- else -}}
{{- int64 $set -}}
{{- end -}}
{{- end }}
