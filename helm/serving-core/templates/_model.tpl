{{/*
The model's artifacts from a store (model.uri, docs/artifacts.md): an init
container, `serving-core fetch`, downloads and verifies them into the model
volume before any serving-core container starts; those then read that copy
offline (SERVING_MODEL_OFFLINE), so only the init container ever holds the
store's credentials. Every pod that loads the handler (server, worker, stream,
batch) gets the same init container, volume and environment.
*/}}

{{/*
"fetch" when model.uri names a store the init container downloads from, "local"
when it is a path inside the image (file:// or absolute: used in place, nothing
to fetch), "" when it is empty.
*/}}
{{- define "serving-core.modelSource" -}}
{{- $uri := .Values.model.uri }}
{{- if not $uri }}
{{- else if or (hasPrefix "/" $uri) (hasPrefix "file://" $uri) }}local
{{- else }}fetch
{{- end }}
{{- end }}

{{- define "serving-core.modelCacheDir" -}}{{ .Values.model.mountPath }}{{- end }}
{{- define "serving-core.modelCredentialsDir" -}}/run/model-credentials{{- end }}

{{/*
SERVING_MODEL_* of every container that loads the handler: the URI, and with
a fetched model the volume the init container filled, read offline.
*/}}
{{- define "serving-core.modelEnv" -}}
{{- $source := include "serving-core.modelSource" . }}
{{- if $source }}
- name: SERVING_MODEL_URI
  value: {{ .Values.model.uri | quote }}
{{- end }}
{{- if eq $source "fetch" }}
- name: SERVING_MODEL_CACHE
  value: {{ include "serving-core.modelCacheDir" . | quote }}
- name: SERVING_MODEL_OFFLINE
  value: "true"
{{- end }}
{{- end }}

{{/*
The read-only mount of the model volume in a container that loads the
handler: it reads what the init container verified, and cannot change it.
*/}}
{{- define "serving-core.modelMount" -}}
{{- if eq (include "serving-core.modelSource" .) "fetch" }}
- name: model-cache
  mountPath: {{ include "serving-core.modelCacheDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{/*
The pod's model volume (an emptyDir, of model.volume.sizeLimit when set, or the existing
claim model.volume.claimName, which pods may share: the fetcher locks it, so
one downloads and the others wait and use it) and the credentials file's
Secret, which only the init container mounts.
*/}}
{{- define "serving-core.modelVolumes" -}}
{{- if eq (include "serving-core.modelSource" .) "fetch" }}
{{- $m := .Values.model }}
- name: model-cache
  {{- if $m.volume.claimName }}
  persistentVolumeClaim:
    claimName: {{ $m.volume.claimName | quote }}
  {{- else if $m.volume.sizeLimit }}
  emptyDir:
    sizeLimit: {{ $m.volume.sizeLimit }}
  {{- else }}
  # No sizeLimit: bounded by the node's ephemeral storage only.
  emptyDir: {}
  {{- end }}
{{- with $m.credentials }}
{{- if .fileKey }}
- name: model-credentials
  secret:
    secretName: {{ .secretName | quote }}
    items:
      - key: {{ .fileKey | quote }}
        path: {{ .fileKey | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The init container: the app's image and securityContext (a read-only root
filesystem: it writes to the model volume only, staging and all, and /tmp), the
store's credentials from an existing Secret (model.credentials) or from the
pod's ServiceAccount (IRSA, Workload Identity: serviceAccount.annotations).
*/}}
{{- define "serving-core.modelInitContainers" -}}
{{- if eq (include "serving-core.modelSource" .) "fetch" }}
{{- $m := .Values.model }}
{{- $c := $m.credentials }}
- name: fetch-model
  image: {{ include "serving-core.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: ["serving-core", "fetch"]
  env:
    - name: SERVING_MODEL_URI
      value: {{ $m.uri | quote }}
    - name: SERVING_MODEL_CACHE
      value: {{ include "serving-core.modelCacheDir" . | quote }}
    - name: SERVING_LOG_LEVEL
      value: {{ .Values.serving.logLevel | quote }}
    - name: SERVING_LOG_FORMAT
      value: {{ .Values.serving.logFormat | quote }}
    {{- range $name, $key := $c.env }}
    - name: {{ $name }}
      valueFrom:
        secretKeyRef:
          name: {{ $c.secretName | quote }}
          key: {{ $key | quote }}
    {{- end }}
    {{- if $c.fileKey }}
    - name: {{ $c.fileEnv }}
      value: {{ printf "%s/%s" (include "serving-core.modelCredentialsDir" .) $c.fileKey | quote }}
    {{- end }}
    {{- with $m.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- if and $c.secretName (not $c.env) (not $c.fileKey) }}
  # Every key of the Secret, as a variable of its name (AWS_ACCESS_KEY_ID ...).
  envFrom:
    - secretRef:
        name: {{ $c.secretName | quote }}
  {{- end }}
  {{- with ($m.resources | default .Values.resources) }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: model-cache
      mountPath: {{ include "serving-core.modelCacheDir" . }}
    - name: tmp
      mountPath: /tmp
    {{- if $c.fileKey }}
    - name: model-credentials
      mountPath: {{ include "serving-core.modelCredentialsDir" . }}
      readOnly: true
    {{- end }}
{{- end }}
{{- end }}

{{/*
model.* rules beyond the schema; each message says what to change.
*/}}
{{- define "serving-core.validateModel" -}}
{{- $m := .Values.model }}
{{- $c := $m.credentials }}
{{- $source := include "serving-core.modelSource" . }}
{{- $volume := or $m.volume.sizeLimit $m.volume.claimName }}
{{- $credentials := or $c.secretName $c.env $c.fileKey }}
{{- if eq $source "fetch" }}
{{- if and $m.volume.sizeLimit $m.volume.claimName }}
{{- fail (printf "model.volume.sizeLimit (%s, an emptyDir) and model.volume.claimName (%s, a PersistentVolumeClaim) are both set: keep one" $m.volume.sizeLimit $m.volume.claimName) }}
{{- end }}
{{- else if $source }}
{{- if or $volume $credentials }}
{{- fail (printf "model.uri (%s) is a path inside the image, used in place: nothing is fetched, so clear model.volume and model.credentials" $m.uri) }}
{{- end }}
{{- else if or $volume $credentials }}
{{- fail "model.volume and model.credentials are for the init container that fetches model.uri: set model.uri (s3://, gs://, az://, https://), or clear them" }}
{{- end }}
{{- if and (eq $source "fetch") (include "serving-core.egressLimited" .) (not .Values.networkPolicy.egress) }}
{{- fail (printf "networkPolicy.enabled with pipeline.stageUrls limits the server pods' egress to DNS and the stages, but the init container fetches model.uri (%s) from its store: add a rule for it to networkPolicy.egress, e.g. [{to: [{ipBlock: {cidr: 0.0.0.0/0}}], ports: [{port: 443, protocol: TCP}]}]" $m.uri) }}
{{- end }}
{{- if and (or $c.env $c.fileKey) (not $c.secretName) }}
{{- fail "model.credentials.env and model.credentials.fileKey name keys of a Secret: set model.credentials.secretName" }}
{{- end }}
{{- range $name, $_ := $c.env }}
{{- if hasPrefix "SERVING_" $name }}
{{- fail (printf "model.credentials.env sets %s, but SERVING_* names are serving-core's settings, which the chart sets: name the store's variable (AWS_ACCESS_KEY_ID, AZURE_STORAGE_ACCOUNT_KEY ...)" $name) }}
{{- end }}
{{- end }}
{{- range .Values.extraEnv }}
{{- if has .name (list "SERVING_MODEL_URI" "SERVING_MODEL_CACHE" "SERVING_MODEL_OFFLINE") }}
{{- fail (printf "extraEnv sets %s, which the chart sets from model.uri (the cache is model.mountPath, read offline after the init container's fetch): set model.uri instead" .name) }}
{{- end }}
{{- end }}
{{- range $m.extraEnv }}
{{- if hasPrefix "SERVING_" .name }}
{{- fail (printf "model.extraEnv sets %s, but SERVING_* names are serving-core's settings, which the chart sets from model.*" .name) }}
{{- end }}
{{- end }}
{{- range concat .Values.extraVolumes .Values.batch.extraVolumes }}
{{- if and $source (has .name (list "model-cache" "model-credentials")) }}
{{- fail (printf "extraVolumes has a volume named %s, which the chart uses for model.uri: rename it" .name) }}
{{- end }}
{{- end }}
{{- end }}
