{{/*
KEDA's kafka scaler for a kafka:// or kafkas:// stream source (the branches
of "serving-core.streamTrigger" and "serving-core.validateStream").
*/}}

{{/*
A plain Kafka source URL's parts, as serving_core/stream/kafka/config.py reads
kafka[s]://[USER:PASS@]HOST:PORT[,HOST:PORT...]/TOPIC[?QUERY]: a YAML map, empty
when the URL is not of that form or stream.source is empty. Not urlParse: Go's
url.Parse takes a host list only while its last entry has a port, and its error
would quote the URL, password and all. The user info is reported as there or
not, never copied.
*/}}
{{- define "serving-core.kafkaSource" -}}
{{- $url := .Values.stream.source | default "" }}
{{- $form := "^([a-z]+)://(([^/?]*)@)?([^@/?]+)/([^?]*)(\\?(.*))?$" }}
{{- if regexMatch $form $url }}
scheme: {{ regexReplaceAll $form $url "${1}" | toJson }}
userInfo: {{ ne (regexReplaceAll $form $url "${2}") "" }}
servers: {{ regexReplaceAll $form $url "${4}" | toJson }}
topic: {{ regexReplaceAll $form $url "${5}" | toJson }}
query: {{ regexReplaceAll $form $url "${7}" | toJson }}
{{- end }}
{{- end }}

{{/*
How KEDA authenticates, as a YAML map {sasl, tls}: KEDA's sasl mode and tls
("enable" or empty). From stream.keda.sasl and enableTLS, else from a plain
source: its effective security.protocol (the query's, else kafkas:// for TLS and
user info for SASL, as the worker's own config does) and its sasl.mechanism
(PLAIN unless the query says otherwise). "unknown:<mechanism>" when KEDA has no
mode for it.
*/}}
{{- define "serving-core.kafkaSecurity" -}}
{{- $k := .Values.stream.keda }}
{{- $url := include "serving-core.kafkaSource" . | fromYaml }}
{{- $query := include "serving-core.urlQuery" ($url.query | default "") | fromYaml }}
{{- $tlsScheme := eq ($url.scheme | default "") "kafkas" }}
{{- $derived := ternary "SSL" "PLAINTEXT" $tlsScheme }}
{{- if $url.userInfo }}{{ $derived = ternary "SASL_SSL" "SASL_PLAINTEXT" $tlsScheme }}{{ end }}
{{- $protocol := get $query "security.protocol" | default $derived | upper }}
{{- $modes := dict "PLAIN" "plaintext" "SCRAM-SHA-256" "scram_sha256" "SCRAM-SHA-512" "scram_sha512" "GSSAPI" "gssapi" "OAUTHBEARER" "oauthbearer" }}
{{- $sasl := "" }}
{{- if hasPrefix "SASL_" $protocol }}
{{- $mechanism := get $query "sasl.mechanism" | default "PLAIN" | upper }}
{{- $sasl = get $modes $mechanism | default (printf "unknown:%s" $mechanism) }}
{{- end }}
sasl: {{ $k.sasl | default $sasl | toJson }}
tls: {{ ternary "enable" "" (or $k.enableTLS (has $protocol (list "SSL" "SASL_SSL"))) | toJson }}
{{- end }}

{{/*
KEDA's offsetResetPolicy: the consumer's auto.offset.reset (librdkafka's names
for each end taken), earliest when the URL does not set it, as the worker's
default. The two must agree: for a partition the group has not committed yet,
KEDA counts the lag the consumer will read. With earliest that is the whole
partition; with latest, none of it (KEDA keeps one pod active), so a latest
here over an earliest consumer would leave a new group's backlog to one pod.
"unknown:<value>" when KEDA has no policy for it.
*/}}
{{- define "serving-core.kafkaOffsetReset" -}}
{{- $url := include "serving-core.kafkaSource" . | fromYaml }}
{{- $query := include "serving-core.urlQuery" ($url.query | default "") | fromYaml }}
{{- $reset := get $query "auto.offset.reset" | default "earliest" }}
{{- if has $reset (list "earliest" "smallest" "beginning") }}earliest
{{- else if has $reset (list "latest" "largest" "end") }}latest
{{- else }}unknown:{{ $reset }}
{{- end }}
{{- end }}

{{/*
The kafka trigger's metadata. lagThreshold is the group's lag (summed over the
topic's partitions) per pod; KEDA runs no more pods than the topic has
partitions unless allowIdleConsumers. Credentials come only from
stream.keda.authenticationRef: the chart sets the SASL mode and TLS, never a
user or password.
*/}}
{{- define "serving-core.kafkaTrigger" -}}
{{- $k := .Values.stream.keda }}
{{- $url := include "serving-core.kafkaSource" . | fromYaml }}
{{- $query := include "serving-core.urlQuery" ($url.query | default "") | fromYaml }}
{{- $security := include "serving-core.kafkaSecurity" . | fromYaml }}
bootstrapServers: {{ $k.bootstrapServers | default $url.servers | default "" | quote }}
consumerGroup: {{ $k.consumerGroup | default $query.group | default "serving-core" | quote }}
topic: {{ $k.topic | default $url.topic | default "" | quote }}
lagThreshold: {{ int64 $k.target | toString | quote }}
activationLagThreshold: {{ int64 $k.activationTarget | toString | quote }}
offsetResetPolicy: {{ include "serving-core.kafkaOffsetReset" . | quote }}
allowIdleConsumers: {{ $k.allowIdleConsumers | toString | quote }}
limitToPartitionsWithLag: {{ $k.limitToPartitionsWithLag | toString | quote }}
excludePersistentLag: {{ $k.excludePersistentLag | toString | quote }}
{{- with $security.sasl }}
sasl: {{ . | quote }}
{{- end }}
{{- with $security.tls }}
tls: {{ . | quote }}
{{- end }}
{{- end }}

{{/*
The kafka trigger's rules (validateStream's branch); each message says what to set.
*/}}
{{- define "serving-core.validateKafka" -}}
{{- $st := .Values.stream }}
{{- $k := $st.keda }}
{{- $form := "kafka[s]://[USER:PASS@]HOST:PORT[,HOST:PORT...]/TOPIC[?group=NAME][&PROPERTY=VALUE...]" }}
{{- $url := include "serving-core.kafkaSource" . | fromYaml }}
{{- if and $st.source (not $url) }}
{{- fail (printf "stream.source is not %s, which serving-core stream and KEDA both read: fix it" $form) }}
{{- end }}
{{- $trigger := (include "serving-core.kafkaTrigger" . | fromYaml) }}
{{- $server := "[^\\s,:/@]+:[0-9]{1,5}" }}
{{- if not $trigger.bootstrapServers }}
{{- fail "stream.keda.enabled needs the Kafka brokers: set stream.keda.bootstrapServers (HOST:PORT[,HOST:PORT...], the host list of the source URL)" }}
{{- end }}
{{- if not (regexMatch (printf "^%s(,%s)*$" $server $server) $trigger.bootstrapServers) }}
{{- fail (printf "stream.source's brokers (%s) are not HOST:PORT[,HOST:PORT...]: give each its port; stream.source is %s" $trigger.bootstrapServers $form) }}
{{- end }}
{{- if not (regexMatch "^[A-Za-z0-9._-]{1,249}$" $trigger.topic) }}
{{- fail (printf "stream.keda.enabled needs the Kafka topic (letters, digits, '.', '_', '-'), not %q: set stream.keda.topic (the path of the source URL)" $trigger.topic) }}
{{- end }}
{{- if hasPrefix "unknown:" $trigger.offsetResetPolicy }}
{{- fail (printf "stream.source's auto.offset.reset=%s has no KEDA offsetResetPolicy: use earliest (the default) or latest" (trimPrefix "unknown:" $trigger.offsetResetPolicy)) }}
{{- end }}
{{- if hasPrefix "unknown:" ($trigger.sasl | default "") }}
{{- fail (printf "stream.source's sasl.mechanism=%s has no KEDA sasl mode: use PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, GSSAPI or OAUTHBEARER" (trimPrefix "unknown:" $trigger.sasl)) }}
{{- end }}
{{- if and $trigger.sasl (not $k.authenticationRef) }}
{{- fail (printf "stream.keda.enabled with a SASL Kafka source (sasl %s) needs KEDA's username and password, which the chart never copies out of a URL or a Secret: set stream.keda.authenticationRef (a TriggerAuthentication whose secretTargetRef gives username and password)" $trigger.sasl) }}
{{- end }}
{{- if and $k.allowIdleConsumers $k.limitToPartitionsWithLag }}
{{- fail "stream.keda.allowIdleConsumers and stream.keda.limitToPartitionsWithLag are both true, which KEDA refuses: keep one" }}
{{- end }}
{{- end }}
