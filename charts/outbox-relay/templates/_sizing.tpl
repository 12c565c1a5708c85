{{/*
Timings and memory, derived from the relay's settings and its fixed bounds,
so that the probes, the grace period and the memory limit follow the
configuration instead of being guessed. docs/deployment.md ("Probes, grace
period and memory") has the same arithmetic; .ci/deploy_checks.py redoes it.
*/}}

{{/*
Seconds /readyz may take: it asks the database(s) and the sink(s), each
bounded by 3 s (src/http.rs, PROBE_TIMEOUT): 6 s if one waits for the other
(they are asked together today; the bound does not rest on that), plus 1 s
for the answer to travel. A probe timeout below it turns a slow but healthy dependency into
an unready pod.
*/}}
{{- define "outbox-relay.readyzSeconds" -}}7{{- end }}

{{/*
Seconds a relay may need between SIGTERM and exit: the batch in flight
(OUTBOX_PUBLISH_TIMEOUT, plus the 2 s a sink has to hand back its outcomes),
the statement recording them (bounded by 30 s) and, if that fails, its
retries (10 s once stopping), then the HTTP endpoints' drain (2 s):
OUTBOX_PUBLISH_TIMEOUT + 44 s, 74 s with the defaults.
*/}}
{{- define "outbox-relay.stopSeconds" -}}
{{- $publish := include "outbox-relay.durationSeconds" .Values.config.OUTBOX_PUBLISH_TIMEOUT | int64 }}
{{- add $publish 2 30 10 2 }}
{{- end }}

{{/*
The pod's grace period: terminationGracePeriodSeconds when set, else the
stop time plus 6 s for the kubelet's signal and the process's exit (80 s
with the defaults).
*/}}
{{- define "outbox-relay.gracePeriod" -}}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- add (include "outbox-relay.stopSeconds" . | int64) 6 }}
{{- else }}
{{- .Values.terminationGracePeriodSeconds | int64 }}
{{- end }}
{{- end }}

{{/*
The readiness probe's timeout: readinessProbe.timeoutSeconds when set, else
what /readyz may take.
*/}}
{{- define "outbox-relay.readinessTimeout" -}}
{{- if kindIs "invalid" .Values.readinessProbe.timeoutSeconds }}
{{- include "outbox-relay.readyzSeconds" . }}
{{- else }}
{{- .Values.readinessProbe.timeoutSeconds | int64 }}
{{- end }}
{{- end }}

{{/*
Bytes in a Kubernetes memory quantity (268435456, 256Mi, 1Gi, 500M, 1.5Gi).
*/}}
{{- define "outbox-relay.quantityBytes" -}}
{{- $q := include "outbox-relay.envValue" . }}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" $q }}
{{- $unit := trimPrefix $number $q }}
{{- $units := dict "" 1 "k" 1000 "K" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 }}
{{- if or (not $number) (not (hasKey $units $unit)) }}
{{- fail (printf "cannot read the memory quantity %q (write e.g. 320Mi or 1Gi)" $q) }}
{{- end }}
{{- mulf (float64 $number) (get $units $unit) | int64 }}
{{- end }}

{{/*
A relay setting as the relay sees it: the config variable when set (the
environment wins over the file), else the file's top-level key, else the
relay's default. Called with a dict: root, var, key, default.
*/}}
{{- define "outbox-relay.setting" -}}
{{- $env := include "outbox-relay.envValue" (get .root.Values.config .var) }}
{{- $file := default dict .root.Values.configFile }}
{{- if ne $env "" }}{{ $env }}
{{- else if hasKey $file .key }}{{ include "outbox-relay.envValue" (get $file .key) }}
{{- else }}{{ .default }}
{{- end }}
{{- end }}

{{/*
Memory the relay needs, in bytes, by its sizing rule: each worker holds one
batch, which takes about 4 times its payload bytes at its peak (the JSON
text read from the database, the message built from it, the client's
buffer and its TLS copy), so OUTBOX_WORKERS x OUTBOX_MAX_BATCH_BYTES x 4,
summed over the sources (each has its own workers), plus 64 MiB for the
runtime, the connection pools, TLS and the Kafka client's queues.
*/}}
{{- define "outbox-relay.memoryNeed" -}}
{{- $workers := include "outbox-relay.setting" (dict "root" . "var" "OUTBOX_WORKERS" "key" "workers" "default" "4") | int64 }}
{{- $bytes := include "outbox-relay.setting" (dict "root" . "var" "OUTBOX_MAX_BATCH_BYTES" "key" "max_batch_bytes" "default" "16777216") | int64 }}
{{- $batches := 0 }}
{{- if .Values.sources }}
{{- range .Values.sources }}
{{- $s := default dict .settings }}
{{- $w := $workers }}{{ if hasKey $s "workers" }}{{ $w = include "outbox-relay.envValue" $s.workers | int64 }}{{ end }}
{{- $b := $bytes }}{{ if hasKey $s "max_batch_bytes" }}{{ $b = include "outbox-relay.envValue" $s.max_batch_bytes | int64 }}{{ end }}
{{- $batches = add $batches (mul $w $b) }}
{{- end }}
{{- else }}
{{- $batches = mul $workers $bytes }}
{{- end }}
{{- add (mul $batches 4) 67108864 }}
{{- end }}

{{/*
Checks of the timings: the grace period covers the stop time, the readiness
probe waits for /readyz, the liveness probe outlasts a slow publish.
*/}}
{{- define "outbox-relay.validateTimings" -}}
{{- $c := .Values.config }}
{{- $timeout := include "outbox-relay.durationSeconds" $c.OUTBOX_PUBLISH_TIMEOUT | int64 }}
{{- $stop := include "outbox-relay.stopSeconds" . | int64 }}
{{- $grace := include "outbox-relay.gracePeriod" . | int64 }}
{{- if lt $grace $stop }}
{{- fail (printf "terminationGracePeriodSeconds=%d is below the %ds a stopping relay may need (config.OUTBOX_PUBLISH_TIMEOUT %s + 2 s for the sink's outcomes + 30 s to record them + 10 s of retries + 2 s of HTTP drain): it would be killed while recording its batch. Leave it empty to derive it" $grace $stop (toString $c.OUTBOX_PUBLISH_TIMEOUT)) }}
{{- end }}
{{- $ready := include "outbox-relay.readinessTimeout" . | int64 }}
{{- $readyz := include "outbox-relay.readyzSeconds" . | int64 }}
{{- if lt $ready $readyz }}
{{- fail (printf "readinessProbe.timeoutSeconds=%d is below the %ds /readyz may take (the database and the sink, 3 s each, + 1 s): a slow but working dependency would make the pod unready. Leave it empty to derive it" $ready $readyz) }}
{{- end }}
{{- $liveness := mul (int64 .Values.livenessProbe.periodSeconds) (int64 .Values.livenessProbe.failureThreshold) }}
{{- if le $liveness $timeout }}
{{- fail (printf "livenessProbe.periodSeconds x failureThreshold = %ds must be greater than config.OUTBOX_PUBLISH_TIMEOUT (%ds), or the kubelet may kill a relay waiting on a slow publish" $liveness $timeout) }}
{{- end }}
{{- end }}

{{/*
Checks of the memory: a limit below the sizing rule gets the relay
OOM-killed with a batch in flight (each of its rows charged an attempt), and
a request below the limit lets the node overcommit the memory the relay is
sized to use, so the two are equal.
*/}}
{{- define "outbox-relay.validateMemory" -}}
{{- $r := .Values.resources }}
{{- $limit := include "outbox-relay.quantityBytes" $r.limits.memory | int64 }}
{{- $request := include "outbox-relay.quantityBytes" $r.requests.memory | int64 }}
{{- $need := include "outbox-relay.memoryNeed" . | int64 }}
{{- if lt $limit $need }}
{{- fail (printf "resources.limits.memory=%s (%d MiB) is below the relay's sizing rule: workers x max batch bytes x 4 + 64 MiB = %d MiB for these settings (summed over the sources). Raise the limit, or lower OUTBOX_MAX_BATCH_BYTES or OUTBOX_WORKERS" (include "outbox-relay.envValue" $r.limits.memory) (div $limit 1048576) (div (add $need 1048575) 1048576)) }}
{{- end }}
{{- if ne $request $limit }}
{{- fail (printf "resources.requests.memory=%s must equal resources.limits.memory=%s: the relay is sized to use its limit, and a lower request lets the node overcommit it (an OOM kill charges every row in flight an attempt)" (include "outbox-relay.envValue" $r.requests.memory) (include "outbox-relay.envValue" $r.limits.memory)) }}
{{- end }}
{{- end }}
