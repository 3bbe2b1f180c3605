{{/*
spec.serveService of the RayService: the Service <fullname>-http in front of the Serve proxies, for
HTTP and gRPC. KubeRay creates it once the Serve app is ready and manages its selector: ray.io/cluster
of the active cluster plus ray.io/serve=true (the head while KubeRay finds its proxy healthy, worker
pods by their readiness probe). During a zero-downtime upgrade it switches to the new cluster only
once that cluster's app is ready; a selector of the chart's own would match both clusters' heads, as
KubeRay labels both. KubeRay keeps only ports named "serve" and "serve-*" (the head container's), in
the form given here.
*/}}
{{- define "specray.serveService" -}}
metadata:
  name: {{ include "specray.suffixed" (list . "http") }}
  labels:
    {{- include "specray.labels" . | nindent 4 }}
    app.kubernetes.io/component: http
  {{- with .Values.services.http.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  type: {{ .Values.services.http.type }}
  ports:
    - name: serve
      port: {{ .Values.services.http.port }}
      targetPort: serve
      protocol: TCP
      appProtocol: http
    {{- if .Values.grpc.enabled }}
    - name: serve-grpc
      port: {{ .Values.services.grpc.port }}
      targetPort: serve-grpc
      protocol: TCP
      appProtocol: grpc
    {{- end }}
{{- end }}
