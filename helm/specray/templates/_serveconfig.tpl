{{/*
The ServeConfig dict (cluster/config/serve.py) handed to specray.cluster.serve.app:build_app.
Pool resources come from the same values keys as the worker groups' rayStartParams.resources,
so the two cannot drift.
*/}}

{{- define "specray.speculativeConfig" -}}
{{- $s := .Values.speculation }}
{{- $c := dict "method" $s.method "num_speculative_tokens" (int $s.numSpeculativeTokens) }}
{{- if eq $s.method "freedave" }}
{{- $c = dict "method" "freedave" "num_drafts" (int $s.numDrafts) "adaptive" $s.adaptiveDrafts }}
{{- else if has $s.method (list "draft_model" "eagle" "longspec") }}
{{- $_ := set $c "model" $s.draftModel }}
{{- if and (eq $s.method "longspec") $s.longspecWindow }}{{ $_ := set $c "longspec" (dict "window" (int $s.longspecWindow)) }}{{ end }}
{{- if $s.draftNumLayers }}{{ $_ := set $c "draft_num_layers" (int $s.draftNumLayers) }}{{ end }}
{{- if $s.draftQuantization }}{{ $_ := set $c "draft_quantization" $s.draftQuantization }}{{ end }}
{{- if not (kindIs "invalid" $s.draftVocabTrim) }}{{ $_ := set $c "draft_vocab_trim" (int $s.draftVocabTrim) }}{{ end }}
{{- if $s.layerParallel }}{{ $_ := set $c "layer_parallel" (int $s.layerParallel) }}{{ end }}
{{- else if eq $s.method "ngram" }}
{{- $_ := set $c "prompt_lookup_min" (int $s.promptLookupMin) }}
{{- $_ := set $c "prompt_lookup_max" (int $s.promptLookupMax) }}
{{- end }}
{{- if $s.disableByBatchSize }}{{ $_ := set $c "disable_by_batch_size" (int $s.disableByBatchSize) }}{{ end }}
{{- if and $s.adaptive (ne $s.method "freedave") }}{{ $_ := set $c "adaptive" true }}{{ end }}
{{- toYaml $c }}
{{- end }}

{{/* One pool: (list <group values> <num_workers>). */}}
{{- define "specray.poolConfig" -}}
{{- $g := index . 0 }}
{{- $p := dict "num_workers" (int (index . 1)) "num_cpus" $g.numCpus "num_gpus" (int $g.gpus) "resources" $g.rayResources "dtype" $g.dtype "device" (include "specray.device" $g) }}
{{- if $g.threads }}{{ $_ := set $p "threads" (int $g.threads) }}{{ end }}
{{- if $g.kernels }}{{ $_ := set $p "kernels" $g.kernels }}{{ end }}
{{- toYaml $p }}
{{- end }}

{{- define "specray.serveConfig" -}}
{{- $v := .Values }}
{{- $router := dict "pipelined" $v.router.pipelined "max_num_seqs" (int $v.router.maxNumSeqs) "max_prefill_tokens" nil "max_waiting" (int $v.router.maxWaiting) "kv_cache_tokens" (int $v.router.kvCacheTokens) "block_size" (int $v.router.blockSize) "enable_prefix_caching" $v.router.enablePrefixCaching "draft_timeout_s" $v.router.draftTimeoutS "target_timeout_s" $v.router.targetTimeoutS }}
{{- if $v.router.maxModelLen }}{{ $_ := set $router "max_model_len" (int $v.router.maxModelLen) }}{{ end }}
{{- with $v.router.maxPrefillTokens }}{{ $_ := set $router "max_prefill_tokens" (ternary . (int .) (eq (toString .) "auto")) }}{{ end }}
{{- $transport := dict "kind" $v.transport.kind }}
{{- if $v.transport.drafterAddress }}{{ $_ := set $transport "drafter_address" $v.transport.drafterAddress }}{{ end }}
{{- if $v.transport.masterPort }}{{ $_ := set $transport "master_port" (int $v.transport.masterPort) }}{{ end }}
{{- $http := dict "server" "proxy" "host" "0.0.0.0" "port" (int $v.http.port) "keep_alive_timeout_s" (int $v.http.keepAliveTimeoutS) "default_max_tokens" (int $v.http.defaultMaxTokens) "api_key_env" nil }}
{{- if $v.apiKey.enabled }}{{ $_ := set $http "api_key_env" $v.apiKey.envName }}{{ end }}
{{- $pools := dict "target" (include "specray.poolConfig" (list $v.target $v.target.tensorParallel) | fromYaml) "draft" (include "specray.poolConfig" (list (include "specray.draftGroup" . | fromYaml) $v.draft.groupSize) | fromYaml) }}
{{- /* the chart runs each pool in its own pods: never the workers inside the Serve replica */}}
{{- $_ := set $pools "colocate" false }}
{{- $c := dict "model" $v.model.target "router" $router "pools" $pools "transport" $transport "http" $http }}
{{- $_ := set $c "grpc" (dict "enabled" $v.grpc.enabled "port" (int $v.grpc.port) "server" "proxy") }}
{{- if $v.model.servedModelName }}{{ $_ := set $c "served_model_name" $v.model.servedModelName }}{{ end }}
{{- $d := dict }}
{{- if $v.diffusion.blockLength }}{{ $_ := set $d "block_length" (int $v.diffusion.blockLength) }}{{ end }}
{{- if $v.diffusion.stepsPerBlock }}{{ $_ := set $d "steps_per_block" (int $v.diffusion.stepsPerBlock) }}{{ end }}
{{- if $d }}{{ $_ := set $c "diffusion_config" $d }}{{ end }}
{{- if eq $v.speculation.method "none" }}
{{- $_ := set $c "speculative_config" nil }}
{{- else if ne $v.speculation.method "default" }}{{/* default: no key, so the Serve config picks the target's own */}}
{{- $_ := set $c "speculative_config" (include "specray.speculativeConfig" . | fromYaml) }}
{{- end }}
{{- toYaml (mustMergeOverwrite $c (deepCopy $v.serve.configOverrides)) }}
{{- end }}

{{/* serveConfigV2: Ray Serve's multi-application config (ray.serve.schema.ServeDeploySchema). */}}
{{- define "specray.serveConfigV2" -}}
{{- $v := .Values }}
{{- $app := dict "name" $v.serve.appName "route_prefix" $v.serve.routePrefix "import_path" $v.serve.importPath }}
{{- $_ := set $app "args" (dict "config" (include "specray.serveConfig" . | fromYaml)) }}
{{- /* what `specray serve` passes Serve's HTTPOptions (cluster/serve/run.py), from the same values */}}
{{- $httpOptions := dict "host" "0.0.0.0" "port" (int $v.http.port) "keep_alive_timeout_s" (int $v.http.keepAliveTimeoutS) }}
{{- $cfg := dict "proxy_location" $v.serve.proxyLocation "http_options" $httpOptions "applications" (list $app) }}
{{- if $v.grpc.enabled }}
{{- $_ := set $cfg "grpc_options" (dict "port" (int $v.grpc.port) "grpc_servicer_functions" $v.grpc.servicerFunctions) }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}
