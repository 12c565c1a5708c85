{{/*
Sources: the databases one relay serves (values `sources`), each written as
a [[source]] table of the configuration file, its database URL given as
"${OUTBOX_SOURCE_<NAME>_DATABASE_URL}" and that variable taken from the
source's Secret. Without sources the relay serves the one database of
`database` (OUTBOX_DATABASE_URL), as it always has.
*/}}

{{/*
The variable holding one of a source's secrets: called with a dict of name
(the source's) and what (DATABASE_URL, LISTEN_DATABASE_URL). A name is
[a-z0-9_-]: upper case, '-' as '_' (validateSources refuses two names that
give the same variable).
*/}}
{{- define "outbox-relay.sourceVar" -}}
{{- printf "OUTBOX_SOURCE_%s_%s" (.name | toString | replace "-" "_" | upper) .what }}
{{- end }}

{{/*
The relay's configuration file as YAML: configFile, plus one [[source]]
table per entry of sources (its database keys, then its own relay
settings).
*/}}
{{- define "outbox-relay.fileValues" -}}
{{- $file := deepCopy (default dict .Values.configFile) }}
{{- if .Values.sources }}
{{- $tables := list }}
{{- range .Values.sources }}
{{- $table := dict "name" .name "database_url" (printf "${%s}" (include "outbox-relay.sourceVar" (dict "name" .name "what" "DATABASE_URL"))) }}
{{- with .table }}{{ $_ := set $table "table" . }}{{ end }}
{{- with .pooler }}{{ $_ := set $table "database_pooler" . }}{{ end }}
{{- if .listenDatabaseUrlSecret }}
{{- $_ := set $table "listen_database_url" (printf "${%s}" (include "outbox-relay.sourceVar" (dict "name" .name "what" "LISTEN_DATABASE_URL"))) }}
{{- end }}
{{- range $key, $value := .settings }}{{ $_ := set $table $key $value }}{{ end }}
{{- $tables = append $tables $table }}
{{- end }}
{{- $_ := set $file "source" $tables }}
{{- end }}
{{- toYaml $file }}
{{- end }}

{{/*
The migrate Job's configuration file as YAML: only what `migrate` reads, the
database settings. No destination, no route and no relay setting, so that
none of the broker secrets their "${VAR}"s name is needed in a DDL pod, and
a missing broker Secret cannot block a migration. Each source keeps its
name, URL, table, pooler and notify_trigger; no LISTEN URL (migrate does not
listen). Empty when there is nothing to say beyond the environment.
*/}}
{{- define "outbox-relay.migrateFileValues" -}}
{{- $file := dict }}
{{- range $key := list "table" "database_pooler" "notify_trigger" }}
{{- if and $.Values.configFile (hasKey $.Values.configFile $key) }}
{{- $_ := set $file $key (get $.Values.configFile $key) }}
{{- end }}
{{- end }}
{{- if .Values.sources }}
{{- $tables := list }}
{{- range .Values.sources }}
{{- $table := dict "name" .name "database_url" (printf "${%s}" (include "outbox-relay.sourceVar" (dict "name" .name "what" "DATABASE_URL"))) }}
{{- with .table }}{{ $_ := set $table "table" . }}{{ end }}
{{- with .pooler }}{{ $_ := set $table "database_pooler" . }}{{ end }}
{{- if and .settings (hasKey .settings "notify_trigger") }}{{ $_ := set $table "notify_trigger" .settings.notify_trigger }}{{ end }}
{{- $tables = append $tables $table }}
{{- end }}
{{- $_ := set $file "source" $tables }}
{{- end }}
{{- if $file }}{{ toYaml $file }}{{ end }}
{{- end }}

{{- define "outbox-relay.migrateToml" -}}
{{- include "outbox-relay.toml" (include "outbox-relay.migrateFileValues" .) }}
{{- end }}

{{/*
The checks of sources that values.schema.json cannot express, made by the
relay too at start-up (exit 2), here at render time naming the value.
*/}}
{{- define "outbox-relay.validateSources" -}}
{{- if .Values.sources }}
{{- $names := dict }}
{{- $vars := dict }}
{{- range $i, $s := .Values.sources }}
{{- if hasKey $names $s.name }}
{{- fail (printf "sources[%d]: name %q is used by an earlier source; names are unique (each is a metrics label)" $i $s.name) }}
{{- end }}
{{- $_ := set $names $s.name false }}
{{- $var := include "outbox-relay.sourceVar" (dict "name" $s.name "what" "DATABASE_URL") }}
{{- if hasKey $vars $var }}
{{- fail (printf "sources[%d]: name %q gives the variable %s, as source %q does: rename one (the chart writes '-' as '_')" $i $s.name $var (get $vars $var)) }}
{{- end }}
{{- $_ := set $vars $var $s.name }}
{{- end }}
{{- if .Values.database.existingSecret }}
{{- fail "database.existingSecret: with sources, each source's database URL comes from its own databaseUrlSecret; the relay ignores OUTBOX_DATABASE_URL beside [[source]] tables" }}
{{- end }}
{{- if .Values.database.listenSecretKey }}
{{- fail "database.listenSecretKey: with sources, give each source its listenDatabaseUrlSecret instead" }}
{{- end }}
{{- if .Values.migrations.existingSecret }}
{{- fail "migrations.existingSecret: with sources, give each source its own migrateDatabaseUrlSecret (a role allowed to run DDL on its database)" }}
{{- end }}
{{- $file := default dict .Values.configFile }}
{{- $shared := false }}
{{- range $i, $r := $file.route }}
{{- if $r.source }}
{{- if not (hasKey $names (toString $r.source)) }}
{{- fail (printf "configFile.route[%d]: source %q is not in sources" $i (toString $r.source)) }}
{{- end }}
{{- $_ := set $names (toString $r.source) true }}
{{- else }}
{{- $shared = true }}
{{- end }}
{{- end }}
{{- if and $file.route (not $shared) }}
{{- range $name, $routed := $names }}
{{- if not $routed }}
{{- fail (printf "sources: no route applies to source %q: add routes that name it (source = %q), or routes that name no source" $name $name) }}
{{- end }}
{{- end }}
{{- end }}
{{- else }}
{{- range $i, $r := (default dict .Values.configFile).route }}
{{- if $r.source }}
{{- fail (printf "configFile.route[%d]: source %q, but sources is empty: a route names a source only when the relay has several" $i (toString $r.source)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The database part of a pod's environment. Called with a dict: root (the
chart's context) and migrate (true for the migrate Job, which takes the
migration's own Secrets where given and no LISTEN URL).
*/}}
{{- define "outbox-relay.databaseEnv" -}}
{{- $root := .root }}
{{- $migrate := .migrate }}
{{- if $root.Values.sources }}
{{- range $root.Values.sources }}
{{- $secret := .databaseUrlSecret }}
{{- if and $migrate .migrateDatabaseUrlSecret }}{{ $secret = .migrateDatabaseUrlSecret }}{{ end }}
- name: {{ include "outbox-relay.sourceVar" (dict "name" .name "what" "DATABASE_URL") }}
  valueFrom:
    secretKeyRef:
      name: {{ $secret.name }}
      key: {{ $secret.key }}
{{- if and (not $migrate) .listenDatabaseUrlSecret }}
- name: {{ include "outbox-relay.sourceVar" (dict "name" .name "what" "LISTEN_DATABASE_URL") }}
  valueFrom:
    secretKeyRef:
      name: {{ .listenDatabaseUrlSecret.name }}
      key: {{ .listenDatabaseUrlSecret.key }}
{{- end }}
{{- end }}
{{- else }}
- name: OUTBOX_DATABASE_URL
  valueFrom:
    secretKeyRef:
      {{- if and $migrate $root.Values.migrations.existingSecret }}
      name: {{ $root.Values.migrations.existingSecret }}
      key: {{ $root.Values.migrations.secretKey }}
      {{- else }}
      name: {{ include "outbox-relay.databaseSecretName" $root }}
      key: {{ $root.Values.database.secretKey }}
      {{- end }}
{{- if and (not $migrate) $root.Values.database.listenSecretKey }}
- name: OUTBOX_LISTEN_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "outbox-relay.databaseSecretName" $root }}
      key: {{ $root.Values.database.listenSecretKey }}
{{- end }}
{{- end }}
{{- end }}
