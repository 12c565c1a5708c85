{{/*
Chart name, truncated to the 63 characters of a DNS label.
*/}}
{{- define "outbox-relay.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: <release>-<chart>, or the release name alone when it already
contains the chart name.
*/}}
{{- define "outbox-relay.fullname" -}}
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

{{- define "outbox-relay.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "outbox-relay.labels" -}}
helm.sh/chart: {{ include "outbox-relay.chart" . }}
{{ include "outbox-relay.selectorLabels" . }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "outbox-relay.selectorLabels" -}}
app.kubernetes.io/name: {{ include "outbox-relay.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "outbox-relay.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "outbox-relay.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "outbox-relay.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "outbox-relay.databaseSecretName" -}}
{{- default (printf "%s-database" (include "outbox-relay.fullname" .)) .Values.database.existingSecret }}
{{- end }}

{{/*
Renders a value as a string: null as "", numbers as integers. Helm reads
YAML numbers as float64, which would print 1000000 as "1e+06".
*/}}
{{- define "outbox-relay.envValue" -}}
{{- if kindIs "invalid" . }}
{{- else if or (kindIs "float64" .) (kindIs "int64" .) (kindIs "int" .) }}
{{- printf "%d" (int64 .) }}
{{- else }}
{{- toString . }}
{{- end }}
{{- end }}

{{/*
Seconds in an OUTBOX_* duration (500ms, 30s, 5m, 2h, 7d), rounded up.
values.schema.json has already checked the form.
*/}}
{{- define "outbox-relay.durationSeconds" -}}
{{- $d := toString . }}
{{- $digits := regexFind "^[0-9]+" $d }}
{{- $n := int64 $digits }}
{{- $unit := trimPrefix $digits $d }}
{{- if eq $unit "ms" }}{{ div (add $n 999) 1000 }}
{{- else if or (eq $unit "s") (eq $unit "") }}{{ $n }}
{{- else if eq $unit "m" }}{{ mul $n 60 }}
{{- else if eq $unit "h" }}{{ mul $n 3600 }}
{{- else if eq $unit "d" }}{{ mul $n 86400 }}
{{- else }}{{ fail (printf "cannot read duration %q" $d) }}
{{- end }}
{{- end }}

{{/*
Port of OUTBOX_HTTP_ADDR: the container port, the probes and the Service all
follow it, so changing the listen address cannot break them.
*/}}
{{- define "outbox-relay.httpPort" -}}
{{- $addr := toString .Values.config.OUTBOX_HTTP_ADDR }}
{{- $host := regexReplaceAll ":[0-9]+$" $addr "" }}
{{- if not (has $host (list "0.0.0.0" "[::]" "")) }}
{{- fail (printf "config.OUTBOX_HTTP_ADDR=%q: listen on 0.0.0.0 or [::], the kubelet probes and Prometheus reach the pod on its pod IP" $addr) }}
{{- end }}
{{- regexFind "[0-9]+$" $addr }}
{{- end }}

{{/*
Checks across values that values.schema.json cannot express. Included by the
Deployment, so every render runs them.
*/}}
{{- define "outbox-relay.validate" -}}
{{- $c := .Values.config }}
{{- include "outbox-relay.validateSources" . }}
{{- include "outbox-relay.validateExtraEnv" . }}
{{- if .Values.configFile }}
{{- include "outbox-relay.validateConfigFile" . }}
{{- end }}
{{- /* With destinations in the file the relay reads no sink variable: the checks of those are the destinations' (values.schema.json, validateConfigFile). */}}
{{- if not (include "outbox-relay.routed" .) }}
{{- if and (eq $c.OUTBOX_SINK "sqs") (not $c.OUTBOX_SQS_QUEUE_URL) }}
{{- fail "config.OUTBOX_SQS_QUEUE_URL is required when config.OUTBOX_SINK is sqs" }}
{{- end }}
{{- if and (eq (toString $c.OUTBOX_MESSAGE_FORMAT) "cloudevents") (not $c.OUTBOX_CLOUDEVENTS_SOURCE) }}
{{- fail "config.OUTBOX_CLOUDEVENTS_SOURCE is required when config.OUTBOX_MESSAGE_FORMAT is cloudevents" }}
{{- end }}
{{- if and .Values.amqp.existingSecret $c.OUTBOX_AMQP_URL }}
{{- fail "set either amqp.existingSecret or config.OUTBOX_AMQP_URL, not both" }}
{{- end }}
{{- if and .Values.nats.existingSecret $c.OUTBOX_NATS_URL }}
{{- fail "set either nats.existingSecret or config.OUTBOX_NATS_URL, not both" }}
{{- end }}
{{- if and .Values.nats.credsSecret $c.OUTBOX_NATS_CREDS_FILE }}
{{- fail "set either nats.credsSecret or config.OUTBOX_NATS_CREDS_FILE, not both (the chart points the variable at the mounted file)" }}
{{- end }}
{{- if eq (toString $c.OUTBOX_SINK) "kafka" }}
{{- include "outbox-relay.validateKafka" . }}
{{- end }}
{{- end }}
{{- /* The sizes and timings last: they follow the settings checked above. */}}
{{- include "outbox-relay.validateTimings" . }}
{{- include "outbox-relay.validateMemory" . }}
{{- end }}

{{/*
The Kafka settings that go together, as the relay checks them at start-up
(it would exit with status 2): caught at render time instead, naming the
values. Only with OUTBOX_SINK=kafka, the one case the relay reads them.
*/}}
{{- define "outbox-relay.validateKafka" -}}
{{- $c := .Values.config }}
{{- $k := .Values.kafka }}
{{- if not $c.OUTBOX_KAFKA_BROKERS }}
{{- fail "config.OUTBOX_KAFKA_BROKERS is required when config.OUTBOX_SINK is kafka (bootstrap servers, host:port,...)" }}
{{- end }}
{{- $protocol := lower (toString (default "plaintext" $c.OUTBOX_KAFKA_SECURITY_PROTOCOL)) }}
{{- if hasPrefix "sasl_" $protocol }}
{{- if not $c.OUTBOX_KAFKA_SASL_MECHANISM }}
{{- fail (printf "config.OUTBOX_KAFKA_SASL_MECHANISM is required with config.OUTBOX_KAFKA_SECURITY_PROTOCOL=%s (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)" $protocol) }}
{{- end }}
{{- if not $c.OUTBOX_KAFKA_SASL_USERNAME }}
{{- fail (printf "config.OUTBOX_KAFKA_SASL_USERNAME is required with config.OUTBOX_KAFKA_SECURITY_PROTOCOL=%s" $protocol) }}
{{- end }}
{{- if not $k.existingSecret }}
{{- fail (printf "kafka.existingSecret is required with config.OUTBOX_KAFKA_SECURITY_PROTOCOL=%s: a Secret holding the SASL password under key %s (never a plain value)" $protocol $k.passwordKey) }}
{{- end }}
{{- else if or $c.OUTBOX_KAFKA_SASL_MECHANISM $c.OUTBOX_KAFKA_SASL_USERNAME $k.existingSecret }}
{{- fail (printf "config.OUTBOX_KAFKA_SASL_MECHANISM, config.OUTBOX_KAFKA_SASL_USERNAME and kafka.existingSecret are for config.OUTBOX_KAFKA_SECURITY_PROTOCOL sasl_ssl or sasl_plaintext, not %s" $protocol) }}
{{- end }}
{{- if and (not (has $protocol (list "ssl" "sasl_ssl"))) (or $c.OUTBOX_KAFKA_CA_FILE $c.OUTBOX_KAFKA_CLIENT_CERT_FILE $c.OUTBOX_KAFKA_CLIENT_KEY_FILE) }}
{{- fail (printf "config.OUTBOX_KAFKA_CA_FILE, OUTBOX_KAFKA_CLIENT_CERT_FILE and OUTBOX_KAFKA_CLIENT_KEY_FILE are for config.OUTBOX_KAFKA_SECURITY_PROTOCOL ssl or sasl_ssl, not %s" $protocol) }}
{{- end }}
{{- if ne (empty $c.OUTBOX_KAFKA_CLIENT_CERT_FILE) (empty $c.OUTBOX_KAFKA_CLIENT_KEY_FILE) }}
{{- fail "config.OUTBOX_KAFKA_CLIENT_CERT_FILE and config.OUTBOX_KAFKA_CLIENT_KEY_FILE go together (mutual TLS)" }}
{{- end }}
{{- end }}

{{/*
TOML of a dict given as YAML text. Helm reads every YAML number of a values
file as float64, which toToml writes as 200.0, and the relay takes counts as
integers: whole numbers are written back as such.
*/}}
{{- define "outbox-relay.toml" -}}
# Written by the Helm chart from its configFile and sources values.
{{ regexReplaceAll "(?m)^(\\s*[A-Za-z0-9_.\"-]+ = -?[0-9]+)\\.0$" (toToml (fromYaml .)) "${1}" }}
{{- end }}

{{/*
The relay's configuration file: configFile, with a [[source]] table for each
of sources.
*/}}
{{- define "outbox-relay.configToml" -}}
{{- include "outbox-relay.toml" (include "outbox-relay.fileValues" .) }}
{{- end }}

{{/*
"true" when the relay pods get a configuration file.
*/}}
{{- define "outbox-relay.hasFile" -}}
{{- if or .Values.configFile .Values.sources }}true{{ end }}
{{- end }}

{{- define "outbox-relay.configDir" -}}
/etc/outbox-relay/config
{{- end }}

{{- define "outbox-relay.configPath" -}}
{{ include "outbox-relay.configDir" . }}/outbox-relay.toml
{{- end }}

{{/*
"true" when the file has destinations: the relay then reads no sink variable
(OUTBOX_SINK, OUTBOX_AMQP_*, …) of its environment, and warns if one is set.
*/}}
{{- define "outbox-relay.routed" -}}
{{- if and .Values.configFile .Values.configFile.destination }}true{{ end }}
{{- end }}

{{/*
"true" for a variable that is a sink setting (a destination's key in the
file): the chart leaves these out of the environment when the file has
destinations.
*/}}
{{- define "outbox-relay.isSinkVar" -}}
{{- if or (has . (list "OUTBOX_SINK" "OUTBOX_MESSAGE_FORMAT" "OUTBOX_CLOUDEVENTS_SOURCE")) (regexMatch "^OUTBOX_(AMQP|SQS|NATS|KAFKA)_" .) }}true{{ end }}
{{- end }}

{{/*
The checks of configFile that values.schema.json cannot express. The relay
makes them too (exit 2 at start-up); here they fail the render instead,
naming the value.

A top-level key of the file is a relay setting, and a set environment
variable wins over the file: a key whose variable the chart also sets (from
config, a Secret or extraEnv) would be ignored without a word, so each
setting has one place.
*/}}
{{- define "outbox-relay.validateConfigFile" -}}
{{- $file := .Values.configFile }}
{{- $routed := include "outbox-relay.routed" . }}
{{- $setBy := dict }}
{{- if not .Values.sources }}
{{- $_ := set $setBy "OUTBOX_DATABASE_URL" "database.existingSecret" }}
{{- if .Values.database.listenSecretKey }}{{ $_ := set $setBy "OUTBOX_LISTEN_DATABASE_URL" "database.listenSecretKey" }}{{ end }}
{{- end }}
{{- if .Values.amqp.existingSecret }}{{ $_ := set $setBy "OUTBOX_AMQP_URL" "amqp.existingSecret" }}{{ end }}
{{- if .Values.nats.existingSecret }}{{ $_ := set $setBy "OUTBOX_NATS_URL" "nats.existingSecret" }}{{ end }}
{{- if .Values.kafka.existingSecret }}{{ $_ := set $setBy "OUTBOX_KAFKA_SASL_PASSWORD" "kafka.existingSecret" }}{{ end }}
{{- if and .Values.nats.credsSecret (not $routed) }}{{ $_ := set $setBy "OUTBOX_NATS_CREDS_FILE" "nats.credsSecret" }}{{ end }}
{{- range .Values.extraEnv }}{{ $_ := set $setBy (toString .name) "extraEnv" }}{{ end }}
{{- if hasKey $file "source" }}
{{- fail "configFile.source: list the sources in the chart's sources value instead: it writes their [[source]] tables, gives each its database URL from its Secret, and scopes their alerts" }}
{{- end }}
{{- range $key, $value := $file }}
{{- if not (has $key (list "destination" "route")) }}
{{- $var := printf "OUTBOX_%s" (upper $key) }}
{{- if and $.Values.sources (has $key (list "database_url" "table" "database_pooler" "listen_database_url")) }}
{{- fail (printf "configFile.%s: with sources, each source's database settings go in its entry of sources (the relay refuses top-level database keys beside [[source]] tables)" $key) }}
{{- else if has $key (list "http_addr" "publish_timeout") }}
{{- fail (printf "configFile.%s: set config.%s instead: the chart derives the pods' port and probes, and its checks of terminationGracePeriodSeconds and the liveness probe, from config" $key $var) }}
{{- else if and $routed (include "outbox-relay.isSinkVar" $var) }}
{{- fail (printf "configFile.%s: a sink setting at the top level of a file with configFile.destination; it belongs in a destination" $key) }}
{{- else if hasKey $setBy $var }}
{{- fail (printf "configFile.%s: the chart sets %s from %s, and the environment wins over the file" $key $var (get $setBy $var)) }}
{{- else if ne (include "outbox-relay.envValue" (get $.Values.config $var)) "" }}
{{- fail (printf "configFile.%s: config.%s is set too (%s), and the environment wins over the file: set it in one place (config.%s: null leaves the variable unset)" $key $var (include "outbox-relay.envValue" (get $.Values.config $var)) $var) }}
{{- end }}
{{- end }}
{{- end }}
{{- if $routed }}
{{- range $secret := list (list "amqp.existingSecret" $.Values.amqp.existingSecret "OUTBOX_AMQP_URL") (list "nats.existingSecret" $.Values.nats.existingSecret "OUTBOX_NATS_URL") (list "kafka.existingSecret" $.Values.kafka.existingSecret "OUTBOX_KAFKA_SASL_PASSWORD") }}
{{- if index $secret 1 }}
{{- fail (printf "%s sets %s, which the relay does not read when configFile has destinations: write the destination's setting as \"${VAR}\" and give VAR from the Secret through extraEnv (secretKeyRef)" (index $secret 0) (index $secret 2)) }}
{{- end }}
{{- end }}
{{- $named := dict }}
{{- range $i, $d := $file.destination }}
{{- if hasKey $named (toString $d.name) }}
{{- fail (printf "configFile.destination[%d]: name %q is used by an earlier destination; names are unique" $i (toString $d.name)) }}
{{- end }}
{{- $_ := set $named (toString $d.name) false }}
{{- end }}
{{- if and (gt (len $file.destination) 1) (not $file.route) }}
{{- fail (printf "configFile: %d destinations and no configFile.route: with several destinations, routes say which events go where" (len $file.destination)) }}
{{- end }}
{{- range $i, $r := $file.route }}
{{- if not (hasKey $named (toString $r.destination)) }}
{{- fail (printf "configFile.route[%d]: destination %q is not in configFile.destination" $i (toString $r.destination)) }}
{{- end }}
{{- $_ := set $named (toString $r.destination) true }}
{{- end }}
{{- if $file.route }}
{{- range $name, $used := $named }}
{{- if not $used }}
{{- fail (printf "configFile.destination: %q is named by no route, so no event would reach it" $name) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The certificate files of tls.existingSecret: the pod volume and the
container mount, shared by the Deployment and the migrate Job (the database
URL's sslrootcert, sslcert and sslkey name them). World-readable inside the
pod: the relay runs as a non-root user the Secret's files would otherwise
not be readable by, and it is the only process in its container.
*/}}
{{- define "outbox-relay.tlsVolume" -}}
{{- if .Values.tls.existingSecret }}
- name: tls
  secret:
    secretName: {{ .Values.tls.existingSecret }}
    defaultMode: 0444
{{- end }}
{{- end }}

{{- define "outbox-relay.tlsMount" -}}
{{- if .Values.tls.existingSecret }}
- name: tls
  mountPath: {{ .Values.tls.mountPath }}
  readOnly: true
{{- end }}
{{- end }}

{{/*
The NATS credentials file of nats.credsSecret, for the relay pods only: the
migrate Job talks to no broker.
*/}}
{{- define "outbox-relay.natsVolume" -}}
{{- if .Values.nats.credsSecret }}
- name: nats-creds
  secret:
    secretName: {{ .Values.nats.credsSecret }}
    defaultMode: 0444
    items:
      - key: {{ .Values.nats.credsKey }}
        path: {{ .Values.nats.credsKey }}
{{- end }}
{{- end }}

{{- define "outbox-relay.natsMount" -}}
{{- if .Values.nats.credsSecret }}
- name: nats-creds
  mountPath: {{ .Values.nats.credsMountPath }}
  readOnly: true
{{- end }}
{{- end }}

{{/*
The configuration file's volume and mount, for the Deployment (ConfigMap
<fullname>-config) and the migrate Job (<fullname>-migrate-config, its
database part, a hook that exists before the release's own objects do).
Called with a dict: root (the chart's context), enabled (whether the pod
has a file) and configMap (the name).
*/}}
{{- define "outbox-relay.configVolume" -}}
{{- if .enabled }}
- name: config
  configMap:
    name: {{ .configMap }}
    defaultMode: 0444
{{- end }}
{{- end }}

{{- define "outbox-relay.configMount" -}}
{{- if .enabled }}
- name: config
  mountPath: {{ include "outbox-relay.configDir" .root }}
  readOnly: true
{{- end }}
{{- end }}
