{{/* Names, labels and the pieces the three workloads share. */}}

{{- define "pdserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "pdserve.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* the name of one component's objects: <fullname>-<component>, within 63 characters */}}
{{- define "pdserve.componentName" -}}
{{- printf "%s-%s" (include "pdserve.fullname" .root | trunc 52 | trimSuffix "-") .component -}}
{{- end -}}

{{- define "pdserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pdserve.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "pdserve.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "pdserve.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: pdserve
{{- end -}}

{{/* the labels only worker pods carry: what an InferencePool and llm-d's scheduler select on */}}
{{- define "pdserve.roleLabels" -}}
pdserve.io/role: {{ .component }}
llm-d.ai/role: {{ .component }}
llm-d.ai/inferenceServing: "true"
{{- end -}}

{{- define "pdserve.image" -}}
{{- $tag := .Values.image.tag | default (printf "%s-%s" .Chart.AppVersion .Values.image.flavor) -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}

{{- define "pdserve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "pdserve.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "pdserve.secretName" -}}
{{- .Values.auth.existingSecret | default (printf "%s-secrets" (include "pdserve.fullname" .)) -}}
{{- end -}}

{{/* the headless Services the router resolves; their FQDNs are in the router's flags */}}
{{- define "pdserve.prefillHeadless" -}}
{{- include "pdserve.componentName" (dict "root" . "component" "prefill") -}}
{{- end -}}
{{- define "pdserve.decodeHeadless" -}}
{{- include "pdserve.componentName" (dict "root" . "component" "decode") -}}
{{- end -}}
{{- define "pdserve.clusterDomain" -}}svc.cluster.local{{- end -}}

{{- define "pdserve.modelPath" -}}
{{- if .Values.model.path -}}
{{- printf "%s/%s" (.Values.model.mountPath | trimSuffix "/") (.Values.model.path | trimPrefix "/") -}}
{{- else -}}
{{- .Values.model.mountPath -}}
{{- end -}}
{{- end -}}

{{/* probes on GET /health of the named port; p = {startup, liveness, readiness} values */}}
{{- define "pdserve.probes" -}}
startupProbe:
  httpGet: {path: /health, port: http}
  {{- toYaml .startup | nindent 2 }}
livenessProbe:
  httpGet: {path: /health, port: http}
  {{- toYaml .liveness | nindent 2 }}
readinessProbe:
  httpGet: {path: /health, port: http}
  {{- toYaml .readiness | nindent 2 }}
{{- end -}}

{{/* changes when the secret's inputs change, so pods restart to read new keys; generated keys
     are kept on upgrade (lookup), so they do not change it */}}
{{- define "pdserve.secretChecksum" -}}
{{- toJson .Values.auth | sha256sum | trunc 16 | quote -}}
{{- end -}}
