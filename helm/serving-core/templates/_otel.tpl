{{/*
OpenTelemetry traces (otel.*, docs/deployment/tracing.md): serving-core's
SERVING_TRACES=otlp and OpenTelemetry's own OTEL_* variables, which its SDK
reads, in every container that runs the handler (server, worker, stream,
batch: "serving-core.env" includes this), so their spans join one trace and
each says which release, pod, container and model revision made it.
*/}}

{{/*
The variables the chart sets from otel.*, which extraEnv and otel.extraEnv
may not set again (a second entry of a name silently wins in Kubernetes).
K8S_POD_NAME and K8S_NAMESPACE_NAME come from the downward API, for
OTEL_RESOURCE_ATTRIBUTES' $(...) references, which Kubernetes expands from
variables defined before it in the same container.
*/}}
{{- define "serving-core.otelNames" -}}
{{- list "SERVING_TRACES" "OTEL_EXPORTER_OTLP_ENDPOINT" "OTEL_EXPORTER_OTLP_PROTOCOL" "OTEL_EXPORTER_OTLP_HEADERS" "OTEL_TRACES_SAMPLER" "OTEL_TRACES_SAMPLER_ARG" "OTEL_SERVICE_NAME" "OTEL_RESOURCE_ATTRIBUTES" "K8S_POD_NAME" "K8S_NAMESPACE_NAME" | toJson }}
{{- end }}

{{/*
OTEL_RESOURCE_ATTRIBUTES: key=value pairs joined by commas, each value
percent-encoded (W3C Baggage's form, which the SDK decodes: urlquery's "+"
for a space becomes "%20"), except the $(...) references Kubernetes fills in
and the container and revision, which are label-safe already. otel.resourceAttributes override the
chart's own. deployment.environment.name is the current semantic convention;
deployment.environment, its older name, is what many backends still read.
Call with (dict "ctx" $ "container" NAME).
*/}}
{{- define "serving-core.otelResourceAttributes" -}}
{{- $o := .ctx.Values.otel }}
{{- $attributes := dict
  "helm.release" (.ctx.Release.Name | urlquery | replace "+" "%20")
  "k8s.namespace.name" "$(K8S_NAMESPACE_NAME)"
  "k8s.pod.name" "$(K8S_POD_NAME)"
  "k8s.container.name" .container
  "serving.model.revision" (include "serving-core.revision" .ctx) }}
{{- with $o.environment }}
{{- $_ := set $attributes "deployment.environment.name" (urlquery . | replace "+" "%20") }}
{{- $_ = set $attributes "deployment.environment" (urlquery . | replace "+" "%20") }}
{{- end }}
{{- range $key, $value := $o.resourceAttributes }}
{{- $_ := set $attributes $key (urlquery $value | replace "+" "%20") }}
{{- end }}
{{- $pairs := list }}
{{- range $key, $value := $attributes }}
{{- $pairs = append $pairs (printf "%s=%s" $key $value) }}
{{- end }}
{{- join "," $pairs }}
{{- end }}

{{/*
The variables themselves, when otel.enabled (nothing otherwise: traces off,
no OpenTelemetry loaded). The OTLP headers (a backend's API key) come from
their Secret only. Call with (dict "ctx" $ "container" NAME).
*/}}
{{- define "serving-core.otelEnv" -}}
{{- $o := .ctx.Values.otel }}
{{- if $o.enabled }}
- name: SERVING_TRACES
  value: "otlp"
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ $o.endpoint | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ $o.protocol | quote }}
{{- with $o.headersSecret }}
{{- if .name }}
- name: OTEL_EXPORTER_OTLP_HEADERS
  valueFrom:
    secretKeyRef:
      name: {{ .name | quote }}
      key: {{ .key | quote }}
{{- end }}
{{- end }}
- name: OTEL_TRACES_SAMPLER
  value: {{ $o.sampler | quote }}
{{- with $o.samplerArg }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ . | quote }}
{{- end }}
- name: OTEL_SERVICE_NAME
  value: {{ $o.serviceName | default (include "serving-core.fullname" .ctx) | quote }}
- name: K8S_POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: K8S_NAMESPACE_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ include "serving-core.otelResourceAttributes" . | quote }}
{{- with $o.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}
{{- end }}

{{/*
otel.* rules beyond the schema; each message says what to change.
*/}}
{{- define "serving-core.validateOtel" -}}
{{- $o := .Values.otel }}
{{- $names := include "serving-core.otelNames" . | fromJsonArray }}
{{- if and $o.enabled (not $o.endpoint) }}
{{- fail "otel.enabled needs otel.endpoint, the collector's OTLP/HTTP URL, e.g. http://otel-collector.observability:4318 (the exporter adds /v1/traces)" }}
{{- end }}
{{- if and $o.samplerArg (not (hasSuffix "traceidratio" $o.sampler)) }}
{{- fail (printf "otel.samplerArg (%s) is the ratio of a traceidratio sampler, but otel.sampler is %s: set otel.sampler=parentbased_traceidratio, or clear otel.samplerArg" $o.samplerArg $o.sampler) }}
{{- end }}
{{- if hasKey $o.resourceAttributes "service.name" }}
{{- fail "otel.resourceAttributes sets service.name, which OTEL_SERVICE_NAME overrides: set otel.serviceName instead" }}
{{- end }}
{{- range .Values.extraEnv }}
{{- if eq .name "SERVING_TRACES" }}
{{- fail "extraEnv sets SERVING_TRACES, which the chart sets from otel.enabled (otlp, with the OTEL_* variables): set otel.enabled and otel.endpoint instead" }}
{{- end }}
{{- if and $o.enabled (has .name $names) }}
{{- fail (printf "extraEnv sets %s, which the chart sets from otel.* while otel.enabled: remove it, or set the otel value" .name) }}
{{- end }}
{{- end }}
{{- range $o.extraEnv }}
{{- if has .name $names }}
{{- fail (printf "otel.extraEnv sets %s, which the chart sets from otel.*: set the otel value instead" .name) }}
{{- end }}
{{- if hasPrefix "SERVING_" .name }}
{{- fail (printf "otel.extraEnv sets %s, but SERVING_* names are serving-core's settings, which the chart sets from serving.*" .name) }}
{{- end }}
{{- end }}
{{- if and $o.enabled (include "serving-core.egressLimited" .) (not .Values.networkPolicy.egress) }}
{{- fail (printf "networkPolicy.enabled with pipeline.stageUrls limits the server pods' egress to DNS and the stages, but otel.enabled sends spans to %s: add a rule for the collector to networkPolicy.egress, e.g. [{to: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: observability}}}], ports: [{port: 4318, protocol: TCP}]}]" $o.endpoint) }}
{{- end }}
{{- end }}
