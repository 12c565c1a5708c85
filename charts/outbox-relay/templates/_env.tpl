{{/*
The pods' environments. The relay gets every setting; the migrate Job only
the database's (a DDL pod holds no broker credential, and a broker Secret
that does not exist yet cannot block a migration).
*/}}

{{/*
"true" for a variable the relay does not read once the file has [[source]]
tables (it warns that it ignores them): the database settings of the
environment, each source has its own.
*/}}
{{- define "outbox-relay.isDatabaseVar" -}}
{{- if has . (list "OUTBOX_DATABASE_URL" "OUTBOX_TABLE" "OUTBOX_DATABASE_POOLER" "OUTBOX_LISTEN_DATABASE_URL") }}true{{ end }}
{{- end }}

{{/*
The variables `migrate` reads: the database's, the NOTIFY trigger, logging.
*/}}
{{- define "outbox-relay.isMigrateVar" -}}
{{- if has . (list "OUTBOX_TABLE" "OUTBOX_DATABASE_POOLER" "OUTBOX_NOTIFY_TRIGGER" "OUTBOX_LOG_FORMAT" "RUST_LOG") }}true{{ end }}
{{- end }}

{{/*
The relay container's environment: what the chart sets, then extraEnv.
*/}}
{{- define "outbox-relay.relayEnv" -}}
{{- include "outbox-relay.relayOwnEnv" . }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
What the chart sets in the relay's environment. Empty config values are left
out: the relay's own default applies.
*/}}
{{- define "outbox-relay.relayOwnEnv" -}}
{{- include "outbox-relay.databaseEnv" (dict "root" . "migrate" false) }}
{{- if .Values.amqp.existingSecret }}
- name: OUTBOX_AMQP_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.amqp.existingSecret }}
      key: {{ .Values.amqp.secretKey }}
{{- end }}
{{- if .Values.nats.existingSecret }}
- name: OUTBOX_NATS_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.nats.existingSecret }}
      key: {{ .Values.nats.secretKey }}
{{- end }}
{{- if .Values.kafka.existingSecret }}
- name: OUTBOX_KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .Values.kafka.existingSecret }}
      key: {{ .Values.kafka.passwordKey }}
{{- end }}
{{- $routed := include "outbox-relay.routed" . }}
{{- if and .Values.nats.credsSecret (not $routed) }}
- name: OUTBOX_NATS_CREDS_FILE
  value: {{ printf "%s/%s" (trimSuffix "/" .Values.nats.credsMountPath) .Values.nats.credsKey | quote }}
{{- end }}
{{- if include "outbox-relay.hasFile" . }}
- name: OUTBOX_CONFIG
  value: {{ include "outbox-relay.configPath" . | quote }}
{{- end }}
{{- range $name, $value := .Values.config }}
{{- $skip := or (and $routed (include "outbox-relay.isSinkVar" $name)) (and $.Values.sources (include "outbox-relay.isDatabaseVar" $name)) }}
{{- if and (ne (include "outbox-relay.envValue" $value) "") (not $skip) }}
- name: {{ $name }}
  value: {{ include "outbox-relay.envValue" $value | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The migrate Job's environment: the database URL(s), the table settings,
the NOTIFY trigger, logging, its own file (outbox-relay.migrateToml) and
migrations.extraEnv; nothing of the brokers.
*/}}
{{- define "outbox-relay.migrateEnv" -}}
{{- include "outbox-relay.databaseEnv" (dict "root" . "migrate" true) }}
{{- if include "outbox-relay.migrateFileValues" . }}
- name: OUTBOX_CONFIG
  value: {{ include "outbox-relay.configPath" . | quote }}
{{- end }}
{{- range $name, $value := .Values.config }}
{{- $skip := and $.Values.sources (include "outbox-relay.isDatabaseVar" $name) }}
{{- if and (include "outbox-relay.isMigrateVar" $name) (ne (include "outbox-relay.envValue" $value) "") (not $skip) }}
- name: {{ $name }}
  value: {{ include "outbox-relay.envValue" $value | quote }}
{{- end }}
{{- end }}
{{- with .Values.migrations.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
extraEnv may not set a variable the chart sets itself: Kubernetes would
keep the later of the two, silently (a plain value replacing the Secret's
database URL, for one). values.schema.json refuses plain values of the
variables that hold credentials; this refuses every duplicate.
*/}}
{{- define "outbox-relay.validateExtraEnv" -}}
{{- $own := list }}
{{- range (include "outbox-relay.relayOwnEnv" . | fromYamlArray) }}{{ $own = append $own .name }}{{ end }}
{{- range $i, $e := .Values.extraEnv }}
{{- if has $e.name $own }}
{{- fail (printf "extraEnv[%d]: %s is set by the chart (from a Secret or config): set it there, in one place" $i $e.name) }}
{{- end }}
{{- end }}
{{- $migrateOwn := list }}
{{- range (include "outbox-relay.databaseEnv" (dict "root" . "migrate" true) | fromYamlArray) }}{{ $migrateOwn = append $migrateOwn .name }}{{ end }}
{{- range $i, $e := .Values.migrations.extraEnv }}
{{- if has $e.name $migrateOwn }}
{{- fail (printf "migrations.extraEnv[%d]: %s is set by the chart from a Secret: set it there, in one place" $i $e.name) }}
{{- end }}
{{- end }}
{{- end }}
