{{/* Names: Kubernetes names are DNS labels (63 characters at most). */}}

{{- define "specray.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "specray.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
"<fullname>-<suffix>" within 63 characters. The prefix is cut, never the suffix, so that
two suffixed names cannot collapse into one. Call with (list . "suffix").
*/}}
{{- define "specray.suffixed" -}}
{{- $ctx := index . 0 }}
{{- $suffix := index . 1 }}
{{- $prefix := include "specray.fullname" $ctx | trunc (int (sub 62 (len $suffix))) | trimSuffix "-" }}
{{- printf "%s-%s" $prefix $suffix }}
{{- end }}

{{/*
RayService name: KubeRay refuses names over 47 characters, because it derives
"<name>-<5 random>" RayCluster names and "<cluster>-head-svc" Services from it.
*/}}
{{- define "specray.rayServiceName" -}}
{{- include "specray.fullname" . | trunc 47 | trimSuffix "-" }}
{{- end }}

{{- define "specray.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "specray.selectorLabels" -}}
app.kubernetes.io/name: {{ include "specray.name" . }}
app.kubernetes.io/instance: {{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "specray.labels" -}}
helm.sh/chart: {{ include "specray.chart" . }}
{{ include "specray.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The draft group's values with its GPUs resolved: gpus null means one per pod when the target
group has GPUs and the draft is a model (draft_model, eagle or longspec) in its own pods, else none
(inline, the draft runs in the Serve replica, which reserves no GPU: on the CPU). Pods with GPUs and
no tolerations of their own get the GPU toleration the target has by default (GPU nodes are commonly
tainted nvidia.com/gpu: the draft pod stayed Pending there). */}}
{{- define "specray.draftGroup" -}}
{{- $v := .Values }}
{{- $g := deepCopy $v.draft }}
{{- if kindIs "invalid" $g.gpus }}
{{- $neural := and (has $v.speculation.method (list "draft_model" "eagle" "longspec")) (not (include "specray.draftInline" .)) }}
{{- $_ := set $g "gpus" (ternary 1 0 (and $neural (gt (int $v.target.gpus) 0))) }}
{{- end }}
{{- if and (gt (int $g.gpus) 0) (not $g.tolerations) }}
{{- $_ := set $g "tolerations" (list (include "specray.gpuToleration" . | fromYaml)) }}
{{- end }}
{{- toYaml $g }}
{{- end }}

{{/* The toleration of the target group's default values (values.yaml), for a draft group with GPUs. */}}
{{- define "specray.gpuToleration" -}}
key: nvidia.com/gpu
operator: Exists
effect: NoSchedule
{{- end }}

{{/* Image "repo:tag" for a group: (list . .Values.draft.image). Empty fields fall back to image.*. */}}
{{- define "specray.image" -}}
{{- $ctx := index . 0 }}
{{- $over := index . 1 | default dict }}
{{- $repo := $over.repository | default $ctx.Values.image.repository }}
{{- $tag := $over.tag | default $ctx.Values.image.tag | default $ctx.Chart.AppVersion }}
{{- printf "%s:%s" $repo $tag }}
{{- end }}

{{/* Secret holding the API key: an existing one, or the chart's. */}}
{{- define "specray.apiKeySecretName" -}}
{{- .Values.apiKey.existingSecret | default (include "specray.suffixed" (list . "api-key")) }}
{{- end }}

{{/* The data of the chart's API key Secret; the pod templates carry its checksum. */}}
{{- define "specray.apiKeySecretData" -}}
{{ .Values.apiKey.secretKey }}: {{ .Values.apiKey.value | b64enc | quote }}
{{- end }}

{{/* Is the draft worker group rendered? Returns "true" or "". Not where the draft runs in the
replica (transport inline, or auto with a method that has no draft model: ngram, aded, or the
default, adaptive n-gram), nor on an external Drafter (transport grpc). */}}
{{- define "specray.draftGroupEnabled" -}}
{{- $v := .Values }}
{{- if and (not (has $v.speculation.method (list "none" "freedave"))) $v.draft.enabled (not (include "specray.draftInline" .)) (ne $v.transport.kind "grpc") }}true{{ end }}
{{- end }}

{{/* Does transport.kind resolve to inline? Returns "true" or "". */}}
{{- define "specray.draftInline" -}}
{{- $v := .Values }}
{{- $modelFree := has $v.speculation.method (list "default" "ngram" "aded") }}
{{- if or (eq $v.transport.kind "inline") (and (eq $v.transport.kind "auto") $modelFree) }}true{{ end }}
{{- end }}

{{/*
KubeRay passes rayStartParams.resources to `ray start --resources=<value>` through a shell,
so the JSON goes in as a double-quoted string with escaped quotes: "{\"draft\":1}".
*/}}
{{- define "specray.rayResourcesParam" -}}
{{- printf "%q" (toJson .) }}
{{- end }}

{{/* Torch device of a pool: explicit, else cuda with GPUs, else cpu. */}}
{{- define "specray.device" -}}
{{- if .device }}{{ .device }}{{ else if gt (int .gpus) 0 }}cuda{{ else }}cpu{{ end }}
{{- end }}

{{/*
A route of the application under serve.routePrefix: (list . "/health") -> "/api/health" for "/api".
*/}}
{{- define "specray.route" -}}
{{- $root := index . 0 }}{{- $path := index . 1 }}
{{- printf "%s%s" (trimSuffix "/" $root.Values.serve.routePrefix) $path }}
{{- end }}
