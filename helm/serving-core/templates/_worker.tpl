{{/*
The job queue and its worker (`serving-core worker`, docs/jobs.md): whether
the pods take jobs, the worker's names, and how KEDA reads the queue's length.
*/}}

{{/*
SERVING_JOBS_ENABLED of the pods: serving.jobsEnabled when set (true or
false), else worker.enabled: POST /jobs is on exactly when this release runs
workers for it. A null in values.yaml reaches the templates as a missing key.
*/}}
{{- define "serving-core.jobsEnabled" -}}
{{- $value := .Values.serving.jobsEnabled }}
{{- if kindIs "bool" $value }}{{ $value }}{{ else }}{{ .Values.worker.enabled }}{{ end }}
{{- end }}

{{/*
Worker names. "<fullname>-worker" fits (fullname is at most 55 characters);
its metrics Service needs "-worker-metrics", so it cuts the full name further.
*/}}
{{- define "serving-core.workerName" -}}
{{- printf "%s-worker" (include "serving-core.fullname" .) }}
{{- end }}

{{- define "serving-core.workerMetricsName" -}}
{{- printf "%s-worker-metrics" (include "serving-core.fullname" . | trunc 48 | trimSuffix "-") }}
{{- end }}

{{/*
The Redis stream of the worker's queue, as serving_core/jobs/redis/queue.py
names it: the queue (the handler's name) in braces, a Redis Cluster hash tag.
*/}}
{{- define "serving-core.workerStream" -}}
{{- printf "serving-core:jobs:{%s}:stream" .Values.worker.queue }}
{{- end }}

{{/*
serving.jobsUrl's scheme -> the KEDA scaler that reads its queue's length (a
branch each in jobsTrigger and validateWorker): the schemes of
serving_core/jobs/backends.py's BACKENDS that name a queue every pod shares,
those of one backend on one scaler (tests/deploy/test_chart_schemes.py holds
the two equal, and values.schema.json's serving.jobsUrl pattern with them).
The empty URL and sqlite:// are a SQLite file in each pod, which no worker
shares and KEDA cannot read.
*/}}
{{- define "serving-core.jobsSchemes" -}}
redis: redis-streams
rediss: redis-streams
unix: redis-streams
{{- end }}

{{/*
The scaler of the queue: that of a plain serving.jobsUrl's scheme
(jobsSchemes). The URL in a Secret (serving.jobsUrlSecret) is not the
chart's to read, so it takes the one scaler of every scheme; a second scaler
needs a worker.keda value naming it, as stream.keda.broker does (the schemes
test fails until then).
*/}}
{{- define "serving-core.jobsScaler" -}}
{{- $schemes := include "serving-core.jobsSchemes" . | fromYaml }}
{{- $scheme := include "serving-core.urlScheme" .Values.serving.jobsUrl }}
{{- if $scheme }}{{ get $schemes $scheme }}
{{- else }}{{ values $schemes | uniq | first }}
{{- end }}
{{- end }}

{{/*
How KEDA reaches the queue's Redis, as a YAML map of the trigger's connection
metadata: worker.keda.address or addressFromEnv when set, else host:port,
database and TLS taken from a plain serving.jobsUrl (a unix:// one has no
host KEDA could reach); with jobsUrlSecret (a URL KEDA cannot read) the keda
values say it. Every value is a string: KEDA's trigger metadata is
map[string]string.
*/}}
{{- define "serving-core.kedaConnection" -}}
{{- $k := .Values.worker.keda }}
{{- $url := .Values.serving.jobsUrl }}
{{- $parsed := dict }}
{{- if $url }}{{ $parsed = urlParse $url }}{{ end }}
{{- if $k.address }}
address: {{ $k.address | quote }}
{{- else if $k.addressFromEnv }}
addressFromEnv: {{ $k.addressFromEnv | quote }}
{{- else if $parsed.host }}
address: {{ ternary $parsed.host (printf "%s:6379" $parsed.host) (contains ":" $parsed.host) | quote }}
{{- end }}
{{- with $k.usernameFromEnv }}
usernameFromEnv: {{ . | quote }}
{{- end }}
{{- with $k.passwordFromEnv }}
passwordFromEnv: {{ . | quote }}
{{- end }}
{{- if $parsed.host }}
databaseIndex: {{ trimPrefix "/" $parsed.path | default "0" | quote }}
enableTLS: {{ eq $parsed.scheme "rediss" | toString | quote }}
{{- else }}
databaseIndex: {{ int64 $k.databaseIndex | toString | quote }}
enableTLS: {{ $k.enableTLS | toString | quote }}
{{- end }}
{{- end }}

{{/*
The worker ScaledObject's trigger. redis-streams in streamLength mode: XLEN
of the queue's stream. serving-core acks and deletes each finished entry, so
XLEN is exactly the jobs queued or running: the lag. No consumerGroup in the
metadata: KEDA reads a consumerGroup as a switch to its pendingEntriesCount
(or lagCount) mode, which would count only the jobs being run (or only those
not yet taken).
*/}}
{{- define "serving-core.jobsTrigger" -}}
{{- $k := .Values.worker.keda }}
{{- $scaler := include "serving-core.jobsScaler" . }}
{{- if eq $scaler "redis-streams" }}
type: redis-streams
metadata:
  stream: {{ include "serving-core.workerStream" . | quote }}
  streamLength: {{ int64 $k.streamLength | toString | quote }}
  activationLagCount: {{ int64 $k.activationLagCount | toString | quote }}
  {{- include "serving-core.kedaConnection" . | trim | nindent 2 }}
{{- end }}
{{- with $k.authenticationRef }}
authenticationRef:
  name: {{ . | quote }}
{{- end }}
{{- end }}

{{/*
The worker's rules beyond the schema; each message says what to change.
*/}}
{{- define "serving-core.validateWorker" -}}
{{- $w := .Values.worker }}
{{- $s := .Values.serving }}
{{- $k := $w.keda }}
{{- if and $w.enabled (not $s.jobsUrl) (not $s.jobsUrlSecret.name) }}
{{- fail "worker.enabled needs a job queue every pod shares: set serving.jobsUrl (redis://HOST:6379/0) or serving.jobsUrlSecret.name (a Secret whose key holds that URL). Without one each pod keeps its own SQLite queue, and the workers would never see the jobs the server's pods accept" }}
{{- end }}
{{- if and $k.enabled (not $w.enabled) }}
{{- fail "worker.keda.enabled scales the worker Deployment: set worker.enabled too" }}
{{- end }}
{{- if and $k.enabled (not $w.queue) }}
{{- fail "worker.keda.enabled needs worker.queue, the name of the handler the image runs (its Handler class's `name`, e.g. all-minilm-l6-v2): KEDA watches the Redis stream serving-core:jobs:{<queue>}:stream" }}
{{- end }}
{{- if and $k.enabled (gt (int $k.minReplicaCount) (int $k.maxReplicaCount)) }}
{{- fail (printf "worker.keda.minReplicaCount (%d) is larger than worker.keda.maxReplicaCount (%d)" (int $k.minReplicaCount) (int $k.maxReplicaCount)) }}
{{- end }}
{{- if and $k.address $k.addressFromEnv }}
{{- fail "worker.keda.address and worker.keda.addressFromEnv are both set: keep one" }}
{{- end }}
{{- if $k.enabled }}
{{- $scaler := include "serving-core.jobsScaler" . }}
{{- if eq $scaler "redis-streams" }}
{{- $connection := include "serving-core.kedaConnection" . | fromYaml }}
{{- if and (not $connection.address) (not $connection.addressFromEnv) (not $k.authenticationRef) }}
{{- fail "worker.keda.enabled needs the queue's Redis as KEDA reaches it (host:port, not a URL): set worker.keda.address (e.g. redis-master.queue.svc:6379), worker.keda.addressFromEnv (an env var of the worker holding host:port) or worker.keda.authenticationRef (a TriggerAuthentication with the address); only a plain redis:// or rediss:// serving.jobsUrl gives it by itself" }}
{{- end }}
{{- if and (regexMatch "^[a-z]+://[^@/]*:[^@/]*@" $s.jobsUrl) (not $k.passwordFromEnv) (not $k.authenticationRef) }}
{{- fail "serving.jobsUrl carries a password, which KEDA cannot take from the URL: move the URL to a Secret (serving.jobsUrlSecret), put the password in an env var of the worker (extraEnv from the Secret) and name it in worker.keda.passwordFromEnv (or use worker.keda.authenticationRef)" }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
