{{/*
Pod template of one Ray group: (list . "head"|"draft"|"target" <group values>).
KubeRay treats containers[0] as the Ray container and adds `ray start` and its own probes
(unless the group sets readinessProbe/livenessProbe).
*/}}
{{- define "specray.podTemplate" -}}
{{- $ctx := index . 0 }}
{{- $role := index . 1 }}
{{- $g := index . 2 }}
{{- $v := $ctx.Values }}
{{- $storage := $v.modelStorage -}}
metadata:
  # Selector labels only: a changed pod template makes KubeRay roll a whole new cluster,
  # so chart/app version labels stay off it.
  labels:
    {{- /* selectors (kubectl -l, affinity rules) rely on these: a podLabels key of the same name does not replace them */}}
    {{- $own := set (include "specray.selectorLabels" $ctx | fromYaml) "app.kubernetes.io/component" $role }}
    {{- toYaml (merge $own (deepCopy ($g.podLabels | default dict))) | nindent 4 }}
  {{- $annotations := deepCopy ($g.podAnnotations | default dict) }}
  {{- if and $v.apiKey.enabled (not $v.apiKey.existingSecret) }}
  {{- /* the key reaches the containers as a variable at start: a new key must roll a new cluster */}}
  {{- $_ := set $annotations "checksum/api-key" (include "specray.apiKeySecretData" $ctx | sha256sum) }}
  {{- end }}
  {{- with $annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  {{- with $v.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.serviceAccountName }}
  serviceAccountName: {{ . }}
  {{- end }}
  {{- with $v.podSecurityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if eq $storage.type "initContainer" }}
  initContainers:
    - name: fetch-models
      image: {{ $storage.initContainer.image }}
      {{- with $v.securityContext }}
      securityContext:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      command:
        {{- toYaml $storage.initContainer.command | nindent 8 }}
      env:
        - name: MODEL_DIR
          value: {{ $storage.mountPath | quote }}
      volumeMounts:
        - name: models
          mountPath: {{ $storage.mountPath }}
  {{- end }}
  containers:
    - name: ray-{{ $role }}
      image: {{ include "specray.image" (list $ctx $g.image) }}
      imagePullPolicy: {{ $v.image.pullPolicy }}
      {{- with $v.securityContext }}
      securityContext:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      ports:
        {{- if eq $role "head" }}
        - {name: gcs-server, containerPort: 6379}
        - {name: dashboard, containerPort: 8265}
        - {name: client, containerPort: 10001}
        {{- end }}
        - {name: metrics, containerPort: 8080}
        # KubeRay's serve Service and worker readiness probe find the proxy by these names.
        - {name: serve, containerPort: {{ $v.http.port }}}
        {{- if $v.grpc.enabled }}
        - {name: serve-grpc, containerPort: {{ $v.grpc.port }}}
        {{- end }}
      {{- if or $v.apiKey.enabled $v.extraEnv }}
      env:
        {{- if $v.apiKey.enabled }}
        - name: {{ $v.apiKey.envName }}
          valueFrom:
            secretKeyRef:
              name: {{ include "specray.apiKeySecretName" $ctx }}
              key: {{ $v.apiKey.secretKey }}
        {{- end }}
        {{- with $v.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- end }}
      {{- $res := deepCopy ($g.resources | default dict) }}
      {{- if gt (int ($g.gpus | default 0)) 0 }}
      {{- $_ := set $res "limits" (merge (dict "nvidia.com/gpu" (int $g.gpus)) ($res.limits | default dict)) }}
      {{- end }}
      {{- with $res }}
      resources:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      volumeMounts:
        # Ray's object store lives in shared memory; the container default (64Mi) is too small.
        - name: dshm
          mountPath: /dev/shm
        {{- if ne $storage.type "none" }}
        - name: models
          mountPath: {{ $storage.mountPath }}
          readOnly: {{ $storage.readOnly }}
        {{- end }}
      {{- with $g.readinessProbe }}
      readinessProbe:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $g.livenessProbe }}
      livenessProbe:
        {{- toYaml . | nindent 8 }}
      {{- end }}
  volumes:
    - name: dshm
      emptyDir:
        medium: Memory
    {{- if eq $storage.type "pvc" }}
    - name: models
      persistentVolumeClaim:
        claimName: {{ $storage.pvc.claimName | default (include "specray.suffixed" (list $ctx "models")) }}
        readOnly: {{ $storage.readOnly }}
    {{- else if eq $storage.type "hostPath" }}
    - name: models
      hostPath:
        path: {{ $storage.hostPath.path }}
        type: {{ $storage.hostPath.type }}
    {{- else if eq $storage.type "initContainer" }}
    - name: models
      emptyDir:
        sizeLimit: {{ $storage.initContainer.sizeLimit }}
    {{- end }}
  {{- with $g.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $g.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $g.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}

{{/* rayStartParams as strings (the CRD's type); for worker groups, plus the pool's custom resources. */}}
{{- define "specray.startParams" -}}
{{- $params := deepCopy (.rayStartParams | default dict) }}
{{- if hasKey . "rayResources" }}
{{- $_ := set $params "resources" (include "specray.rayResourcesParam" .rayResources) }}
{{- end }}
{{- range $k, $val := $params }}
{{ $k }}: {{ $val | toString | squote }}
{{- end }}
{{- end }}
