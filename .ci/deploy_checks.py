#!/usr/bin/env python3
"""Assertions on the deployment files, run by .ci/deploy-checks.

    deploy_checks.py RENDER_DIR

RENDER_DIR holds the chart rendered by `helm template` (see deploy-checks):
  default.yaml          default values (newest Kubernetes)
  default-k125.yaml     default values for Kubernetes 1.25 (the oldest supported)
  rules-default.yaml    default values plus prometheusRule/serviceMonitor/grafanaDashboard enabled
  full.yaml             ci/full-values.yaml (every setting non-default)
  kafka.yaml            ci/kafka-values.yaml (the Kafka sink with SASL over TLS)
  routes.yaml           ci/routes-values.yaml (configFile: two destinations, two routes)
  sources.yaml          ci/sources-values.yaml (three sources, per-source alerts)
  release-orders.yaml   ci/release-orders-values.yaml, release orders in namespace shop
  release-payments.yaml ci/release-payments-values.yaml, release payments in namespace billing
This script writes into it, for promtool and kubernetes-validate:
  rules/*.rules.yml     the PrometheusRule specs as rule files, and the unit
                        tests of ci/rules-tests/ beside them
  sidecar-N.yaml        the sidecar examples of the chart README

Each check names the file and what is wrong; all failures are reported, and
the exit status is 1 if there is any. The checks are grouped by the point of
issue #27 (and #25, sources) they keep from coming back; docs/deployment.md
("What CI checks") lists them.
"""

import base64
import copy
import fnmatch
import hashlib
import json
import os
import re
import shutil
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "outbox-relay"
RULES_FILE = CHART / "files" / "outbox-relay.rules.yml"
DASHBOARD_FILE = ROOT / "deploy" / "grafana" / "outbox-relay.json"
DASHBOARD_COPY = CHART / "files" / "outbox-relay.json"
OPERATIONS = ROOT / "docs" / "operations.md"
AGE_ALERT = "OutboxOldestUnpublishedAgeHigh"
ALERTS = {AGE_ALERT, "OutboxQuarantinedEvents", "OutboxRelayDown", "OutboxRelayReplicaDown",
          "OutboxPublishFailuresHigh", "OutboxGaugesStale", "OutboxDestinationNotReady", "OutboxSourceDown"}
JOB_MATCHER = 'job="outbox-relay"'

# The relay's fixed bounds the chart derives its timings from (templates/_sizing.tpl).
READYZ_SECONDS = 2 * 3 + 1           # database and sink, 3 s each, + 1 s
STOP_EXTRA_SECONDS = 2 + 30 + 10 + 2  # sink grace, record statement, its retries, HTTP drain
GRACE_MARGIN_SECONDS = 6
MIB = 1024 * 1024
MEMORY_BASE = 64 * MIB               # runtime, pools, TLS, the Kafka client's queues
MEMORY_PER_BATCH_BYTE = 4            # a batch's payload text, message, client buffer, TLS copy
HELM_DEFAULT_TIMEOUT = 300           # helm install/upgrade --timeout default, seconds


def readme_variables():
    """The relay's environment variables as the README's "Configuration"
    table promises them: the chart must accept each under `config` (issue
    #27, point 3). RUST_LOG is named in that table's text."""
    readme = (ROOT / "README.md").read_text()
    section = re.search(r"^## Configuration\n(.*?)(?=^## )", readme, re.S | re.M)
    names = set()
    for line in (section.group(1) if section else "").splitlines():
        if line.startswith("| `"):
            first = line.split("|")[1]
            names |= set(re.findall(r"`((?:OUTBOX|AWS)_[A-Z0-9_]+)`", first))
    return sorted(names | {"RUST_LOG"})


SPEC_VARS = [v for v in readme_variables() if v != "OUTBOX_CONFIG"]  # the chart owns OUTBOX_CONFIG (configFile)
# Variables that hold passwords: in the chart they come only from Secrets
# (database.*, sources, kafka.existingSecret), never from `config`.
SECRET_VARS = {"OUTBOX_DATABASE_URL", "OUTBOX_LISTEN_DATABASE_URL", "OUTBOX_KAFKA_SASL_PASSWORD"}
# The database settings of the environment, which the relay ignores beside [[source]] tables.
DATABASE_VARS = {"OUTBOX_DATABASE_URL", "OUTBOX_TABLE", "OUTBOX_DATABASE_POOLER", "OUTBOX_LISTEN_DATABASE_URL"}
# What the migrate Job may see of config (issue #27, point 8).
MIGRATE_VARS = {"OUTBOX_TABLE", "OUTBOX_DATABASE_POOLER", "OUTBOX_NOTIFY_TRIGGER", "OUTBOX_LOG_FORMAT", "RUST_LOG"}
# Variables naming files the relay reads at start-up.
FILE_VARS = ["OUTBOX_AMQP_CA_FILE", "OUTBOX_AMQP_CLIENT_CERT_FILE", "OUTBOX_AMQP_CLIENT_KEY_FILE",
             "OUTBOX_NATS_CREDS_FILE", "OUTBOX_NATS_CA_FILE",
             "OUTBOX_KAFKA_CA_FILE", "OUTBOX_KAFKA_CLIENT_CERT_FILE", "OUTBOX_KAFKA_CLIENT_KEY_FILE"]
# Metrics named by the specification (and the relay's metric list); the alerts may only use these (and up).
SPEC_METRICS = {
    "outbox_unpublished_events", "outbox_oldest_unpublished_age_seconds",
    "outbox_quarantined_events", "outbox_events_published_total",
    "outbox_publish_failures_total", "outbox_events_quarantined_total",
    "outbox_publish_lag_seconds", "outbox_retention_deleted_total",
    "outbox_gauges_refreshed_timestamp_seconds", "outbox_destination_ready",
    "outbox_source_ready",
}
# The counters and the histogram carry a destination label (README "Routes").
# The alerts on them are per source: each sum over them must drop the destination.
DESTINATION_METRICS = {"outbox_events_published_total", "outbox_publish_failures_total",
                       "outbox_events_quarantined_total", "outbox_publish_lag_seconds"}
# A URL with a password: never a plain value in a manifest.
PASSWORD_IN_URL = re.compile(r"://[^/@\s:]+:[^/@\s]+@")
# The relay's configuration file in the pods (configFile, sources), and ${VAR} in it.
CONFIG_DIR = "/etc/outbox-relay/config"
CONFIG_PATH = f"{CONFIG_DIR}/outbox-relay.toml"
CONFIG_VAR = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# A metric selector in PromQL: the name, then its matchers if any.
SELECTOR = re.compile(r"(?<![A-Za-z0-9_:])(outbox_[a-z_]+|up)\b(\{[^}]*\})?")


def is_sink_var(name):
    """A sink setting: a destination's key in the file. With destinations the
    relay reads none of them from its environment, and the chart sets none."""
    return (name in {"OUTBOX_SINK", "OUTBOX_MESSAGE_FORMAT", "OUTBOX_CLOUDEVENTS_SOURCE"}
            or re.match(r"OUTBOX_(AMQP|SQS|NATS|KAFKA)_", name) is not None)


def routed(values):
    return bool((values.get("configFile") or {}).get("destination"))


failures = []
notes = []


def check(condition, where, message):
    if not condition:
        failures.append(f"{where}: {message}")
    return bool(condition)


def load_all(path):
    return [doc for doc in yaml.safe_load_all(Path(path).read_text()) if doc]


def deep_merge(base, override):
    out = copy.deepcopy(base)
    for key, value in (override or {}).items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def seconds(duration):
    """Seconds in a duration of the specification's form (500ms, 30s, 5m, 7d)."""
    m = re.fullmatch(r"([0-9]+)(ms|s|m|h|d)", str(duration))
    if not m:
        raise ValueError(f"not a duration: {duration!r}")
    n, unit = int(m.group(1)), m.group(2)
    return {"ms": n / 1000, "s": n, "m": n * 60, "h": n * 3600, "d": n * 86400}[unit]


def prom_seconds(duration):
    """Seconds in a Prometheus duration (1m, 1m30s, 90s)."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    parts = re.findall(r"([0-9]+)(ms|s|m|h|d|w|y)", str(duration))
    return sum(int(n) * units[u] for n, u in parts)


def quantity_bytes(quantity):
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|k|K|M|G|T)?", str(quantity))
    if not m:
        raise ValueError(f"not a memory quantity: {quantity!r}")
    factor = {None: 1, "k": 1000, "K": 1000, "M": 10**6, "G": 10**9, "T": 10**12,
              "Ki": 1024, "Mi": MIB, "Gi": 1024 * MIB, "Ti": 1024**2 * MIB}[m.group(2)]
    return int(float(m.group(1)) * factor)


def env_string(value):
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return "" if value is None else str(value)


def by_kind(docs):
    out = {}
    for doc in docs:
        out.setdefault(doc["kind"], []).append(doc)
    return out


def one(kinds, kind, where):
    found = kinds.get(kind, [])
    check(len(found) == 1, where, f"expected one {kind}, found {len(found)}")
    return found[0] if found else None


def fullname(values, release):
    if values.get("fullnameOverride"):
        return values["fullnameOverride"]
    name = values.get("nameOverride") or "outbox-relay"
    return release if name in release else f"{release}-{name}"


def source_var(name, what):
    return f"OUTBOX_SOURCE_{name.replace('-', '_').upper()}_{what}"


def setting(values, var, key, default):
    """A relay setting as the relay sees it: the variable, else the file's key, else the default."""
    env = env_string(values["config"].get(var))
    if env:
        return env
    file = values.get("configFile") or {}
    return env_string(file[key]) if key in file else default


# --- issue #27 point 4: timings, point 3: memory ---------------------------

def stop_seconds(values):
    return int(seconds(values["config"]["OUTBOX_PUBLISH_TIMEOUT"])) + STOP_EXTRA_SECONDS


def grace_period(values):
    explicit = values.get("terminationGracePeriodSeconds")
    return int(explicit) if explicit is not None else stop_seconds(values) + GRACE_MARGIN_SECONDS


def readiness_timeout(values):
    explicit = values["readinessProbe"].get("timeoutSeconds")
    return int(explicit) if explicit is not None else READYZ_SECONDS


def memory_need(values):
    """The sizing rule: workers x max batch bytes x 4 per source, + 64 MiB."""
    workers = int(setting(values, "OUTBOX_WORKERS", "workers", "4"))
    batch_bytes = int(setting(values, "OUTBOX_MAX_BATCH_BYTES", "max_batch_bytes", "16777216"))
    sources = values.get("sources") or []
    if sources:
        batches = sum(int((s.get("settings") or {}).get("workers", workers))
                      * int((s.get("settings") or {}).get("max_batch_bytes", batch_bytes)) for s in sources)
    else:
        batches = workers * batch_bytes
    return batches * MEMORY_PER_BATCH_BYTE + MEMORY_BASE


# --- the configuration file (configFile, sources) ---------------------------

def file_values(values):
    """What the chart writes into the relay's configuration file."""
    file = copy.deepcopy(values.get("configFile") or {})
    sources = values.get("sources") or []
    if sources:
        tables = []
        for s in sources:
            table = {"name": s["name"], "database_url": "${%s}" % source_var(s["name"], "DATABASE_URL")}
            if s.get("table"):
                table["table"] = s["table"]
            if s.get("pooler"):
                table["database_pooler"] = s["pooler"]
            if s.get("listenDatabaseUrlSecret"):
                table["listen_database_url"] = "${%s}" % source_var(s["name"], "LISTEN_DATABASE_URL")
            table.update(s.get("settings") or {})
            tables.append(table)
        file["source"] = tables
    return file


def migrate_file_values(values):
    """The migrate Job's file: the database keys only (issue #27, point 8)."""
    file = {k: v for k, v in (values.get("configFile") or {}).items()
            if k in {"table", "database_pooler", "notify_trigger"}}
    sources = values.get("sources") or []
    if sources:
        tables = []
        for s in sources:
            table = {"name": s["name"], "database_url": "${%s}" % source_var(s["name"], "DATABASE_URL")}
            if s.get("table"):
                table["table"] = s["table"]
            if s.get("pooler"):
                table["database_pooler"] = s["pooler"]
            if "notify_trigger" in (s.get("settings") or {}):
                table["notify_trigger"] = s["settings"]["notify_trigger"]
            tables.append(table)
        file["source"] = tables
    return file


def same(a, b):
    """Equal, and of the same types all the way down: TOML tells 8 from 8.0
    where Python's == does not."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def integral(value):
    """Values as the chart writes them: whole numbers as integers."""
    if isinstance(value, dict):
        return {k: integral(v) for k, v in value.items()}
    if isinstance(value, list):
        return [integral(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def config_strings(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from config_strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from config_strings(v)
    elif isinstance(value, str):
        yield value


# --- chart: workloads -----------------------------------------------------

def check_tls_files(pod, container, values, where, nats_creds=True):
    """The certificate Secret is mounted read-only where tls.mountPath says,
    and every file variable points into a mounted directory. The NATS
    credentials file only in the relay pods (nats_creds)."""
    tls = values["tls"]
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    mounts = container.get("volumeMounts") or []
    if tls.get("existingSecret"):
        volume = volumes.get("tls", {})
        check(volume.get("secret", {}).get("secretName") == tls["existingSecret"], where,
              f"volume tls must be Secret {tls['existingSecret']}, got {volume}")
        check({"name": "tls", "mountPath": tls["mountPath"], "readOnly": True} in mounts, where,
              f"the tls volume must be mounted read-only at {tls['mountPath']}, got {mounts}")
    else:
        check("tls" not in volumes, where, "no tls volume without tls.existingSecret")
    nats = values["nats"]
    if nats.get("credsSecret") and nats_creds:
        volume = volumes.get("nats-creds", {})
        check(volume.get("secret", {}).get("secretName") == nats["credsSecret"], where,
              f"volume nats-creds must be Secret {nats['credsSecret']}, got {volume}")
        check({"name": "nats-creds", "mountPath": nats["credsMountPath"], "readOnly": True} in mounts, where,
              f"the nats-creds volume must be mounted read-only at {nats['credsMountPath']}, got {mounts}")
    else:
        check("nats-creds" not in volumes, where, "no nats-creds volume (without nats.credsSecret, or in the migrate Job)")
    env = {e["name"]: e.get("value", "") for e in container.get("env", [])}
    dirs = [m["mountPath"].rstrip("/") + "/" for m in mounts]
    for name in FILE_VARS:
        path = env.get(name, "")
        if path:
            check(any(path.startswith(d) for d in dirs), where,
                  f"{name}={path} is in no mounted directory ({dirs})")


def secret_ref(entry):
    return (entry or {}).get("valueFrom", {}).get("secretKeyRef", {})


def check_database_env(env, values, where, migrate, name):
    """The database URL(s) from Secrets only: OUTBOX_DATABASE_URL with one
    database, one OUTBOX_SOURCE_<NAME>_DATABASE_URL per source with sources
    (and then no OUTBOX_DATABASE_URL, OUTBOX_TABLE, ... which the relay
    would ignore)."""
    sources = values.get("sources") or []
    if sources:
        for var in DATABASE_VARS:
            check(var not in env, where, f"{var} beside sources (the relay ignores it, with a warning): {env.get(var)}")
        for s in sources:
            secret = s["databaseUrlSecret"]
            if migrate and s.get("migrateDatabaseUrlSecret"):
                secret = s["migrateDatabaseUrlSecret"]
            var = source_var(s["name"], "DATABASE_URL")
            check("value" not in env.get(var, {}) and secret_ref(env.get(var)) == secret, where,
                  f"{var} must come from Secret {secret}, got {env.get(var)}")
            listen = source_var(s["name"], "LISTEN_DATABASE_URL")
            if s.get("listenDatabaseUrlSecret") and not migrate:
                check(secret_ref(env.get(listen)) == s["listenDatabaseUrlSecret"], where,
                      f"{listen} must come from Secret {s['listenDatabaseUrlSecret']}, got {env.get(listen)}")
            else:
                check(listen not in env, where, f"{listen} without listenDatabaseUrlSecret, or in the migrate Job")
        return
    m = values["migrations"]
    database_secret = values["database"]["existingSecret"] or f"{name}-database"
    if migrate and m.get("existingSecret"):
        want = {"name": m["existingSecret"], "key": m["secretKey"]}
    else:
        want = {"name": database_secret, "key": values["database"]["secretKey"]}
    db = env.get("OUTBOX_DATABASE_URL", {})
    check("value" not in db and secret_ref(db) == want, where,
          f"OUTBOX_DATABASE_URL must come from Secret {want}, got {db}")
    listen_key = values["database"].get("listenSecretKey")
    listen = env.get("OUTBOX_LISTEN_DATABASE_URL")
    if listen_key and not migrate:
        check(secret_ref(listen) == {"name": database_secret, "key": listen_key} and "value" not in listen, where,
              f"OUTBOX_LISTEN_DATABASE_URL must come from Secret {database_secret}/{listen_key}, got {listen}")
    else:
        check(listen is None, where, f"OUTBOX_LISTEN_DATABASE_URL without database.listenSecretKey, or in the migrate Job: {listen}")


def check_env(container, values, where, name):
    """The relay container's environment."""
    env = {e["name"]: e for e in container.get("env", [])}
    names = [e["name"] for e in container.get("env", [])]
    check(len(names) == len(set(names)), where, f"duplicate env names: {names}")
    check_database_env(env, values, where, False, name)

    amqp = values["amqp"]
    if amqp.get("existingSecret"):
        check(secret_ref(env.get("OUTBOX_AMQP_URL")) == {"name": amqp["existingSecret"], "key": amqp["secretKey"]},
              where, f"OUTBOX_AMQP_URL must come from Secret {amqp['existingSecret']}, got {env.get('OUTBOX_AMQP_URL')}")
    nats = values["nats"]
    if nats.get("existingSecret"):
        check(secret_ref(env.get("OUTBOX_NATS_URL")) == {"name": nats["existingSecret"], "key": nats["secretKey"]},
              where, f"OUTBOX_NATS_URL must come from Secret {nats['existingSecret']}, got {env.get('OUTBOX_NATS_URL')}")
    kafka = values["kafka"]
    password = env.get("OUTBOX_KAFKA_SASL_PASSWORD")
    if kafka.get("existingSecret"):
        check("value" not in (password or {}) and secret_ref(password) == {"name": kafka["existingSecret"], "key": kafka["passwordKey"]},
              where, f"OUTBOX_KAFKA_SASL_PASSWORD must come from Secret {kafka['existingSecret']}/{kafka['passwordKey']}, got {password}")
    else:
        check(password is None, where, f"OUTBOX_KAFKA_SASL_PASSWORD without kafka.existingSecret: {password}")

    creds_file = None
    if nats.get("credsSecret") and not routed(values):
        creds_file = nats["credsMountPath"].rstrip("/") + "/" + nats["credsKey"]
        check(env.get("OUTBOX_NATS_CREDS_FILE", {}).get("value") == creds_file, where,
              f"OUTBOX_NATS_CREDS_FILE must be the mounted {creds_file}, got {env.get('OUTBOX_NATS_CREDS_FILE')}")

    config_env = env.get("OUTBOX_CONFIG")
    if file_values(values):
        check(config_env == {"name": "OUTBOX_CONFIG", "value": CONFIG_PATH}, where,
              f"OUTBOX_CONFIG must be {CONFIG_PATH} with configFile or sources, got {config_env}")
    else:
        check(config_env is None, where, f"OUTBOX_CONFIG without configFile or sources: {config_env}")

    sources = values.get("sources") or []
    for var, value in values["config"].items():
        wanted = env_string(value)
        if var == "OUTBOX_NATS_CREDS_FILE" and creds_file:
            continue
        if routed(values) and is_sink_var(var):
            check(var not in env, where,
                  f"{var} is a sink setting, which the relay does not read with configFile.destination: must be left unset, got {env.get(var)}")
        elif sources and var in DATABASE_VARS:
            continue  # check_database_env
        elif wanted == "":
            check(var not in env or "valueFrom" in env[var], where, f"{var} is empty in values and must be left unset")
        else:
            check(env.get(var, {}).get("value") == wanted, where,
                  f"{var} must be {wanted!r} (values config), got {env.get(var)}")

    for extra in values.get("extraEnv") or []:
        check(env.get(extra["name"]) == extra, where, f"extraEnv {extra['name']} missing or changed: {env.get(extra['name'])}")
    check_no_plain_secrets(container, where)


def check_migrate_env(container, values, where, name):
    """The migrate Job's environment: the database settings only, no broker
    credential and no broker Secret (issue #27, point 8)."""
    env = {e["name"]: e for e in container.get("env", [])}
    names = [e["name"] for e in container.get("env", [])]
    check(len(names) == len(set(names)), where, f"duplicate env names: {names}")
    check_database_env(env, values, where, True, name)
    sources = values.get("sources") or []
    for var, value in values["config"].items():
        wanted = env_string(value)
        if var in MIGRATE_VARS and wanted and not (sources and var in DATABASE_VARS):
            check(env.get(var, {}).get("value") == wanted, where, f"{var} must be {wanted!r} (values config), got {env.get(var)}")
        elif var not in SECRET_VARS:
            check(var not in env, where, f"{var} is not a database setting: the migrate Job must not get it")
    allowed = ({"OUTBOX_DATABASE_URL", "OUTBOX_CONFIG"} | MIGRATE_VARS
               | {source_var(s["name"], "DATABASE_URL") for s in sources}
               | {e["name"] for e in values["migrations"].get("extraEnv") or []})
    check(set(env) <= allowed, where, f"variables beyond the database settings: {sorted(set(env) - allowed)}")
    brokers = [n for n, e in env.items() if secret_ref(e).get("name") in
               {values["amqp"].get("existingSecret"), values["nats"].get("existingSecret"), values["kafka"].get("existingSecret")} - {""}]
    check(not brokers, where, f"broker Secrets in the migrate Job: {brokers}")
    check(not container.get("envFrom"), where, "no envFrom in the migrate Job (extraEnvFrom is the relay's)")
    want_file = bool(migrate_file_values(values))
    check((env.get("OUTBOX_CONFIG", {}).get("value") == CONFIG_PATH) == want_file, where,
          f"OUTBOX_CONFIG must name {CONFIG_PATH} exactly when the Job has a file, got {env.get('OUTBOX_CONFIG')}")
    for extra in values["migrations"].get("extraEnv") or []:
        check(env.get(extra["name"]) == extra, where, f"migrations.extraEnv {extra['name']} missing or changed")
    check_no_plain_secrets(container, where)


def check_no_plain_secrets(container, where):
    for e in container.get("env", []):
        check(not PASSWORD_IN_URL.search(str(e.get("value", ""))), where,
              f"{e['name']} holds a URL with a password as a plain value")
    for arg in container.get("args", []):
        check(not PASSWORD_IN_URL.search(str(arg)), where, f"an argument holds a URL with a password: {arg}")


def check_config_file(kinds, values, name, where):
    """configFile and sources: the ConfigMap holds them as TOML, equal to the
    values with their types (sources as [[source]] tables); the relay pods
    mount it read-only, with OUTBOX_CONFIG naming it (check_env); the pod
    template's checksum follows it; every ${VAR} in it is in the relay's
    environment. The migrate Job's ConfigMap holds the database keys only.
    Without configFile and sources, none of that exists."""
    maps = {m["metadata"]["name"]: m for m in kinds.get("ConfigMap", [])}
    relay_file = file_values(values)
    migrate_file = migrate_file_values(values)
    deployments = kinds.get("Deployment", [])
    jobs = kinds.get("Job", [])
    pods = [("Deployment", d["spec"]["template"], f"{name}-config", relay_file) for d in deployments]
    pods += [("migrate Job", j["spec"]["template"], f"{name}-migrate-config", migrate_file) for j in jobs]
    check((f"{name}-config" in maps) == bool(relay_file), where,
          f"ConfigMap {name}-config must exist exactly with configFile or sources, got {sorted(maps)}")
    check((f"{name}-migrate-config" in maps) == bool(jobs and migrate_file), where,
          f"ConfigMap {name}-migrate-config must exist exactly with the migrate Job and database keys for it, got {sorted(maps)}")
    for kind, template, config_map, wanted in pods:
        w = f"{where} {kind}"
        pod = template["spec"]
        container = pod["containers"][0]
        volumes = {v["name"]: v for v in pod.get("volumes") or []}
        if not wanted:
            check("config" not in volumes, w, "a config volume without a file")
            check("checksum/config" not in (template["metadata"].get("annotations") or {}), w,
                  "checksum/config without a file")
            continue
        check(volumes.get("config", {}).get("configMap", {}).get("name") == config_map, w,
              f"volume config must be ConfigMap {config_map}, got {volumes.get('config')}")
        check({"name": "config", "mountPath": CONFIG_DIR, "readOnly": True} in (container.get("volumeMounts") or []), w,
              f"the config volume must be mounted read-only at {CONFIG_DIR}, got {container.get('volumeMounts')}")
        if not check(config_map in maps, w, f"no ConfigMap {config_map}"):
            continue
        text = maps[config_map].get("data", {}).get("outbox-relay.toml", "")
        try:
            parsed = tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            check(False, f"{where} ConfigMap {config_map}", f"outbox-relay.toml is not TOML: {error}\n{text}")
            continue
        check(same(parsed, integral(wanted)), f"{where} ConfigMap {config_map}",
              f"outbox-relay.toml differs from the values (types included):\n{text}\nwanted {integral(wanted)}")
        env = {e["name"] for e in container.get("env", [])}
        if not container.get("envFrom"):
            missing = sorted({v for s in config_strings(wanted) for v in CONFIG_VAR.findall(s)} - env)
            check(not missing, w, f"the file uses ${{VAR}} of variables the pod does not set: {missing}")
        if kind == "Deployment":
            got = (template["metadata"].get("annotations") or {}).get("checksum/config")
            check(got == hashlib.sha256(text.encode()).hexdigest(), w,
                  f"checksum/config must be the sha256 of the file, got {got}")
        else:
            annotations = maps[config_map]["metadata"].get("annotations", {})
            job_weight = int(jobs[0]["metadata"].get("annotations", {}).get("helm.sh/hook-weight", "0"))
            check(set(annotations.get("helm.sh/hook", "").split(",")) == {"pre-install", "pre-upgrade"}
                  and int(annotations.get("helm.sh/hook-weight", "0")) < job_weight, f"{where} ConfigMap {config_map}",
                  f"must be a pre-install,pre-upgrade hook created before the Job, got {annotations}")
            check(not ({"destination", "route"} & set(parsed)), f"{where} ConfigMap {config_map}",
                  "the migrate Job's file must hold no destination or route (their secrets are the relay's)")


def check_security(pod, container, where):
    psc = pod.get("securityContext", {})
    csc = container.get("securityContext", {})
    check(psc.get("runAsNonRoot") is True and csc.get("runAsNonRoot") is True,
          where, "runAsNonRoot must be true for the pod and the container")
    check(int(psc.get("runAsUser", 0)) != 0, where, "runAsUser must not be 0")
    check(csc.get("allowPrivilegeEscalation") is False, where, "allowPrivilegeEscalation must be false")
    check(csc.get("privileged") in (None, False), where, "privileged must not be true")
    check(csc.get("readOnlyRootFilesystem") is True, where, "readOnlyRootFilesystem must be true")
    check("ALL" in (csc.get("capabilities", {}).get("drop") or []), where, "capabilities must drop ALL")
    check(not (csc.get("capabilities", {}).get("add")), where, "no capabilities may be added")
    seccomp = (csc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
    check(seccomp == "RuntimeDefault", where, f"seccompProfile must be RuntimeDefault, got {seccomp}")


def check_resources(resources, where, need):
    """Point 3: request = limit, and the limit covers the sizing rule."""
    limits = (resources or {}).get("limits", {})
    requests = (resources or {}).get("requests", {})
    if not check("memory" in limits and "memory" in requests, where, f"memory request and limit needed, got {resources}"):
        return
    limit = quantity_bytes(env_string(limits["memory"]))
    check(quantity_bytes(env_string(requests["memory"])) == limit, where,
          f"memory request {requests['memory']} must equal the limit {limits['memory']} (request = limit for a relay)")
    check(limit >= need, where,
          f"memory limit {limits['memory']} is below the sizing rule, {need / MIB:.0f} MiB (workers x max batch bytes x 4 + 64 MiB)")


def check_chart_render(docs, values, label, release="ci", namespace="default"):
    where = f"chart ({label})"
    kinds = by_kind(docs)
    name = fullname(values, release)
    cfg = values["config"]
    http_port = int(str(cfg["OUTBOX_HTTP_ADDR"]).rsplit(":", 1)[1])
    timeout = seconds(cfg["OUTBOX_PUBLISH_TIMEOUT"])

    dep = one(kinds, "Deployment", where)
    pod_labels = {}
    if dep:
        spec = dep["spec"]
        pod = spec["template"]["spec"]
        pod_labels = spec["template"]["metadata"]["labels"]
        w = f"{where} Deployment"
        check(spec["replicas"] == values["replicaCount"], w, f"replicas {spec['replicas']} != replicaCount")
        check(set(spec["selector"]["matchLabels"].items()) <= set(pod_labels.items()), w, "selector does not match the pod labels")
        containers = {c["name"]: c for c in pod["containers"]}
        relay = containers.get("relay")
        if check(relay, w, "no container named relay"):
            check(relay.get("args", [None])[0] == "run", w, f"args must start with run: {relay.get('args')}")
            image = values["image"]
            want = (f"{image['repository']}@{image['digest']}" if image.get("digest")
                    else f"{image['repository']}:{image.get('tag') or CHART_YAML['appVersion']}")
            check(relay["image"] == want, w, f"image {relay['image']} != {want}")
            ports = {p["name"]: p for p in relay.get("ports", [])}
            check(ports.get("metrics", {}).get("containerPort") == http_port, w,
                  f"port `metrics` must be {http_port} (OUTBOX_HTTP_ADDR), got {relay.get('ports')}")
            for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
                get = relay.get(probe, {}).get("httpGet", {})
                check(get == {"path": path, "port": "metrics"}, w, f"{probe} must GET {path} on port metrics, got {get}")
            live = relay["livenessProbe"]
            check(live["periodSeconds"] * live["failureThreshold"] > timeout, w,
                  "liveness period x failureThreshold must exceed OUTBOX_PUBLISH_TIMEOUT")
            # Point 4: the readiness timeout covers what /readyz may take.
            ready = relay["readinessProbe"].get("timeoutSeconds")
            check(ready == readiness_timeout(values) and ready >= READYZ_SECONDS, w,
                  f"readinessProbe.timeoutSeconds must be {readiness_timeout(values)} (at least {READYZ_SECONDS}: database and sink, 3 s each), got {ready}")
            # Point 3: memory request = limit >= the sizing rule.
            check_resources(relay.get("resources"), w, memory_need(values))
            check_security(pod, relay, w)
            check_env(relay, values, w, name)
            check_tls_files(pod, relay, values, w)
        # Point 4: the grace period covers a stopping relay.
        grace = pod.get("terminationGracePeriodSeconds")
        check(grace == grace_period(values) and grace >= stop_seconds(values), w,
              f"terminationGracePeriodSeconds {grace} must be {grace_period(values)}, at least the {stop_seconds(values)} s "
              f"a stopping relay may need (OUTBOX_PUBLISH_TIMEOUT + {STOP_EXTRA_SECONDS} s)")
        check(pod.get("automountServiceAccountToken") is False, w, "automountServiceAccountToken must be false by default")
        # Point 6: spread over nodes and zones, selecting this release's pods.
        spread = pod.get("topologySpreadConstraints") or []
        for constraint in values.get("topologySpreadConstraints") or []:
            got = [c for c in spread if c.get("topologyKey") == constraint["topologyKey"]]
            if check(got, w, f"no topology spread constraint over {constraint['topologyKey']}"):
                selector = (got[0].get("labelSelector") or {}).get("matchLabels", {})
                check(selector and set(selector.items()) <= set(pod_labels.items()), w,
                      f"the spread over {constraint['topologyKey']} must select the release's pods, got {selector}")
                check(got[0].get("whenUnsatisfiable") == constraint["whenUnsatisfiable"], w,
                      f"the spread over {constraint['topologyKey']} must be {constraint['whenUnsatisfiable']}")

        sa_name = values["serviceAccount"].get("name") or name
        check(pod.get("serviceAccountName") == sa_name, w, f"serviceAccountName must be {sa_name}")
        sa = one(kinds, "ServiceAccount", where)
        if sa:
            check(sa["metadata"]["name"] == sa_name, where, "ServiceAccount name")
            check((sa["metadata"].get("annotations") or {}) == (values["serviceAccount"].get("annotations") or {}),
                  where, "ServiceAccount annotations must be those of values (IRSA)")

        svc = one(kinds, "Service", where)
        if svc:
            check(svc["metadata"]["name"] == name, where, f"the Service must be named {name}: the alerts select service=\"{name}\"")
            port = svc["spec"]["ports"][0]
            check(port["targetPort"] == "metrics" and port["port"] == values["service"]["port"], where,
                  f"Service must expose service.port -> metrics, got {port}")
            check(set(svc["spec"]["selector"].items()) <= set(pod_labels.items()), where, "Service selector does not match the pods")

        pdb = one(kinds, "PodDisruptionBudget", where) if values["podDisruptionBudget"]["enabled"] else None
        if pdb:
            check(set(pdb["spec"]["selector"]["matchLabels"].items()) <= set(pod_labels.items()), where,
                  "PDB selector does not match the pods")
            check(len({"minAvailable", "maxUnavailable"} & set(pdb["spec"])) == 1, where,
                  "PDB must set exactly one of minAvailable/maxUnavailable")

        job = one(kinds, "Job", where) if values["migrations"]["enabled"] else None
        if job:
            w = f"{where} migrate Job"
            hooks = set(job["metadata"].get("annotations", {}).get("helm.sh/hook", "").split(","))
            check(hooks == {"pre-install", "pre-upgrade"}, w, f"must be a pre-install,pre-upgrade hook (not a rollback one), got {hooks}")
            jpod = job["spec"]["template"]["spec"]
            check(jpod.get("restartPolicy") == "Never", w, "restartPolicy must be Never")
            jlabels = job["spec"]["template"]["metadata"]["labels"]
            check(not set(spec["selector"]["matchLabels"].items()) <= set(jlabels.items()), w,
                  "the Deployment's selector must not select the migrate pod")
            deadline = job["spec"].get("activeDeadlineSeconds")
            check(deadline == values["migrations"]["activeDeadlineSeconds"], w, "activeDeadlineSeconds from values")
            mig = jpod["containers"][0]
            check(mig.get("args") == ["migrate"], w, f"args must be [migrate], got {mig.get('args')}")
            check_security(jpod, mig, w)
            check_migrate_env(mig, values, w, name)
            check_tls_files(jpod, mig, values, w, nats_creds=False)

    sm = kinds.get("ServiceMonitor", [])
    check(len(sm) == (1 if values["serviceMonitor"]["enabled"] else 0), where,
          f"ServiceMonitor must exist exactly when serviceMonitor.enabled ({len(sm)} found)")
    for monitor in sm:
        ep = monitor["spec"]["endpoints"][0]
        check(ep["port"] == "metrics" and ep["path"] == "/metrics", where, "ServiceMonitor must scrape metrics:/metrics")
        check({"action": "replace", "targetLabel": "job", "replacement": "outbox-relay"} in ep.get("relabelings", []),
              where, 'ServiceMonitor must set job="outbox-relay", which the alerts select')
        check(monitor["spec"].get("namespaceSelector", {}).get("matchNames") == [namespace], where,
              f"ServiceMonitor must scrape namespace {namespace} only")

    check_config_file(kinds, values, name, where)
    check_network_policy(kinds, values, where, pod_labels, http_port)
    check_grafana_dashboard(kinds, values, where, name, namespace)

    rules = kinds.get("PrometheusRule", [])
    check(len(rules) == (1 if values["prometheusRule"]["enabled"] else 0), where,
          f"PrometheusRule must exist exactly when prometheusRule.enabled ({len(rules)} found)")
    return rules[0] if rules else None


def check_grafana_dashboard(kinds, values, where, name, namespace):
    """The dashboard ConfigMap: there exactly with grafanaDashboard.enabled,
    in its namespace, with the sidecar's label, the values' labels and
    annotations, and deploy/grafana/outbox-relay.json as it is: byte for
    byte without prometheusRule.runbookUrl, and with it, the same dashboard
    with only its runbook_url constant set to that address."""
    values_gd = values["grafanaDashboard"]
    maps = [m for m in kinds.get("ConfigMap", []) if m["metadata"]["name"] == f"{name}-dashboard"]
    if not check(len(maps) == (1 if values_gd["enabled"] else 0), where,
                 f"ConfigMap {name}-dashboard must exist exactly when grafanaDashboard.enabled ({len(maps)} found)") or not maps:
        return
    w = f"{where} ConfigMap {name}-dashboard"
    meta = maps[0]["metadata"]
    want_namespace = values_gd.get("namespace") or namespace
    check(meta.get("namespace") == want_namespace, w, f"namespace must be {want_namespace}, got {meta.get('namespace')}")
    labels = meta.get("labels") or {}
    if values_gd.get("label"):
        check(labels.get(values_gd["label"]) == env_string(values_gd["labelValue"]), w,
              f"the sidecar's label {values_gd['label']}={env_string(values_gd['labelValue'])!r} is missing, labels {labels}")
    check(set((values_gd.get("labels") or {}).items()) <= set(labels.items()), w,
          f"must carry grafanaDashboard.labels {values_gd.get('labels')}, got {labels}")
    check((meta.get("annotations") or {}) == (values_gd.get("annotations") or {}), w,
          f"annotations must be grafanaDashboard.annotations, got {meta.get('annotations')}")
    data = maps[0].get("data") or {}
    if not check(list(data) == ["outbox-relay.json"], w, f"data must be one key, outbox-relay.json, got {sorted(data)}"):
        return
    text, file_text = data["outbox-relay.json"], DASHBOARD_FILE.read_text()
    base = (values["prometheusRule"].get("runbookUrl") or "").rstrip("#")
    if not base:
        check(text == file_text.rstrip("\n"), w, f"must hold {DASHBOARD_FILE.relative_to(ROOT)} byte for byte")
        return
    want = json.loads(file_text)
    for var in want["templating"]["list"]:
        if var["name"] == "runbook_url":
            var.update(query=base, current={"text": base, "value": base, "selected": True},
                       options=[{"text": base, "value": base, "selected": True}])
    try:
        got = json.loads(text)
    except json.JSONDecodeError as error:
        check(False, w, f"outbox-relay.json is not JSON: {error}")
        return
    check(got == want, w, f"must be {DASHBOARD_FILE.relative_to(ROOT)} with its runbook_url constant set to "
          f"prometheusRule.runbookUrl ({base}) and nothing else changed")


def broker_ports(values):
    """The broker ports the NetworkPolicy must open, as the chart derives them."""
    np = values["networkPolicy"]
    if np["broker"].get("ports"):
        return set(np["broker"]["ports"])
    if routed(values):
        destinations = values["configFile"]["destination"]
    else:
        cfg = values["config"]
        destinations = [{"sink": cfg["OUTBOX_SINK"], "kafka_brokers": cfg.get("OUTBOX_KAFKA_BROKERS"),
                         "sqs_endpoint_url": cfg.get("OUTBOX_SQS_ENDPOINT_URL")}]
    ports = set()
    for d in destinations:
        sink = d["sink"]
        ports |= {"rabbitmq": {5671, 5672}, "nats": {4222}, "sqs": {443}}.get(sink, set())
        if d.get("kafka_brokers"):
            ports |= {int(b.strip().rsplit(":", 1)[1]) for b in str(d["kafka_brokers"]).split(",")}
        m = re.search(r":([0-9]+)(/|$)", str(d.get("sqs_endpoint_url") or ""))
        if m:
            ports.add(int(m.group(1)))
    return ports


def check_network_policy(kinds, values, where, pod_labels, http_port):
    """Point 9: in, Prometheus only on the metrics port; out, DNS, the
    database and the broker ports only."""
    policies = kinds.get("NetworkPolicy", [])
    np = values["networkPolicy"]
    if not check(len(policies) == (1 if np["enabled"] else 0), where,
                 f"NetworkPolicy must exist exactly when networkPolicy.enabled ({len(policies)} found)"):
        return
    if not policies:
        return
    w = f"{where} NetworkPolicy"
    spec = policies[0]["spec"]
    check(set(spec["podSelector"]["matchLabels"].items()) <= set(pod_labels.items()), w, "must select the relay pods")
    check(sorted(spec.get("policyTypes", [])) == ["Egress", "Ingress"], w, "must restrict ingress and egress")
    ingress = spec.get("ingress", [])
    check(len(ingress) == 1 and ingress[0].get("ports") == [{"port": http_port, "protocol": "TCP"}], w,
          f"ingress only on the metrics port {http_port}, got {ingress}")
    if ingress:
        check(ingress[0].get("from") == (np["metricsFrom"] or None), w, f"ingress only from networkPolicy.metricsFrom, got {ingress[0].get('from')}")
    egress = spec.get("egress", [])
    open_ports = {(p["port"], p.get("protocol", "TCP")) for rule in egress for p in rule.get("ports", [])}
    want = ({(53, "UDP"), (53, "TCP")} | {(p, "TCP") for p in np["database"]["ports"]}
            | {(p, "TCP") for p in broker_ports(values)})
    extra = {(p["port"], p.get("protocol", "TCP")) for rule in np.get("extraEgress") or [] for p in rule.get("ports", [])}
    check(open_ports == want | extra, w, f"egress ports must be DNS, the database's and the broker's {sorted(want | extra)}, got {sorted(open_ports)}")
    check(all(rule.get("ports") for rule in egress), w, "every egress rule must name its ports")


# --- alerts (issue #27 points 1 and 7; #25 per source) ---------------------

def anchors(markdown):
    """GitHub's anchors of a Markdown file's headings."""
    out = set()
    for heading in re.findall(r"^#+\s+(.*)$", markdown, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


def selectors(expr):
    """Every metric selector of an expression: (name, matchers or '')."""
    return [(m.group(1), m.group(2) or "") for m in SELECTOR.finditer(expr)
            if not re.match(r"\s*\(", expr[m.end():])]  # a function call such as up(...) has no such name


def expected_groups(file_groups, values, namespace, service):
    """The rule file after the changes templates/prometheusrule.yaml makes."""
    pr = values["prometheusRule"]
    scope = f'job="outbox-relay", namespace="{namespace}", service="{service}"'
    own = [s for s in values.get("sources") or [] if {"oldestAgeSeconds", "oldestAgeFor"} & set(s.get("alerts") or {})]

    def number(value):
        return str(int(value)) if float(value).is_integer() else str(value)

    def with_threshold(expr, threshold):
        return re.sub(r">\s*[0-9]+(\.[0-9]+)?\s*$", f"> {number(threshold)}", expr)

    groups = []
    for group in file_groups:
        rules = []
        for rule in copy.deepcopy(group["rules"]):
            if rule.get("alert"):
                rule["labels"] = {**(pr.get("additionalRuleLabels") or {}), **rule.get("labels", {}), "namespace": namespace}
                url = rule.get("annotations", {}).get("runbook_url")
                if pr.get("runbookUrl") and url:
                    rule["annotations"]["runbook_url"] = f"{pr['runbookUrl'].rstrip('#')}#{url.split('#')[-1]}"
            if rule.get("alert") == AGE_ALERT:
                expr = rule["expr"].strip()
                for s in own:
                    alerts = s["alerts"]
                    source_rule = copy.deepcopy(rule)
                    source_rule["labels"] = {**rule["labels"], "source": s["name"]}
                    source_rule["expr"] = with_threshold(expr.replace(JOB_MATCHER, f'{scope}, source="{s["name"]}"'),
                                                         alerts.get("oldestAgeSeconds", pr["oldestUnpublishedAge"]["threshold"]))
                    source_rule["for"] = alerts.get("oldestAgeFor", pr["oldestUnpublishedAge"]["for"])
                    rules.append(source_rule)
                rest = scope + (f', source!~"{"|".join(s["name"] for s in own)}"' if own else "")
                rule["expr"] = with_threshold(expr.replace(JOB_MATCHER, rest), pr["oldestUnpublishedAge"]["threshold"])
                rule["for"] = pr["oldestUnpublishedAge"]["for"]
            else:
                rule["expr"] = rule["expr"].replace(JOB_MATCHER, scope)
            rules.append(rule)
        groups.append({**group, "rules": rules})
    return groups


def check_rule_file(rule_file, chart_values):
    where = str(RULES_FILE.relative_to(ROOT))
    groups = rule_file.get("groups", [])
    check([g["name"] for g in groups] == ["outbox-relay"], where, "one group named outbox-relay")
    rules = {r.get("alert"): r for g in groups for r in g["rules"]}
    check(set(rules) == ALERTS, where, f"alerts must be {sorted(ALERTS)}, got {sorted(rules)}")
    operation_anchors = anchors(OPERATIONS.read_text())
    for name, rule in rules.items():
        ann = rule.get("annotations", {})
        check({"summary", "description", "runbook", "runbook_url"} <= set(ann), where,
              f"{name} needs summary, description, runbook and runbook_url")
        # Point 7: a runbook_url per alert, docs/operations.md plus its section.
        url = ann.get("runbook_url", "")
        m = re.fullmatch(r"docs/operations\.md#([a-z0-9-]+)", url)
        check(m and m.group(1) in operation_anchors, where,
              f"{name}: runbook_url {url!r} must be docs/operations.md#<a section of it>")
        check(rule.get("labels", {}).get("severity") in {"warning", "critical"}, where, f"{name} needs a severity")
        used = set(re.findall(r"\boutbox_[a-z_]+", rule["expr"]))
        check(used <= SPEC_METRICS, where, f"{name} uses metrics outside the specification: {used - SPEC_METRICS}")
        # Point 1: every selector, absent()'s too, names the job, and only it,
        # so that the chart can scope each one to its release.
        for metric, matchers in selectors(rule["expr"]):
            check(matchers == "{" + JOB_MATCHER + "}", where,
                  f"{name}: selector {metric}{matchers} must be {metric}{{{JOB_MATCHER}}}")
        if used & DESTINATION_METRICS:
            sums = re.findall(r"\bsum\s+(without|by)\s*\(([^)]*)\)", rule["expr"])
            check(sums and all(kind == "without" and "destination" in labels and "source" not in labels
                               for kind, labels in sums), where,
                  f"{name}: every sum over {sorted(used & DESTINATION_METRICS)} must drop the destination label and keep the source")
    age = rules.get(AGE_ALERT, {})
    m = re.search(r">\s*([0-9]+(?:\.[0-9]+)?)\s*$", age.get("expr", ""))
    defaults = chart_values["prometheusRule"]["oldestUnpublishedAge"]
    check(m and float(m.group(1)) == float(defaults["threshold"]) and age.get("for") == defaults["for"],
          where, f"{AGE_ALERT} default threshold/for must equal values.yaml prometheusRule.oldestUnpublishedAge {defaults}")
    # Point 7: a full stall pages within about two minutes of the threshold:
    # `for`, plus a scrape interval, within 2 minutes.
    scrape = prom_seconds(chart_values["serviceMonitor"]["interval"])
    check(prom_seconds(defaults["for"]) + scrape <= 120, where,
          f"{AGE_ALERT}: for ({defaults['for']}) + the scrape interval ({chart_values['serviceMonitor']['interval']}) must be within 2 minutes")
    down = rules.get("OutboxRelayDown", {})
    replica = rules.get("OutboxRelayReplicaDown", {})
    check(down.get("labels", {}).get("severity") == "critical" and replica.get("labels", {}).get("severity") == "warning",
          where, "OutboxRelayDown (no replica up) must be critical, OutboxRelayReplicaDown (one target) a warning")
    check("absent(" in down.get("expr", "") and "unless" in replica.get("expr", ""), where,
          "OutboxRelayDown must catch no target at all (absent), OutboxRelayReplicaDown must stand down when all are down (unless)")
    source_down = rules.get("OutboxSourceDown", {})
    check("outbox_source_ready" in source_down.get("expr", "") and source_down.get("labels", {}).get("severity") == "warning",
          where, "OutboxSourceDown: a warning on outbox_source_ready")


def check_prometheus_rule(rule, file_groups, values, label, out, namespace="default", release="ci"):
    where = f"chart ({label}) PrometheusRule"
    service = fullname(values, release)
    want = expected_groups(file_groups, values, namespace, service)
    got = rule["spec"]["groups"]
    if not check(got == want, where, "differs from files/outbox-relay.rules.yml after the documented substitutions"):
        for g_got, g_want in zip(got, want):
            for r_got, r_want in zip(g_got["rules"], g_want["rules"]):
                if r_got != r_want:
                    failures.append(f"  {r_want.get('alert')}:\n    rendered {r_got}\n    expected {r_want}")
    # Point 1, on the output itself: every selector names the release, every alert carries its namespace.
    for group in got:
        for r in group["rules"]:
            for metric, matchers in selectors(r["expr"]):
                check(f'namespace="{namespace}"' in matchers and f'service="{service}"' in matchers, where,
                      f"{r.get('alert')}: selector {metric}{matchers} must name namespace {namespace} and service {service}")
            check(r.get("labels", {}).get("namespace") == namespace, where, f"{r.get('alert')} must carry namespace={namespace}")
            if values["prometheusRule"].get("runbookUrl"):
                check(r["annotations"]["runbook_url"].startswith(values["prometheusRule"]["runbookUrl"] + "#"), where,
                      f"{r.get('alert')}: runbook_url must be prometheusRule.runbookUrl plus its anchor")
    out.parent.mkdir(exist_ok=True)
    out.write_text(yaml.safe_dump({"groups": got}, sort_keys=False))


def check_alert_lists(values):
    """Point 7: the alert lists of NOTES.txt, values.yaml, the chart README
    and the docs name exactly the rule file's alerts."""
    count_words = {6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten"}
    places = {
        "charts/outbox-relay/templates/NOTES.txt": (CHART / "templates" / "NOTES.txt").read_text(),
        "charts/outbox-relay/values.yaml (prometheusRule)": re.search(
            r"^# Prometheus Operator PrometheusRule.*?^prometheusRule:", (CHART / "values.yaml").read_text(), re.S | re.M).group(0),
        "charts/outbox-relay/README.md (Alerts)": section((CHART / "README.md").read_text(), "Alerts"),
        "docs/operations.md (Alerts)": section(OPERATIONS.read_text(), "Alerts"),
    }
    for where, text in places.items():
        named = set(re.findall(r"\bOutbox[A-Z][A-Za-z]+\b", text))
        check(named == ALERTS, where, f"must name exactly the rule file's alerts: missing {sorted(ALERTS - named)}, extra {sorted(named - ALERTS)}")
    deployment = section((ROOT / "docs" / "deployment.md").read_text(), "Alerts")
    check(f"The {count_words.get(len(ALERTS), len(ALERTS))} alerts" in deployment, "docs/deployment.md (Alerts)",
          f"must say how many alerts there are ({len(ALERTS)})")


def section(markdown, title):
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", markdown, re.S | re.M)
    return m.group(1) if m else ""


# --- chart: values, schema, README ----------------------------------------

def check_values_and_docs(values, schema):
    where = "charts/outbox-relay/values.yaml"
    config_keys = set(values["config"])
    want = set(SPEC_VARS) - SECRET_VARS
    # Point 3: every relay variable the README promises is accepted under config.
    check(config_keys == want, where,
          f"config must hold every variable of the README's Configuration table but {sorted(SECRET_VARS)}: missing {sorted(want - config_keys)}, extra {sorted(config_keys - want)}")
    check(set(schema["properties"]["config"]["properties"]) == want, "values.schema.json",
          f"config properties must be the README's variables but {sorted(SECRET_VARS)}: missing {sorted(want - set(schema['properties']['config']['properties']))}")
    check(schema.get("additionalProperties") is False, "values.schema.json", "top level must set additionalProperties: false")
    check(set(values) <= set(schema["properties"]), "values.schema.json",
          f"values without a schema: {sorted(set(values) - set(schema['properties']))}")
    # Point 9: the security contexts and resources are typed.
    for key in ["securityContext", "podSecurityContext", "resources"]:
        check(schema["properties"][key].get("additionalProperties") is False, "values.schema.json",
              f"{key} must be typed (additionalProperties: false)")
    # Point 8: the hook's deadline below Helm's default timeout.
    check(values["migrations"]["activeDeadlineSeconds"] < HELM_DEFAULT_TIMEOUT, where,
          f"migrations.activeDeadlineSeconds must stay below helm's default --timeout ({HELM_DEFAULT_TIMEOUT}s)")
    # Point 2: unready pods may be evicted.
    check(values["podDisruptionBudget"].get("unhealthyPodEvictionPolicy") == "AlwaysAllow", where,
          "podDisruptionBudget.unhealthyPodEvictionPolicy must default to AlwaysAllow")
    # Point 6: spread over hostname and zone by default, as a preference.
    spread = {(c["topologyKey"], c["whenUnsatisfiable"]) for c in values.get("topologySpreadConstraints") or []}
    check(spread == {("kubernetes.io/hostname", "ScheduleAnyway"), ("topology.kubernetes.io/zone", "ScheduleAnyway")},
          where, f"topologySpreadConstraints must spread over hostname and zone with ScheduleAnyway, got {spread}")
    # Every value is documented in the chart README's table.
    readme = (CHART / "README.md").read_text()
    table = re.search(r"^## Values\n(.*?)(?=^## )", readme, re.S | re.M)
    check(table, "charts/outbox-relay/README.md", 'no "## Values" section')
    documented = set(re.findall(r"^\| `([^`]+)` \|", table.group(1) if table else "", re.M))
    for key, value in values.items():
        keys = [key]
        if isinstance(value, dict) and value and key not in {"resources", "podSecurityContext", "securityContext", "strategy"}:
            keys = [f"{key}.{sub}" for sub in value]
        for k in keys:
            check(k in documented or any(d.startswith(k + ".") for d in documented),
                  "charts/outbox-relay/README.md", f"value `{k}` is not in the values table")
    for k in documented:
        head = k.split(".")[0].split("[")[0]
        check(head in values, "charts/outbox-relay/README.md", f"documents `{k}`, which values.yaml does not have")


# --- sidecar (issue #27 point 5) ------------------------------------------------

def extract_sidecar_examples(render_dir):
    """The README's sidecar manifests, for kubernetes-validate, and what they
    must tell: one worker, memory by the sizing rule, the grace period of a
    stopping relay, the migration as a Job instead of an init container, and
    the connections it holds."""
    readme = (CHART / "README.md").read_text()
    blocks = re.findall(r"<!-- sidecar-example -->\s*```yaml\n(.*?)```", readme, re.S)
    check(blocks, "charts/outbox-relay/README.md", "no sidecar example (a yaml block after <!-- sidecar-example -->)")
    for i, block in enumerate(blocks):
        docs = [d for d in yaml.safe_load_all(block) if d]
        where = f"charts/outbox-relay/README.md sidecar example {i + 1}"
        deployments = [d for d in docs if d.get("kind") == "Deployment"]
        if check(deployments, where, "has no Deployment"):
            pod = deployments[0]["spec"]["template"]["spec"]
            everything = pod.get("containers", []) + pod.get("initContainers", [])
            relays = [c for c in everything if "outbox-relay" in c.get("image", "") and "run" in (c.get("args") or [])]
            check(not [c for c in pod.get("initContainers", []) if "migrate" in (c.get("args") or [])], where,
                  "no migrate init container: it ties the producer's start to a migration (use the Job)")
            if check(relays and len(everything) >= 2, where, "needs the producer and the relay in one pod"):
                relay = relays[0]
                check_security(pod, relay, where)
                env = {e["name"]: e for e in relay.get("env", [])}
                check("secretKeyRef" in env.get("OUTBOX_DATABASE_URL", {}).get("valueFrom", {}), where,
                      "OUTBOX_DATABASE_URL must come from a Secret")
                check(env.get("OUTBOX_WORKERS", {}).get("value") == "1", where, "a sidecar runs one worker (OUTBOX_WORKERS=1)")
                publish = seconds(env.get("OUTBOX_PUBLISH_TIMEOUT", {}).get("value", "30s"))
                batch_bytes = int(env.get("OUTBOX_MAX_BATCH_BYTES", {}).get("value", "16777216"))
                need = 1 * batch_bytes * MEMORY_PER_BATCH_BYTE + MEMORY_BASE
                check_resources(relay.get("resources"), where, need)
                grace = pod.get("terminationGracePeriodSeconds", 30)
                check(grace >= publish + STOP_EXTRA_SECONDS, where,
                      f"terminationGracePeriodSeconds {grace} must cover a stopping relay, {publish + STOP_EXTRA_SECONDS:.0f} s")
        jobs = [d for d in docs if d.get("kind") == "Job"]
        if check(jobs, where, "needs the migration Job (recommended over an init container)"):
            container = jobs[0]["spec"]["template"]["spec"]["containers"][0]
            check(container.get("args") == ["migrate"], where, "the Job runs `outbox-relay migrate`")
            check_security(jobs[0]["spec"]["template"]["spec"], container, where)
        (render_dir / f"sidecar-{i + 1}.yaml").write_text(block)
    text = section(readme, "Sidecar: the relay beside a producer")
    check("2 × OUTBOX_WORKERS + 3" in text and re.search(r"\b6 connections\b", text), "charts/outbox-relay/README.md",
          "the sidecar section must give its connections: a pool of 2 × OUTBOX_WORKERS + 3 plus LISTEN, 6 with one worker")


# --- docker-compose, Prometheus, Dockerfile -------------------------------

PINNED_IMAGE = re.compile(r"[a-z0-9./-]+:v?[0-9]+\.[0-9]+[A-Za-z0-9.-]*(@sha256:[0-9a-f]{64})?")


def check_compose():
    where = "docker-compose.yml"
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose.get("services", {})
    for name in ["postgres", "rabbitmq", "elasticmq", "relay-migrate", "relay", "producer", "prometheus"]:
        check(name in services, where, f"service {name} is missing")
    if set(services) < {"postgres", "rabbitmq", "relay-migrate", "relay", "producer", "prometheus"}:
        return
    # Point 10: every image pinned to a version (x.y at least), and every
    # service that keeps running health-checked.
    for name, svc in services.items():
        if svc.get("build"):
            continue
        check(PINNED_IMAGE.fullmatch(svc.get("image", "")), where, f"{name}: image {svc.get('image')} must be pinned to a version")
        one_shot = svc.get("restart") == "no"
        if not one_shot and not name.startswith("producer"):
            check("healthcheck" in svc, where, f"{name} needs a healthcheck")
    check("15672:15672" in " ".join(services["rabbitmq"].get("ports", [])), where, "RabbitMQ management UI port 15672")

    allowed = set(SPEC_VARS) | {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    for name, command in [("relay-migrate", ["migrate"]), ("relay", ["run"])]:
        svc = services[name]
        env = svc.get("environment", {})
        check(set(env) <= allowed, where, f"{name}: variables outside the README's Configuration: {sorted(set(env) - allowed)}")
        check(set(SPEC_VARS) <= set(env), where, f"{name}: README variables not set: {sorted(set(SPEC_VARS) - set(env))}")
        check(svc.get("command") == command, where, f"{name} must run {command}")
        check(svc.get("build") == "." or (svc.get("build") or {}).get("context") == ".", where, f"{name} builds the Dockerfile")
    relay = services["relay"]
    deps = relay.get("depends_on", {})
    check(deps.get("relay-migrate", {}).get("condition") == "service_completed_successfully", where,
          "relay must wait for relay-migrate to complete successfully")
    for dep in ["postgres", "rabbitmq", "elasticmq"]:
        check(deps.get(dep, {}).get("condition") == "service_healthy", where, f"relay must wait for {dep} to be healthy")
    for name, svc in services.items():
        depends = svc.get("depends_on") or {}
        if isinstance(depends, list):
            depends = {dep: {"condition": "service_started"} for dep in depends}
        for dep, how in depends.items():
            check(how.get("condition") in {"service_healthy", "service_completed_successfully"}, where,
                  f"{name} must wait for {dep} to be healthy (or completed), not {how.get('condition')}")
    check(services["relay-migrate"].get("depends_on", {}).get("postgres", {}).get("condition") == "service_healthy",
          where, "relay-migrate must wait for postgres to be healthy")
    check(services["producer"].get("depends_on", {}).get("relay-migrate", {}).get("condition")
          == "service_completed_successfully", where, "producer must wait for the migration")
    producer = " ".join(map(str, services["producer"].get("command", [])))
    check("INSERT INTO outbox_event (id, event_type, aggregate_id, payload)" in producer, where,
          "producer must insert into outbox_event")
    # Point 4: the same stop time as the chart.
    publish = seconds(relay["environment"]["OUTBOX_PUBLISH_TIMEOUT"])
    for name, svc in services.items():
        if svc.get("command") == ["run"]:
            grace = seconds(svc.get("stop_grace_period", "10s"))
            check(grace >= publish + STOP_EXTRA_SECONDS, where,
                  f"{name}: stop_grace_period must cover a stopping relay, OUTBOX_PUBLISH_TIMEOUT + {STOP_EXTRA_SECONDS}s = {publish + STOP_EXTRA_SECONDS:.0f}s")

    # Prometheus loads the chart's rule file through a mount its config globs.
    prom = services["prometheus"]
    mounts = {}
    for volume in prom.get("volumes", []):
        source, target = volume.split(":")[:2]
        mounts[target] = source
    rules_target = [t for t, s in mounts.items() if (ROOT / s).resolve() == RULES_FILE]
    check(rules_target, where, f"prometheus must mount {RULES_FILE.relative_to(ROOT)}")
    config_source = mounts.get("/etc/prometheus/prometheus.yml", "")
    check(config_source, where, "prometheus must mount its config at /etc/prometheus/prometheus.yml")
    if rules_target and config_source:
        config = yaml.safe_load((ROOT / config_source).read_text())
        patterns = config.get("rule_files", [])
        check(any(fnmatch.fnmatch(rules_target[0], p) for p in patterns), config_source,
              f"rule_files {patterns} do not load the mounted {rules_target[0]}")
        jobs = [j["job_name"] for j in config.get("scrape_configs", [])]
        check("outbox-relay" in jobs, config_source, 'a scrape job named "outbox-relay" (the alerts select it)')

    # The Kafka demo: a broker and a one-shot that creates the topic (the
    # relay never does), both in the kafka profile, which the relay waits for
    # only when the profile is on.
    kafka, topics = services.get("kafka"), services.get("kafka-topics")
    if check(kafka and topics, where, "services kafka and kafka-topics are missing"):
        for name, svc in [("kafka", kafka), ("kafka-topics", topics)]:
            check(svc.get("profiles") == ["kafka"], where, f"{name} must be in the kafka profile only")
            check(re.fullmatch(r"apache/kafka:[0-9][0-9.]*(@sha256:[0-9a-f]{64})?", svc.get("image", "")), where,
                  f"{name} must use apache/kafka pinned by version, got {svc.get('image')}")
        check(topics.get("depends_on", {}).get("kafka", {}).get("condition") == "service_healthy", where,
              "kafka-topics must wait for kafka to be healthy")
        check(deps.get("kafka-topics") == {"condition": "service_completed_successfully", "required": False}, where,
              "relay must wait for kafka-topics, as an optional dependency")
        created = re.findall(r"--topic\s+(\S+)", " ".join(map(str, topics.get("command", []))))
        template = relay["environment"]["OUTBOX_KAFKA_TOPIC"].replace("{event_type}", "order.created")
        check(template in created, where, f"kafka-topics must create {template} (OUTBOX_KAFKA_TOPIC), creates {created}")
        brokers = relay["environment"]["OUTBOX_KAFKA_BROKERS"]
        check(f"PLAINTEXT://{brokers}" in kafka.get("environment", {}).get("KAFKA_ADVERTISED_LISTENERS", ""), where,
              f"kafka must advertise the relay's OUTBOX_KAFKA_BROKERS ({brokers})")

    # The demo broker knows the credentials and routes what the relay sends.
    amqp = re.match(r"amqps?://([^:@/]+):([^@/]+)@", relay["environment"]["OUTBOX_AMQP_URL"])
    defs_source = [s for s in (v.split(":")[0] for v in services["rabbitmq"].get("volumes", [])) if s.endswith(".json")]
    if check(amqp and defs_source, where, "rabbitmq needs definitions.json and the relay an AMQP URL with credentials"):
        defs = json.loads((ROOT / defs_source[0]).read_text())
        user = next((u for u in defs.get("users", []) if u["name"] == amqp.group(1)), None)
        if check(user, defs_source[0], f"no user {amqp.group(1)}"):
            raw = base64.b64decode(user["password_hash"])
            check(hashlib.sha256(raw[:4] + amqp.group(2).encode()).digest() == raw[4:], defs_source[0],
                  "the password hash does not match the relay's OUTBOX_AMQP_URL")
        exchange = relay["environment"]["OUTBOX_AMQP_EXCHANGE"]
        check(any(b["source"] == exchange for b in defs.get("bindings", [])), defs_source[0],
              f"no queue is bound to {exchange}: every mandatory publish would fail")

    check_compose_routes(compose, relay["environment"])
    check_compose_sources(compose, relay["environment"])


def mounted_file(svc, where, name):
    """The repository file a service's OUTBOX_CONFIG names, parsed."""
    env = svc.get("environment", {})
    mounts = {v.split(":")[1]: v.split(":")[0] for v in svc.get("volumes", [])}
    source = mounts.get(env.get("OUTBOX_CONFIG", ""))
    if not check(source and (ROOT / source).is_file(), where,
                 f"{name}: OUTBOX_CONFIG={env.get('OUTBOX_CONFIG')} must name a mounted file of the repository"):
        return None, None
    check(all(v.endswith(":ro") for v in svc.get("volumes", [])), where, f"{name}: mounts must be read-only")
    text = (ROOT / source).read_text()
    try:
        file = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        check(False, source, f"not TOML: {error}")
        return source, None
    used = sorted(set(CONFIG_VAR.findall(text)) - set(env))
    check(not used, where, f"{name}: {source} uses ${{VAR}} of variables not set: {used}")
    return source, file


def check_compose_routes(compose, relay_env):
    """The routes profile: a relay whose destinations and routes are in a
    mounted file, on a table of its own (so it does not compete with the
    default relay), every ${VAR} of the file in its environment and no sink
    variable there, each destination's exchange or queue declared in the
    demo brokers, and every event type its producer writes routed."""
    where = "docker-compose.yml (profile routes)"
    services = compose.get("services", {})
    names = ["relay-migrate-routes", "relay-routes", "producer-routes"]
    if not check(all(n in services for n in names), where, f"services {names} are needed"):
        return
    for name in names:
        check(services[name].get("profiles") == ["routes"], where, f"{name} must be in the routes profile only")
    file = source = None
    for name, command in [("relay-migrate-routes", ["migrate"]), ("relay-routes", ["run"])]:
        svc = services[name]
        env = svc.get("environment", {})
        check(svc.get("command") == command, where, f"{name} must run {command}")
        source, file = mounted_file(svc, where, name)
        sink_vars = sorted(v for v in env if is_sink_var(v))
        check(not sink_vars, where, f"{name}: sink variables beside a file with destinations: {sink_vars}")
        check(env.get("OUTBOX_TABLE") and env.get("OUTBOX_TABLE") != relay_env.get("OUTBOX_TABLE"), where,
              f"{name} must relay a table of its own, not {relay_env.get('OUTBOX_TABLE')}")
    if file is None:
        return
    destinations = {d.get("name"): d for d in file.get("destination", [])}
    routes = file.get("route", [])
    check(len(destinations) >= 2 and len(routes) >= 2, source, "needs two destinations and two routes")
    check({r.get("destination") for r in routes} == set(destinations), source,
          "every route must name a destination, and every destination be named by a route")
    defs = json.loads((ROOT / "deploy/rabbitmq/definitions.json").read_text())
    elasticmq = (ROOT / "deploy/elasticmq/elasticmq.conf").read_text()
    for name, d in destinations.items():
        if d.get("sink") == "rabbitmq":
            exchange = d.get("amqp_exchange", "amq.topic")
            check(exchange.startswith("amq.") or any(e["name"] == exchange for e in defs.get("exchanges", [])),
                  "deploy/rabbitmq/definitions.json", f"destination {name}: no exchange {exchange}")
            check(any(b["source"] == exchange for b in defs.get("bindings", [])), "deploy/rabbitmq/definitions.json",
                  f"destination {name}: no queue is bound to {exchange}: every mandatory publish would fail")
        elif d.get("sink") == "sqs":
            queue = str(d.get("sqs_queue_url", "")).rsplit("/", 1)[-1]
            check(re.search(rf'^\s*"?{re.escape(queue)}"?\s*\{{', elasticmq, re.M), "deploy/elasticmq/elasticmq.conf",
                  f"destination {name}: no queue {queue}")
        else:
            check(False, source, f"destination {name}: the demo has brokers for rabbitmq and sqs destinations only")
    producer = " ".join(map(str, services["producer-routes"].get("command", [])))
    table = services["relay-routes"]["environment"].get("OUTBOX_TABLE")
    check(f"INSERT INTO {table} " in producer, where, f"producer-routes must insert into {table}")
    for event_type in re.findall(r"\('([a-z]+\.[a-z_]+)'\)", producer):
        globs = [r.get("event_type", "") for r in routes]
        check(any(fnmatch.fnmatchcase(event_type, g) for g in globs), where,
              f"producer-routes writes {event_type}, which no route of {source} matches")
    deps = services["relay-routes"].get("depends_on", {})
    check(deps.get("relay-migrate-routes", {}).get("condition") == "service_completed_successfully", where,
          "relay-routes must wait for relay-migrate-routes")


def check_compose_sources(compose, relay_env):
    """The two-databases profile (#25): a second PostgreSQL, health-checked;
    a relay and its migration reading a mounted file with two [[source]]
    tables, each URL a ${VAR} set in their environment and pointing at a
    database they wait for; no database variable of the environment beside
    them (the relay would ignore it); a producer writing into each source's
    table."""
    where = "docker-compose.yml (profile two-databases)"
    services = compose.get("services", {})
    names = ["postgres-billing", "relay-migrate-sources", "relay-sources", "producer-sources"]
    if not check(all(n in services for n in names), where, f"services {names} are needed"):
        return
    for name in names:
        check(services[name].get("profiles") == ["two-databases"], where, f"{name} must be in the two-databases profile only")
    check("healthcheck" in services["postgres-billing"], where, "postgres-billing needs a healthcheck")
    producer = " ".join(map(str, services["producer-sources"].get("command", [])))
    for name, command in [("relay-migrate-sources", ["migrate"]), ("relay-sources", ["run"])]:
        svc = services[name]
        env = svc.get("environment", {})
        check(svc.get("command") == command, where, f"{name} must run {command}")
        source, file = mounted_file(svc, where, name)
        database_vars = sorted(set(env) & DATABASE_VARS)
        check(not database_vars, where, f"{name}: database variables beside [[source]] tables (ignored by the relay): {database_vars}")
        if not file:
            continue
        tables = file.get("source", [])
        check(len(tables) >= 2 and len({t.get("name") for t in tables}) == len(tables), source,
              "needs two [[source]] tables with distinct names")
        check(not ({"database_url", "table", "database_pooler", "listen_database_url"} & set(file)), source,
              "no top-level database key beside [[source]] tables")
        deps = svc.get("depends_on", {})
        for t in tables:
            url_var = CONFIG_VAR.fullmatch(str(t.get("database_url", "")))
            if not check(url_var, source, f"source {t.get('name')}: database_url must be \"${{VAR}}\""):
                continue
            host = re.search(r"@([^:/]+)", env.get(url_var.group(1), ""))
            if check(host and host.group(1) in services, where, f"{name}: {url_var.group(1)} must point at a compose service"):
                check(deps.get(host.group(1), {}).get("condition") == "service_healthy", where,
                      f"{name} must wait for {host.group(1)} to be healthy")
            table = t.get("table", "outbox_event")
            if name == "relay-sources":
                check(f"INSERT INTO {table} " in producer, where, f"producer-sources must insert into {table} (source {t.get('name')})")
            if host and host.group(1) == "postgres":
                check(table != relay_env.get("OUTBOX_TABLE"), source,
                      f"source {t.get('name')} must relay a table of its own in the default database, not {table}")
    check(services["relay-sources"].get("depends_on", {}).get("relay-migrate-sources", {}).get("condition")
          == "service_completed_successfully", where, "relay-sources must wait for relay-migrate-sources")


def check_kafka_render(docs, values):
    """The chart rendered for the Kafka sink: the relay gets every Kafka
    setting of values as it is, the SASL password only through its Secret,
    and its certificate files in the mounted tls Secret; the migrate Job
    none of them."""
    where = "chart (ci/kafka-values.yaml)"
    cfg = values["config"]
    check(cfg["OUTBOX_SINK"] == "kafka" and values["kafka"].get("existingSecret"), where,
          "ci/kafka-values.yaml must select the kafka sink with kafka.existingSecret")
    kinds = by_kind(docs)
    for dep in kinds.get("Deployment", []):
        pod = dep["spec"]["template"]["spec"]
        container = pod["containers"][0]
        env = {e["name"]: e for e in container.get("env", [])}
        w = f"{where} Deployment"
        check(env.get("OUTBOX_SINK", {}).get("value") == "kafka", w, f"OUTBOX_SINK must be kafka, got {env.get('OUTBOX_SINK')}")
        for name in [v for v in SPEC_VARS if v.startswith("OUTBOX_KAFKA_") and v not in SECRET_VARS]:
            wanted = env_string(cfg.get(name))
            got = env.get(name, {}).get("value")
            if wanted:
                check(got == wanted, w, f"{name} must be {wanted!r}, got {env.get(name)}")
            else:
                check(name not in env, w, f"{name} is empty in values and must be left unset, got {env.get(name)}")
        check_tls_files(pod, container, values, w)
    for job in kinds.get("Job", []):
        env = {e["name"] for e in job["spec"]["template"]["spec"]["containers"][0].get("env", [])}
        kafka = sorted(v for v in env if v.startswith("OUTBOX_KAFKA_"))
        check(not kafka, f"{where} migrate Job", f"no Kafka setting in the migrate Job: {kafka}")


def check_pdb_versions(new_docs, old_docs):
    """Point 2: AlwaysAllow where the API server knows the field (1.27 and
    later), left out for older ones."""
    for docs, label, want in [(new_docs, "newest Kubernetes", "AlwaysAllow"), (old_docs, "Kubernetes 1.25", None)]:
        pdb = by_kind(docs).get("PodDisruptionBudget", [{}])[0]
        got = pdb.get("spec", {}).get("unhealthyPodEvictionPolicy")
        check(got == want, f"chart (default values, {label}) PodDisruptionBudget",
              f"unhealthyPodEvictionPolicy must be {want}, got {got}")


def check_dockerfile():
    """Point 10: the builder on the Rust version the crate declares, both
    bases pinnable by digest (pinned once a digest is recorded), a runtime
    with only what the binary needs."""
    where = "Dockerfile"
    text = (ROOT / "Dockerfile").read_text()
    stages = re.split(r"^FROM\s", text, flags=re.M)
    check(len(stages) >= 3, where, "must be a multi-stage build")
    check(re.search(r"cargo build --release --locked --bin outbox-relay", text), where,
          "must build with cargo build --release --locked --bin outbox-relay")
    cargo = tomllib.loads((ROOT / "Cargo.toml").read_text())
    rust_version = cargo["package"].get("rust-version")
    arg = re.search(r"^ARG RUST_VERSION=(\S+)\s*$", text, re.M)
    check(arg and arg.group(1) == rust_version, where,
          f"ARG RUST_VERSION must be the crate's rust-version ({rust_version}), got {arg.group(1) if arg else None}")
    froms = re.findall(r"^FROM\s+(\S+)", text, re.M)
    check(len(froms) == 2 and froms[0].startswith("rust:${RUST_VERSION}-slim-bookworm")
          and froms[1].startswith("debian:bookworm-slim"), where,
          f"the builder must be rust:${{RUST_VERSION}}-slim-bookworm and the runtime debian:bookworm-slim (same glibc), got {froms}")
    unpinned = []
    for image, digest_arg in [(froms[0] if froms else "", "RUST_IMAGE_DIGEST"), (froms[1] if len(froms) > 1 else "", "RUNTIME_IMAGE_DIGEST")]:
        check(f"${{{digest_arg}:+@${{{digest_arg}}}}}" in image, where, f"FROM {image} must take its digest from ARG {digest_arg}")
        value = re.search(rf"^ARG {digest_arg}=(\S*)\s*$", text, re.M)
        if check(value, where, f"ARG {digest_arg}= is missing (before the first FROM)"):
            check(re.fullmatch(r"(sha256:[0-9a-f]{64})?", value.group(1)), where,
                  f"ARG {digest_arg} must be empty or sha256:<64 hex>, got {value.group(1)}")
            if not value.group(1):
                unpinned.append(digest_arg)
    if unpinned:
        message = (f"base images not pinned by digest yet ({', '.join(unpinned)} empty): "
                   "run deploy/pin-base-images where a registry is reachable")
        if os.environ.get("REQUIRE_PINNED_DIGESTS") == "1":
            check(False, where, message)
        else:
            notes.append(f"{where}: {message}")
    final = stages[-1]
    user = re.findall(r"^USER\s+(\S+)", final, re.M)
    check(user and re.fullmatch(r"[1-9][0-9]*(:[0-9]+)?", user[-1]), where, f"final stage needs a numeric non-root USER, got {user}")
    check(re.search(r'^ENTRYPOINT \["/usr/local/bin/outbox-relay"\]\s*$', final, re.M), where, "ENTRYPOINT")
    check(re.search(r'^CMD \["run"\]\s*$', final, re.M), where, 'CMD ["run"]')
    check(re.search(r"^EXPOSE 9090\s*$", final, re.M), where, "EXPOSE 9090")
    copies = re.findall(r"^COPY\s+(.*)$", final, re.M)
    check(len(copies) == 1 and "/usr/local/bin/outbox-relay" in copies[0], where, f"the runtime image gets the binary only, got {copies}")
    installs = re.findall(r"apt-get install[^\n]*?--no-install-recommends((?:\s+[a-z0-9.+-]+)+)", final)
    packages = set(" ".join(installs).split())
    check(packages == {"ca-certificates", "libssl3"}, where,
          f"the runtime installs CA certificates and libssl3 (librdkafka links libssl.so.3) and nothing else, got {sorted(packages)}")
    ignore = (ROOT / ".dockerignore").read_text().split()
    for entry in ["target/", ".git/"]:
        check(entry in ignore, ".dockerignore", f"must exclude {entry}")


def write_rule_tests(render_dir):
    """The promtool unit tests of the rendered rules, beside them."""
    rules = render_dir / "rules"
    rules.mkdir(exist_ok=True)
    for test in sorted((CHART / "ci" / "rules-tests").glob("*.test.yml")):
        shutil.copy(test, rules / test.name)


def main():
    render_dir = Path(sys.argv[1])
    global CHART_YAML
    CHART_YAML = yaml.safe_load((CHART / "Chart.yaml").read_text())
    chart_values = yaml.safe_load((CHART / "values.yaml").read_text())
    ci_values = lambda name: deep_merge(chart_values, yaml.safe_load((CHART / "ci" / name).read_text()))
    schema = json.loads((CHART / "values.schema.json").read_text())
    rule_file = yaml.safe_load(RULES_FILE.read_text())

    check_rule_file(rule_file, chart_values)
    check_values_and_docs(chart_values, schema)
    check_alert_lists(chart_values)
    check(set(yaml.safe_load((CHART / "ci" / "full-values.yaml").read_text())) == set(chart_values),
          "charts/outbox-relay/ci/full-values.yaml", "must set every top-level value of values.yaml")

    default_docs = load_all(render_dir / "default.yaml")
    check_chart_render(default_docs, chart_values, "default values")
    check_pdb_versions(default_docs, load_all(render_dir / "default-k125.yaml"))
    rules_default_values = deep_merge(chart_values, {"prometheusRule": {"enabled": True}, "serviceMonitor": {"enabled": True},
                                                     "grafanaDashboard": {"enabled": True}})
    check(DASHBOARD_COPY.read_bytes() == DASHBOARD_FILE.read_bytes(), str(DASHBOARD_COPY.relative_to(ROOT)),
          f"must be a copy of {DASHBOARD_FILE.relative_to(ROOT)}, which the chart ships")
    renders = [
        ("prometheusRule enabled", rules_default_values, "rules-default", "ci", "default"),
        ("ci/full-values.yaml", ci_values("full-values.yaml"), "full", "ci", "default"),
        ("ci/sources-values.yaml", ci_values("sources-values.yaml"), "sources", "ci", "default"),
        ("ci/release-orders-values.yaml", ci_values("release-orders-values.yaml"), "release-orders", "orders", "shop"),
        ("ci/release-payments-values.yaml", ci_values("release-payments-values.yaml"), "release-payments", "payments", "billing"),
    ]
    for label, values, name, release, namespace in renders:
        rule = check_chart_render(load_all(render_dir / f"{name}.yaml"), values, label, release, namespace)
        if rule:
            check_prometheus_rule(rule, rule_file["groups"], values, label,
                                  render_dir / "rules" / f"{name}.rules.yml", namespace, release)
    sources_values = ci_values("sources-values.yaml")
    check(len(sources_values.get("sources") or []) >= 3
          and any((s.get("alerts") or {}) for s in sources_values["sources"])
          and any(not s.get("alerts") for s in sources_values["sources"]),
          "charts/outbox-relay/ci/sources-values.yaml",
          "must have three sources, some with alert thresholds of their own and one without")

    routes_values = ci_values("routes-values.yaml")
    check(routed(routes_values) and len(routes_values["configFile"]["destination"]) >= 2
          and len(routes_values["configFile"].get("route") or []) >= 2,
          "charts/outbox-relay/ci/routes-values.yaml", "must set configFile with two destinations and two routes")
    check_chart_render(load_all(render_dir / "routes.yaml"), routes_values, "ci/routes-values.yaml")

    kafka_values = ci_values("kafka-values.yaml")
    kafka_docs = load_all(render_dir / "kafka.yaml")
    check_chart_render(kafka_docs, kafka_values, "ci/kafka-values.yaml")
    check_kafka_render(kafka_docs, kafka_values)

    write_rule_tests(render_dir)
    extract_sidecar_examples(render_dir)
    check_compose()
    check_dockerfile()

    for note in notes:
        print(f"deploy_checks.py: NOTE: {note}", file=sys.stderr)
    if failures:
        print(f"deploy_checks.py: {len(failures)} problem(s):", file=sys.stderr)
        for failure in failures:
            print(f"  - {failure}", file=sys.stderr)
        return 1
    print("deploy_checks.py: chart, alert rules, compose and Dockerfile assertions passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
