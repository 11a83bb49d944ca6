{{/*
The stream worker (`serving-core stream`, docs/streams.md): names, its
settings, and how KEDA reads its source's backlog.
*/}}

{{/*
"<fullname>-stream" fits (fullname is at most 55 characters); its metrics
Service needs "-stream-metrics", so it cuts the full name further.
*/}}
{{- define "serving-core.streamName" -}}
{{- printf "%s-stream" (include "serving-core.fullname" .) }}
{{- end }}

{{- define "serving-core.streamMetricsName" -}}
{{- printf "%s-stream-metrics" (include "serving-core.fullname" . | trunc 48 | trimSuffix "-") }}
{{- end }}

{{/*
stream key -> SERVING_STREAM_* variable, as "serving-core.settings" does for
`serving`: a URL comes from its plain value, else from its Secret's key (a
URL may carry the broker's password). Set in the stream container only.
*/}}
{{- define "serving-core.streamSettings" -}}
source: {env: SERVING_STREAM_SOURCE, kind: optional, secret: sourceSecret}
sink: {env: SERVING_STREAM_SINK, kind: optional, secret: sinkSecret}
deadLetter: {env: SERVING_STREAM_DEAD_LETTER, kind: optional, secret: deadLetterSecret}
maxAttempts: {env: SERVING_STREAM_MAX_ATTEMPTS, kind: int}
{{- end }}

{{- define "serving-core.streamEnv" -}}
{{- $st := .Values.stream }}
{{- range $key, $setting := include "serving-core.streamSettings" . | fromYaml }}
{{- $value := get $st $key }}
{{- if eq $setting.kind "int" }}
- name: {{ $setting.env }}
  value: {{ int64 $value | quote }}
{{- else if $value }}
- name: {{ $setting.env }}
  value: {{ $value | quote }}
{{- else }}
{{- $secret := get $st $setting.secret }}
- name: {{ $setting.env }}
  valueFrom:
    secretKeyRef:
      name: {{ $secret.name | quote }}
      key: {{ $secret.key | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/*
A URL's query as a dict (name -> value; the last one wins), for the queue,
stream and group KEDA watches. Values are taken as written (Sprig has no
URL decoding): a name with %-escapes belongs in stream.keda.queueName or
stream.keda.stream.
*/}}
{{- define "serving-core.urlQuery" -}}
{{- $query := dict }}
{{- range $pair := splitList "&" (. | default "") }}
{{- if $pair }}
{{- $kv := splitn "=" 2 $pair }}
{{- $_ := set $query $kv._0 ($kv._1 | default "") }}
{{- end }}
{{- end }}
{{- toYaml $query }}
{{- end }}

{{/*
URL scheme -> the broker KEDA watches (stream.keda.broker's values, a branch
each in streamTrigger): the schemes of serving_core/stream/brokers.py's
BROKERS, those of one module on one broker (tests/deploy/test_chart_schemes.py
holds the two equal, and values.schema.json's patterns with them).
*/}}
{{- define "serving-core.streamSchemes" -}}
amqp: amqp
amqps: amqp
redis: redis
rediss: redis
unix: redis
kafka: kafka
kafkas: kafka
{{- end }}

{{/*
The broker KEDA watches: stream.keda.broker, else the broker of a plain
stream.source's scheme (streamSchemes); empty if neither.
*/}}
{{- define "serving-core.streamBroker" -}}
{{- $k := .Values.stream.keda }}
{{- $schemes := include "serving-core.streamSchemes" . | fromYaml }}
{{- $scheme := include "serving-core.urlScheme" .Values.stream.source }}
{{- if $k.broker }}{{ $k.broker }}
{{- else if $scheme }}{{ get $schemes $scheme }}
{{- end }}
{{- end }}

{{/*
The trigger's metadata, a YAML map of strings (KEDA's trigger metadata is
map[string]string). Nothing secret goes here: a plain source URL gives only
its queue, stream, group, host:port, db and TLS, never its user or password.
RabbitMQ, mode QueueLength over AMQP: the messages waiting in the queue, not
those already in a consumer's prefetch (KEDA's http protocol would count those
too, but needs the management port and its password). Redis: the group's
pending entries (XPENDING: delivered, not yet acked) or its lag (not yet
delivered, Redis 7+). Kafka: the consumer group's lag ("serving-core.kafkaTrigger",
in _stream-kafka.tpl).
*/}}
{{- define "serving-core.streamTrigger" -}}
{{- $k := .Values.stream.keda }}
{{- $source := .Values.stream.source }}
{{- $broker := include "serving-core.streamBroker" . }}
{{- $parsed := dict }}
{{- /* A Kafka URL's host list is not urlParse's: kafkaSource reads it. */}}
{{- if and $source (ne $broker "kafka") }}{{ $parsed = urlParse $source }}{{ end }}
{{- $query := include "serving-core.urlQuery" ($parsed.query | default "") | fromYaml }}
{{- if eq $broker "amqp" }}
type: rabbitmq
metadata:
  protocol: "amqp"
  mode: "QueueLength"
  queueName: {{ $k.queueName | default $query.queue | quote }}
  value: {{ int64 $k.target | toString | quote }}
  activationValue: {{ int64 $k.activationTarget | toString | quote }}
  {{- with $k.hostFromEnv }}
  hostFromEnv: {{ . | quote }}
  {{- end }}
{{- else if eq $broker "redis" }}
type: redis-streams
metadata:
  stream: {{ $k.stream | default $query.stream | quote }}
  consumerGroup: {{ $k.consumerGroup | default $query.group | default "serving-core" | quote }}
  {{ $k.redisMetric }}: {{ int64 $k.target | toString | quote }}
  activationLagCount: {{ int64 $k.activationTarget | toString | quote }}
  {{- if $k.address }}
  address: {{ $k.address | quote }}
  {{- else if $parsed.host }}
  address: {{ ternary $parsed.host (printf "%s:6379" $parsed.host) (contains ":" $parsed.host) | quote }}
  {{- end }}
  {{- with $k.passwordFromEnv }}
  passwordFromEnv: {{ . | quote }}
  {{- end }}
  {{- if and $parsed.host (not $k.address) }}
  databaseIndex: {{ trimPrefix "/" $parsed.path | default "0" | quote }}
  enableTLS: {{ eq $parsed.scheme "rediss" | toString | quote }}
  {{- else }}
  databaseIndex: {{ int64 $k.databaseIndex | toString | quote }}
  enableTLS: {{ $k.enableTLS | toString | quote }}
  {{- end }}
{{- else if eq $broker "kafka" }}
type: kafka
metadata:
  {{- include "serving-core.kafkaTrigger" . | nindent 2 }}
{{- end }}
{{- with $k.authenticationRef }}
authenticationRef:
  name: {{ . | quote }}
{{- end }}
{{- end }}

{{/*
The stream worker's rules beyond the schema; each message says what to change.
*/}}
{{- define "serving-core.validateStream" -}}
{{- $st := .Values.stream }}
{{- $k := $st.keda }}
{{- $settings := include "serving-core.streamSettings" . | fromYaml }}
{{- range $var := .Values.extraEnv }}
{{- range $key, $setting := $settings }}
{{- if eq $var.name $setting.env }}
{{- fail (printf "extraEnv sets %s, which the chart sets from stream.%s: set stream.%s instead" $setting.env $key $key) }}
{{- end }}
{{- end }}
{{- end }}
{{- range $key, $setting := $settings }}
{{- if $setting.secret }}
{{- $secret := get $st $setting.secret }}
{{- if and (get $st $key) $secret.name }}
{{- fail (printf "stream.%s and stream.%s.name (%s) are both set: keep one, the Secret when the URL carries a password" $key $setting.secret $secret.name) }}
{{- end }}
{{- if and $st.enabled (not (get $st $key)) (not $secret.name) }}
{{- fail (printf "stream.enabled needs stream.%s or stream.%s.name (a Secret whose key holds the URL): %s is required by `serving-core stream` (see docs/streams.md)" $key $setting.secret $setting.env) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and $k.enabled (not $st.enabled) }}
{{- fail "stream.keda.enabled scales the stream Deployment: set stream.enabled too" }}
{{- end }}
{{- if $k.enabled }}
{{- if gt (int $k.minReplicaCount) (int $k.maxReplicaCount) }}
{{- fail (printf "stream.keda.minReplicaCount (%d) is larger than stream.keda.maxReplicaCount (%d)" (int $k.minReplicaCount) (int $k.maxReplicaCount)) }}
{{- end }}
{{- $broker := include "serving-core.streamBroker" . }}
{{- $scheme := include "serving-core.urlScheme" $st.source }}
{{- $schemes := include "serving-core.streamSchemes" . | fromYaml }}
{{- if and $k.broker $scheme (ne $k.broker (get $schemes $scheme)) }}
{{- fail (printf "stream.keda.broker is %s, but stream.source is a %s:// URL: clear stream.keda.broker (the chart reads it from the URL) or fix it" $k.broker $scheme) }}
{{- end }}
{{- if not $broker }}
{{- fail "stream.keda.enabled needs the source's kind, which the chart cannot read from a Secret: set stream.keda.broker to amqp (RabbitMQ), redis (Redis Streams) or kafka (Kafka)" }}
{{- end }}
{{- $trigger := include "serving-core.streamTrigger" . | fromYaml }}
{{- if eq $broker "amqp" }}
{{- if not $trigger.metadata.queueName }}
{{- fail "stream.keda.enabled needs the RabbitMQ queue: set stream.keda.queueName (the queue= of the source URL)" }}
{{- end }}
{{- if and (not $k.hostFromEnv) (not $k.authenticationRef) }}
{{- fail "stream.keda.enabled with a RabbitMQ source needs how KEDA connects, which takes a password the chart never copies out of a Secret: set stream.keda.hostFromEnv (an env var of the stream container, e.g. extraEnv RABBITMQ_HOST from a Secret's key, holding amqp://USER:PASS@HOST:5672/VHOST) or stream.keda.authenticationRef (a TriggerAuthentication with the host)" }}
{{- end }}
{{- else if eq $broker "redis" }}
{{- if not $trigger.metadata.stream }}
{{- fail "stream.keda.enabled needs the Redis stream: set stream.keda.stream (the stream= of the source URL)" }}
{{- end }}
{{- if and (not $trigger.metadata.address) (not $k.authenticationRef) }}
{{- fail "stream.keda.enabled needs the source's Redis as KEDA reaches it (host:port, not a URL): set stream.keda.address (e.g. redis-master.stream.svc:6379) or stream.keda.authenticationRef; only a plain redis:// stream.source gives it by itself" }}
{{- end }}
{{- if and (regexMatch "^[a-z]+://[^@/]*:[^@/]*@" $st.source) (not $k.passwordFromEnv) (not $k.authenticationRef) }}
{{- fail "stream.source carries a password, which KEDA cannot take from the URL: move the URL to a Secret (stream.sourceSecret), put the password in an env var of the stream container (extraEnv from the Secret) and name it in stream.keda.passwordFromEnv (or use stream.keda.authenticationRef)" }}
{{- end }}
{{- else if eq $broker "kafka" }}
{{- include "serving-core.validateKafka" . }}
{{- end }}
{{- end }}
{{- end }}
