{{/*
Rolling out a model (docs/deployment/rollout.md): two releases of the chart,
stable and canary (and a shadow), their traffic split by a Gateway API
HTTPRoute the stable release owns, or by ingress-nginx's canary annotations on
the canary release's Ingress; each pod labelled with its model revision, which
the ServiceMonitor copies to every series so the dashboard compares the two.
*/}}

{{/*
The pod label of the model's revision (and the spans' serving.model.revision,
_otel.tpl): serving.modelRevision (the model build in every cache key), else
the image tag, made a label value (at most 63 of [A-Za-z0-9._-], alphanumeric
at both ends): sha256:0123 -> sha256-0123.
*/}}
{{- define "serving-core.revisionLabelKey" -}}serving-core.io/model-revision{{- end }}

{{- define "serving-core.revision" -}}
{{- $revision := .Values.serving.modelRevision | default (include "serving-core.imageTag" .) }}
{{- $value := regexReplaceAll "[^A-Za-z0-9._-]" $revision "-" | trunc 63 }}
{{- regexReplaceAll "^[^A-Za-z0-9]+|[^A-Za-z0-9]+$" $value "" }}
{{- end }}

{{- define "serving-core.revisionLabel" -}}
{{ include "serving-core.revisionLabelKey" . }}: {{ include "serving-core.revision" . | quote }}
{{- end }}

{{/*
The HTTPRoute's request timeout: rollout.httpRoute.requestTimeoutSeconds, or
derived as the Ingress's read timeout is (ingress.yaml): the longest the app
works on one request plus 10 s, so its own 504 or a stream's error event
reaches the client first.
*/}}
{{- define "serving-core.routeTimeout" -}}
{{- $s := .Values.serving }}
{{- $longest := max (ceil $s.requestTimeoutSeconds) (ceil $s.generationTimeoutSeconds) }}
{{- $timeout := int64 .Values.rollout.httpRoute.requestTimeoutSeconds }}
{{- if not $timeout }}{{ $timeout = add $longest 10 }}{{ end }}
{{- if lt $timeout $longest }}
{{- fail (printf "rollout.httpRoute.requestTimeoutSeconds (%d) is shorter than the longest the app works on a request, max(serving.requestTimeoutSeconds, serving.generationTimeoutSeconds) = %d s: the gateway would cut an answer the app is still sending; raise it, or set it to 0 to derive it (%d)" $timeout $longest (add $longest 10)) }}
{{- end }}
{{- printf "%ds" $timeout }}
{{- end }}

{{/*
rollout.* rules beyond the schema; each message says what to change.
*/}}
{{- define "serving-core.validateRollout" -}}
{{- $r := .Values.rollout }}
{{- $self := include "serving-core.fullname" . }}
{{- if and (or $r.canary.service $r.mirror.service) (not $r.httpRoute.enabled) }}
{{- fail "rollout.canary.service and rollout.mirror.service are backends of this release's HTTPRoute: set rollout.httpRoute.enabled (on the stable release), or use rollout.ingressNginxCanary on the canary release's Ingress instead" }}
{{- end }}
{{- if and $r.httpRoute.enabled (not $r.httpRoute.parentRefs) }}
{{- fail "rollout.httpRoute.enabled needs rollout.httpRoute.parentRefs, the Gateway(s) the route attaches to, e.g. [{name: public, namespace: gateway-system}]" }}
{{- end }}
{{- range $key := list "canary" "mirror" }}
{{- if eq (get $r $key).service $self }}
{{- fail (printf "rollout.%s.service (%s) is this release's own Service: name the other release's (e.g. <release>-serving-core of the %s release)" $key $self $key) }}
{{- end }}
{{- end }}
{{- if and $r.canary.service (eq $r.canary.service $r.mirror.service) }}
{{- fail (printf "rollout.canary.service and rollout.mirror.service are both %s: a canary answers its share of the clients, a shadow's answers are discarded; give each its own release" $r.canary.service) }}
{{- end }}
{{- if and $r.canary.weight (not $r.canary.service) }}
{{- fail (printf "rollout.canary.weight (%d) sends that percent of requests to the canary: set rollout.canary.service, the canary release's Service" (int64 $r.canary.weight)) }}
{{- end }}
{{- with $r.ingressNginxCanary }}
{{- if .enabled }}
{{- if not $.Values.ingress.enabled }}
{{- fail "rollout.ingressNginxCanary.enabled marks this release's Ingress as the canary of the stable release's: set ingress.enabled, with the stable Ingress's host and path" }}
{{- end }}
{{- if ne $.Values.ingress.controller "ingress-nginx" }}
{{- fail (printf "rollout.ingressNginxCanary.enabled sets ingress-nginx's canary annotations, but ingress.controller is %q: set ingress.controller=ingress-nginx, or split traffic with rollout.httpRoute" $.Values.ingress.controller) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
ingress-nginx's canary annotations of this release's Ingress
(rollout.ingressNginxCanary): ingress-nginx sends weight percent of the
requests for the stable Ingress's host and path here, and every request
carrying the header with the value "always".
*/}}
{{- define "serving-core.ingressCanaryAnnotations" -}}
{{- with .Values.rollout.ingressNginxCanary }}
{{- if .enabled }}
nginx.ingress.kubernetes.io/canary: "true"
nginx.ingress.kubernetes.io/canary-weight: {{ int64 .weight | toString | quote }}
{{- with .header }}
nginx.ingress.kubernetes.io/canary-by-header: {{ . | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
