{{/* The objects' name: the release name, or "outbox-relay" where the release is called that. */}}
{{- define "outbox-relay.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Selector labels: stable across upgrades (a Deployment's selector is immutable). */}}
{{- define "outbox-relay.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "outbox-relay.labels" -}}
{{ include "outbox-relay.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The Secret the pods take their OUTBOX_RELAY__* variables from. */}}
{{- define "outbox-relay.secretName" -}}
{{- .Values.secret.existingSecret | default (include "outbox-relay.fullname" .) -}}
{{- end -}}

{{/* What the relay and the setup init container share: image, config, secret, hardening. */}}
{{- define "outbox-relay.container" -}}
image: {{ printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) | quote }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
envFrom:
  - secretRef:
      name: {{ include "outbox-relay.secretName" . }}
env:
  - name: OUTBOX_RELAY_CONFIG
    value: /etc/outbox-relay/outbox-relay.toml
  # librdkafka's client.id shows which pod produced in broker logs and quotas.
  - name: OUTBOX_RELAY__KAFKA__CLIENT_ID
    valueFrom:
      fieldRef:
        fieldPath: metadata.name
  {{- with .Values.extraEnv }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
volumeMounts:
  - name: config
    mountPath: /etc/outbox-relay
    readOnly: true
  - name: stage
    mountPath: /tmp
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: ["ALL"]
{{- end -}}
