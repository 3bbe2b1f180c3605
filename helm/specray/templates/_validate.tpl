{{/*
Cross-field checks that values.schema.json cannot express; each fails the render with the fix.
*/}}
{{- define "specray.validate" -}}
{{- $v := .Values }}
{{- if and (has $v.speculation.method (list "draft_model" "eagle" "longspec")) (not $v.speculation.draftModel) }}
{{- fail (printf "speculation.method %s needs speculation.draftModel (alias, HF folder or .gguf path)" $v.speculation.method) }}
{{- end }}
{{- if and (eq $v.speculation.method "longspec") (gt (int $v.target.tensorParallel) 1) }}
{{- fail "speculation.method longspec reads the target's whole last-layer KV: set target.tensorParallel to 1" }}
{{- end }}
{{- $speculating := not (has $v.speculation.method (list "none" "freedave")) }}{{/* freedave: no draft pool */}}
{{- if and (eq $v.speculation.method "freedave") (gt (int $v.target.tensorParallel) 1) }}
{{- fail "speculation.method freedave serves a diffusion LM on one worker: set target.tensorParallel to 1" }}
{{- end }}
{{- $diffusion := or (eq $v.speculation.method "freedave") (hasSuffix "-dllm" $v.model.target) }}{{/* the packaged diffusion LMs' aliases */}}
{{- if and $diffusion (gt (int $v.target.tensorParallel) 1) }}
{{- fail (printf "%s is a diffusion LM, served on one worker: set target.tensorParallel to 1" $v.model.target) }}
{{- end }}
{{- if and (eq $v.speculation.method "freedave") (not (kindIs "invalid" $v.speculation.disableByBatchSize)) }}
{{- fail "speculation.disableByBatchSize does not apply to freedave (a diffusion LM's drafts are speculation.numDrafts)" }}
{{- end }}
{{- if gt (int $v.draft.groupSize) 1 }}
{{- if not (has $v.transport.kind (list "ray" "auto")) }}
{{- fail (printf "draft.groupSize %d needs transport.kind ray (a layer group's workers talk over Ray), got %s" (int $v.draft.groupSize) $v.transport.kind) }}
{{- end }}
{{- if lt (int ($v.speculation.layerParallel | default 1)) (int $v.draft.groupSize) }}
{{- fail (printf "draft.groupSize %d needs speculation.layerParallel >= %d (a layer group splits its attentions over the draft group)" (int $v.draft.groupSize) (int $v.draft.groupSize)) }}
{{- end }}
{{- if lt (int $v.draft.replicas) (int $v.draft.groupSize) }}
{{- fail (printf "draft.replicas (%d) must be at least draft.groupSize (%d): one draft worker per pod" (int $v.draft.replicas) (int $v.draft.groupSize)) }}
{{- end }}
{{- end }}
{{- if and $v.speculation.layerParallel (ne $v.speculation.method "draft_model") }}
{{- fail (printf "speculation.layerParallel needs speculation.method draft_model (a draft with layers to group), got %s" $v.speculation.method) }}
{{- end }}
{{- if and $speculating (eq $v.transport.kind "grpc") (not $v.transport.drafterAddress) }}
{{- fail "transport.kind grpc needs transport.drafterAddress (host:port of the Drafter service)" }}
{{- end }}
{{- if and $speculating (not $v.draft.enabled) (ne $v.transport.kind "grpc") (not (include "specray.draftInline" .)) }}
{{- fail "draft.enabled=false leaves the draft pool nowhere to run; use speculation.method none or transport.kind grpc or inline" }}
{{- end }}
{{- range $name := list "draft" "target" }}
{{- $g := index $v $name }}
{{- if or (gt (int $g.minReplicas) (int $g.replicas)) (gt (int $g.replicas) (int $g.maxReplicas)) }}
{{- fail (printf "%s: need minReplicas <= replicas <= maxReplicas, got %d, %d, %d" $name (int $g.minReplicas) (int $g.replicas) (int $g.maxReplicas)) }}
{{- end }}
{{- end }}
{{- if lt (int $v.target.replicas) (int $v.target.tensorParallel) }}
{{- fail (printf "target.replicas (%d) must be at least target.tensorParallel (%d): one target worker per pod" (int $v.target.replicas) (int $v.target.tensorParallel)) }}
{{- end }}
{{- if and $v.autoscaling.enabled (lt (int $v.target.minReplicas) (int $v.target.tensorParallel)) }}
{{- fail (printf "target.minReplicas (%d) must be at least target.tensorParallel (%d) when autoscaling" (int $v.target.minReplicas) (int $v.target.tensorParallel)) }}
{{- end }}
{{- if and $v.autoscaling.enabled (include "specray.draftGroupEnabled" .) (lt (int $v.draft.minReplicas) (int $v.draft.groupSize)) }}
{{- fail (printf "draft.minReplicas (%d) must be at least draft.groupSize (%d) when autoscaling" (int $v.draft.minReplicas) (int $v.draft.groupSize)) }}
{{- end }}
{{- if and $v.speculation.adaptive (eq $v.speculation.method "aded") }}
{{- fail "speculation.adaptive applies to chains (ngram, draft_model, eagle, longspec); aded drafts trees of a fixed shape" }}
{{- end }}
{{- if and $v.transport.drafterAddress (ne $v.transport.kind "grpc") }}
{{- fail (printf "transport.drafterAddress is the Drafter of transport.kind grpc; transport.kind is %s" $v.transport.kind) }}
{{- end }}
{{- if include "specray.draftGroupEnabled" . }}
{{- if lt (int $v.draft.replicas) (max 1 (int $v.draft.groupSize) | int) }}
{{- fail (printf "draft.replicas (%d) leaves the draft pool no pod: set it to at least %d" (int $v.draft.replicas) (max 1 (int $v.draft.groupSize) | int)) }}
{{- end }}
{{- end }}
{{- if and (include "specray.draftInline" .) (gt (int ($v.draft.gpus | default 0)) 0) }}
{{- fail "transport inline runs the draft inside the Serve replica, which reserves no GPU: set draft.gpus to 0 (or null), or transport.kind ray" }}
{{- end }}
{{- if and $v.transport.masterPort (ne $v.transport.kind "torch_distributed") }}
{{- fail (printf "transport.masterPort is the torch_distributed rendezvous port; transport.kind is %s" $v.transport.kind) }}
{{- end }}
{{- if gt (int $v.speculation.promptLookupMin) (int $v.speculation.promptLookupMax) }}
{{- fail (printf "speculation.promptLookupMin (%d) must be at most speculation.promptLookupMax (%d)" (int $v.speculation.promptLookupMin) (int $v.speculation.promptLookupMax)) }}
{{- end }}
{{- if and $v.grpc.enabled (eq (int $v.http.port) (int $v.grpc.port)) }}
{{- fail (printf "http.port and grpc.port are both %d; give them different ports" (int $v.http.port)) }}
{{- end }}
{{- $ray := dict "6379" "the GCS" "8265" "the dashboard" "10001" "the Ray client" "8080" "Ray's metrics" }}
{{- range $key, $port := dict "http.port" $v.http.port "grpc.port" (ternary $v.grpc.port 0 $v.grpc.enabled) }}
{{- with get $ray (toString (int $port)) }}
{{- fail (printf "%s %d is Ray's own port (%s): choose another" $key (int $port) .) }}
{{- end }}
{{- end }}
{{- range $v.extraEnv }}
{{- if and (not $v.apiKey.enabled) (has .name (list $v.apiKey.envName "SPECRAY_API_KEY")) }}
{{- fail (printf "extraEnv %s would be ignored (apiKey.enabled is false: the API serves without a key); set apiKey.enabled with apiKey.existingSecret instead" .name) }}
{{- end }}
{{- end }}
{{- if and $v.apiKey.enabled (not $v.apiKey.existingSecret) (not $v.apiKey.value) }}
{{- fail "apiKey.enabled needs apiKey.value or apiKey.existingSecret" }}
{{- end }}
{{- if and (eq $v.modelStorage.type "initContainer") (not $v.modelStorage.initContainer.command) }}
{{- fail "modelStorage.type initContainer needs modelStorage.initContainer.command (it fills $MODEL_DIR)" }}
{{- end }}
{{- if and (eq $v.modelStorage.type "pvc") (not $v.modelStorage.pvc.claimName) (not $v.modelStorage.pvc.create) }}
{{- fail "modelStorage.type pvc needs modelStorage.pvc.claimName or modelStorage.pvc.create=true" }}
{{- end }}
{{- /* Keys of the Serve config the chart owns: the containers' ports, the Service and Serve's own
proxies (http_options, grpc_options) follow the values, so an override would move only the app's copy. */}}
{{- $proxies := "the chart serves through Ray Serve's proxies, which the Service points at: remove it" }}
{{- $owned := dict
      "http.port" "set http.port"
      "http.keep_alive_timeout_s" "set http.keepAliveTimeoutS"
      "http.api_key_env" "set apiKey.enabled and apiKey.envName"
      "http.host" "the chart binds Serve's proxies to all interfaces: remove it"
      "http.server" $proxies
      "grpc.port" "set grpc.port"
      "grpc.enabled" "set grpc.enabled"
      "grpc.server" $proxies }}
{{- range $path, $instead := $owned }}
{{- $section := get $v.serve.configOverrides (first (splitList "." $path)) }}
{{- if and (kindIs "map" $section) (hasKey $section (last (splitList "." $path))) }}
{{- fail (printf "serve.configOverrides.%s is the chart's own setting: %s" $path $instead) }}
{{- end }}
{{- end }}
{{- /* The pools as the server gets them (configOverrides merged): cluster/config/pools.py and serve.py refuse these. */}}
{{- $pools := (include "specray.serveConfig" . | fromYaml).pools }}
{{- with $pools.target }}
{{- if and (ne .kernels "exact") (ne .kernels "auto") (or (not (hasPrefix "cpu" .device)) (not (has .dtype (list "float32" "fp32" "auto")))) }}
{{- fail (printf "target.kernels %s is a CPU kernels' mode on fp32 weights; the target's device %s with dtype %s would not use it: set target.kernels exact, or target.gpus 0 and target.dtype float32" .kernels .device .dtype) }}
{{- end }}
{{- if and $diffusion (ne .kernels "exact") (ne .kernels "auto") }}
{{- fail (printf "target.kernels %s applies to autoregressive GGUF models; %s is a diffusion LM: set target.kernels exact" .kernels $v.model.target) }}
{{- end }}
{{- if and (hasPrefix "cuda" .device) (lt (float64 .num_gpus) 1.0) }}
{{- fail (printf "target.device %s needs a GPU in the target pods: set target.gpus to 1 or more, or target.device cpu (or empty)" .device) }}
{{- end }}
{{- end }}
{{- if and $speculating (ne $v.transport.kind "grpc") (hasPrefix "cuda" $pools.draft.device) (lt (float64 $pools.draft.num_gpus) 1.0) }}
{{- if include "specray.draftInline" . }}
{{- fail (printf "draft.device %s: transport inline runs the draft inside the Serve replica, which reserves no GPU: set draft.device cpu (or empty), or transport.kind ray" $pools.draft.device) }}
{{- end }}
{{- fail (printf "draft.device %s needs a GPU in the draft pods, but draft.gpus resolves to 0: set draft.gpus to 1 or more, or draft.device cpu (or empty)" $pools.draft.device) }}
{{- end }}
{{- end }}
