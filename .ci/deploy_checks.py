#!/usr/bin/env python3
"""Assertions on the deployment files, run by .ci/deploy-checks.

    deploy_checks.py RENDER_DIR

RENDER_DIR holds the chart rendered by `helm template` (see deploy-checks):
  default.yaml        default values
  rules-default.yaml  default values plus prometheusRule/serviceMonitor enabled
  full.yaml           ci/full-values.yaml (every setting non-default)
  kafka.yaml          ci/kafka-values.yaml (the Kafka sink with SASL over TLS)
  routes.yaml         ci/routes-values.yaml (configFile: two destinations, two routes)
This script writes into it, for promtool:
  rules-default.rules.yml, full.rules.yml   the PrometheusRule specs as rule files
  sidecar-N.yaml                            the sidecar examples of the chart README

Each check names the file and what is wrong; all failures are reported, and
the exit status is 1 if there is any.
"""

import base64
import copy
import fnmatch
import hashlib
import json
import re
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "outbox-relay"
RULES_FILE = CHART / "files" / "outbox-relay.rules.yml"
AGE_ALERT = "OutboxOldestUnpublishedAgeHigh"
ALERTS = {AGE_ALERT, "OutboxQuarantinedEvents", "OutboxRelayDown", "OutboxPublishFailuresHigh", "OutboxGaugesStale",
          "OutboxDestinationNotReady"}

# The relay's environment variables (README, "Configuration"). The chart, the compose file and this list must agree.
SPEC_VARS = [
    "OUTBOX_DATABASE_URL", "OUTBOX_TABLE", "OUTBOX_SINK", "OUTBOX_AMQP_URL",
    "OUTBOX_AMQP_EXCHANGE", "OUTBOX_AMQP_ROUTING_KEY", "OUTBOX_SQS_QUEUE_URL",
    "OUTBOX_SQS_ENDPOINT_URL", "AWS_REGION", "OUTBOX_BATCH_SIZE",
    "OUTBOX_POLL_INTERVAL", "OUTBOX_MAX_ATTEMPTS", "OUTBOX_PUBLISH_TIMEOUT",
    "OUTBOX_BACKOFF_BASE", "OUTBOX_BACKOFF_MAX", "OUTBOX_ON_PUBLISH",
    "OUTBOX_RETENTION", "OUTBOX_ORDERING", "OUTBOX_HTTP_ADDR",
    "OUTBOX_LOG_FORMAT", "RUST_LOG",
    # Production connectivity.
    "OUTBOX_DATABASE_POOLER", "OUTBOX_LISTEN_DATABASE_URL",
    "OUTBOX_AMQP_CA_FILE", "OUTBOX_AMQP_CLIENT_CERT_FILE", "OUTBOX_AMQP_CLIENT_KEY_FILE",
    "OUTBOX_AMQP_MAX_MESSAGE_BYTES", "OUTBOX_MAX_BATCH_BYTES",
    "OUTBOX_NATS_URL", "OUTBOX_NATS_SUBJECT", "OUTBOX_NATS_CREDS_FILE", "OUTBOX_NATS_CA_FILE",
    "OUTBOX_MESSAGE_FORMAT", "OUTBOX_CLOUDEVENTS_SOURCE",
    # Kafka.
    "OUTBOX_KAFKA_BROKERS", "OUTBOX_KAFKA_TOPIC", "OUTBOX_KAFKA_SECURITY_PROTOCOL",
    "OUTBOX_KAFKA_SASL_MECHANISM", "OUTBOX_KAFKA_SASL_USERNAME", "OUTBOX_KAFKA_SASL_PASSWORD",
    "OUTBOX_KAFKA_CA_FILE", "OUTBOX_KAFKA_CLIENT_CERT_FILE", "OUTBOX_KAFKA_CLIENT_KEY_FILE",
    "OUTBOX_KAFKA_PROPERTIES",
]
# Variables that hold passwords: in the chart they come only from Secrets
# (database.*, kafka.existingSecret), never from `config`.
SECRET_VARS = {"OUTBOX_DATABASE_URL", "OUTBOX_LISTEN_DATABASE_URL", "OUTBOX_KAFKA_SASL_PASSWORD"}
# Variables naming files the relay reads at start-up.
FILE_VARS = ["OUTBOX_AMQP_CA_FILE", "OUTBOX_AMQP_CLIENT_CERT_FILE", "OUTBOX_AMQP_CLIENT_KEY_FILE",
             "OUTBOX_NATS_CREDS_FILE", "OUTBOX_NATS_CA_FILE",
             "OUTBOX_KAFKA_CA_FILE", "OUTBOX_KAFKA_CLIENT_CERT_FILE", "OUTBOX_KAFKA_CLIENT_KEY_FILE"]
# Metrics named by the specification; the alerts may only use these (and up).
SPEC_METRICS = {
    "outbox_unpublished_events", "outbox_oldest_unpublished_age_seconds",
    "outbox_quarantined_events", "outbox_events_published_total",
    "outbox_publish_failures_total", "outbox_events_quarantined_total",
    "outbox_publish_lag_seconds", "outbox_retention_deleted_total",
    "outbox_gauges_refreshed_timestamp_seconds", "outbox_destination_ready",
}
# The counters and the histogram carry a destination label (README "Routes").
# The alerts on them are table-wide: each sum over them must drop it.
DESTINATION_METRICS = {"outbox_events_published_total", "outbox_publish_failures_total",
                       "outbox_events_quarantined_total", "outbox_publish_lag_seconds"}
# A URL with a password: never a plain value in a manifest.
PASSWORD_IN_URL = re.compile(r"://[^/@\s:]+:[^/@\s]+@")
# The relay's configuration file in the pods (configFile), and ${VAR} in it.
CONFIG_DIR = "/etc/outbox-relay/config"
CONFIG_PATH = f"{CONFIG_DIR}/outbox-relay.toml"
CONFIG_VAR = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def is_sink_var(name):
    """A sink setting: a destination's key in the file. With destinations the
    relay reads none of them from its environment, and the chart sets none."""
    return (name in {"OUTBOX_SINK", "OUTBOX_MESSAGE_FORMAT", "OUTBOX_CLOUDEVENTS_SOURCE"}
            or re.match(r"OUTBOX_(AMQP|SQS|NATS|KAFKA)_", name) is not None)


def routed(values):
    return bool((values.get("configFile") or {}).get("destination"))

failures = []


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


def fullname(values):
    if values.get("fullnameOverride"):
        return values["fullnameOverride"]
    name = values.get("nameOverride") or "outbox-relay"
    return RELEASE if name in RELEASE else f"{RELEASE}-{name}"


RELEASE = "ci"  # the release name deploy-checks renders with


# --- chart: workloads -----------------------------------------------------

def check_tls_files(pod, container, values, where):
    """The certificate Secret is mounted read-only where tls.mountPath says,
    and every file variable points into a mounted directory."""
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
    if nats.get("credsSecret"):
        volume = volumes.get("nats-creds", {})
        check(volume.get("secret", {}).get("secretName") == nats["credsSecret"], where,
              f"volume nats-creds must be Secret {nats['credsSecret']}, got {volume}")
        check({"name": "nats-creds", "mountPath": nats["credsMountPath"], "readOnly": True} in mounts, where,
              f"the nats-creds volume must be mounted read-only at {nats['credsMountPath']}, got {mounts}")
    else:
        check("nats-creds" not in volumes, where, "no nats-creds volume without nats.credsSecret")
    env = {e["name"]: e.get("value", "") for e in container.get("env", [])}
    dirs = [m["mountPath"].rstrip("/") + "/" for m in mounts]
    for name in FILE_VARS:
        path = env.get(name, "")
        if path:
            check(any(path.startswith(d) for d in dirs), where,
                  f"{name}={path} is in no mounted directory ({dirs})")


def check_env(container, values, where, database_secret, database_key):
    env = {e["name"]: e for e in container.get("env", [])}
    names = [e["name"] for e in container.get("env", [])]
    check(len(names) == len(set(names)), where, f"duplicate env names: {names}")

    db = env.get("OUTBOX_DATABASE_URL", {})
    ref = db.get("valueFrom", {}).get("secretKeyRef", {})
    check("value" not in db and ref == {"name": database_secret, "key": database_key},
          where, f"OUTBOX_DATABASE_URL must come from Secret {database_secret}/{database_key}, got {db}")
    listen = env.get("OUTBOX_LISTEN_DATABASE_URL")
    check(listen is None or "value" not in listen, where, "OUTBOX_LISTEN_DATABASE_URL must come from a Secret")

    amqp = values["amqp"]
    if amqp.get("existingSecret"):
        ref = env.get("OUTBOX_AMQP_URL", {}).get("valueFrom", {}).get("secretKeyRef", {})
        check(ref == {"name": amqp["existingSecret"], "key": amqp["secretKey"]},
              where, f"OUTBOX_AMQP_URL must come from Secret {amqp['existingSecret']}, got {env.get('OUTBOX_AMQP_URL')}")

    nats = values["nats"]
    if nats.get("existingSecret"):
        ref = env.get("OUTBOX_NATS_URL", {}).get("valueFrom", {}).get("secretKeyRef", {})
        check(ref == {"name": nats["existingSecret"], "key": nats["secretKey"]},
              where, f"OUTBOX_NATS_URL must come from Secret {nats['existingSecret']}, got {env.get('OUTBOX_NATS_URL')}")
    kafka = values["kafka"]
    password = env.get("OUTBOX_KAFKA_SASL_PASSWORD")
    if kafka.get("existingSecret"):
        ref = (password or {}).get("valueFrom", {}).get("secretKeyRef", {})
        check("value" not in (password or {}) and ref == {"name": kafka["existingSecret"], "key": kafka["passwordKey"]},
              where, f"OUTBOX_KAFKA_SASL_PASSWORD must come from Secret {kafka['existingSecret']}/{kafka['passwordKey']}, got {password}")
    else:
        check(password is None, where, f"OUTBOX_KAFKA_SASL_PASSWORD without kafka.existingSecret: {password}")

    creds_file = None
    if nats.get("credsSecret") and not routed(values):
        creds_file = nats["credsMountPath"].rstrip("/") + "/" + nats["credsKey"]
        check(env.get("OUTBOX_NATS_CREDS_FILE", {}).get("value") == creds_file, where,
              f"OUTBOX_NATS_CREDS_FILE must be the mounted {creds_file}, got {env.get('OUTBOX_NATS_CREDS_FILE')}")

    config_env = env.get("OUTBOX_CONFIG")
    if values.get("configFile"):
        check(config_env == {"name": "OUTBOX_CONFIG", "value": CONFIG_PATH}, where,
              f"OUTBOX_CONFIG must be {CONFIG_PATH} with configFile, got {config_env}")
    else:
        check(config_env is None, where, f"OUTBOX_CONFIG without configFile: {config_env}")

    for name, value in values["config"].items():
        wanted = env_string(value)
        if name == "OUTBOX_NATS_CREDS_FILE" and creds_file:
            continue
        if routed(values) and is_sink_var(name):
            check(name not in env, where,
                  f"{name} is a sink setting, which the relay does not read with configFile.destination: must be left unset, got {env.get(name)}")
        elif wanted == "":
            check(name not in env or "valueFrom" in env[name], where, f"{name} is empty in values and must be left unset")
        else:
            check(env.get(name, {}).get("value") == wanted, where,
                  f"{name} must be {wanted!r} (values config), got {env.get(name)}")

    for extra in values.get("extraEnv") or []:
        check(env.get(extra["name"]) == extra, where, f"extraEnv {extra['name']} missing or changed: {env.get(extra['name'])}")

    for e in container.get("env", []):
        check(not PASSWORD_IN_URL.search(str(e.get("value", ""))), where,
              f"{e['name']} holds a URL with a password as a plain value")


def same(a, b):
    """Equal, and of the same types all the way down: TOML tells 8 from 8.0
    where Python's == does not."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def config_strings(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from config_strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from config_strings(v)
    elif isinstance(value, str):
        yield value


def check_config_file(kinds, values, name, where):
    """configFile: the ConfigMap holds it as TOML, equal to the values with
    their types; the relay and migrate pods mount it read-only, with
    OUTBOX_CONFIG naming it (check_env); the pod template's checksum follows
    it; every ${VAR} in it is in the relay's environment. Without configFile,
    none of that exists."""
    maps = {m["metadata"]["name"]: m for m in kinds.get("ConfigMap", [])}
    file_values = values.get("configFile") or {}
    deployments = kinds.get("Deployment", [])
    jobs = kinds.get("Job", [])
    pods = [("Deployment", d["spec"]["template"], f"{name}-config") for d in deployments]
    pods += [("migrate Job", j["spec"]["template"], f"{name}-migrate-config") for j in jobs]
    if not file_values:
        check(not maps, where, f"ConfigMaps without configFile: {sorted(maps)}")
        for kind, template, _ in pods:
            check("config" not in {v["name"] for v in template["spec"].get("volumes") or []}, f"{where} {kind}",
                  "a config volume without configFile")
            check("checksum/config" not in (template["metadata"].get("annotations") or {}), f"{where} {kind}",
                  "checksum/config without configFile")
        return
    main = maps.get(f"{name}-config")
    if not check(main, where, f"no ConfigMap {name}-config with configFile, got {sorted(maps)}"):
        return
    text = main.get("data", {}).get("outbox-relay.toml", "")
    try:
        parsed = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        check(False, f"{where} ConfigMap {name}-config", f"outbox-relay.toml is not TOML: {error}\n{text}")
        return
    check(same(parsed, file_values), f"{where} ConfigMap {name}-config",
          f"outbox-relay.toml differs from configFile (values, types included):\n{text}\nwanted {file_values}")
    for kind, template, config_map in pods:
        w = f"{where} {kind}"
        pod = template["spec"]
        container = pod["containers"][0]
        volumes = {v["name"]: v for v in pod.get("volumes") or []}
        check(volumes.get("config", {}).get("configMap", {}).get("name") == config_map, w,
              f"volume config must be ConfigMap {config_map}, got {volumes.get('config')}")
        check({"name": "config", "mountPath": CONFIG_DIR, "readOnly": True} in (container.get("volumeMounts") or []), w,
              f"the config volume must be mounted read-only at {CONFIG_DIR}, got {container.get('volumeMounts')}")
        if check(config_map in maps, w, f"no ConfigMap {config_map}"):
            check(maps[config_map].get("data") == main.get("data"), w, f"ConfigMap {config_map} differs from {name}-config")
        env = {e["name"] for e in container.get("env", [])}
        if not container.get("envFrom"):
            missing = sorted({v for text in config_strings(file_values) for v in CONFIG_VAR.findall(text)} - env)
            check(not missing, w, f"configFile uses ${{VAR}} of variables the pod does not set: {missing}")
    for kind, template, _ in pods[:len(deployments)]:
        got = (template["metadata"].get("annotations") or {}).get("checksum/config")
        check(got == hashlib.sha256(text.encode()).hexdigest(), f"{where} {kind}",
              f"checksum/config must be the sha256 of the file, got {got}")
    hook = maps.get(f"{name}-migrate-config")
    if jobs and hook:
        annotations = hook["metadata"].get("annotations", {})
        job_weight = int(jobs[0]["metadata"].get("annotations", {}).get("helm.sh/hook-weight", "0"))
        check(set(annotations.get("helm.sh/hook", "").split(",")) == {"pre-install", "pre-upgrade"}
              and int(annotations.get("helm.sh/hook-weight", "0")) < job_weight, f"{where} ConfigMap {name}-migrate-config",
              f"must be a pre-install,pre-upgrade hook created before the Job, got {annotations}")
    check(bool(jobs) == bool(hook), where, f"ConfigMap {name}-migrate-config must exist exactly with the migrate Job")


def check_security(pod, container, where):
    psc = pod.get("securityContext", {})
    csc = container.get("securityContext", {})
    check(psc.get("runAsNonRoot") is True and csc.get("runAsNonRoot") is True,
          where, "runAsNonRoot must be true for the pod and the container")
    check(int(psc.get("runAsUser", 0)) != 0, where, "runAsUser must not be 0")
    check(csc.get("allowPrivilegeEscalation") is False, where, "allowPrivilegeEscalation must be false")
    check(csc.get("readOnlyRootFilesystem") is True, where, "readOnlyRootFilesystem must be true")
    check("ALL" in (csc.get("capabilities", {}).get("drop") or []), where, "capabilities must drop ALL")
    check(not (csc.get("capabilities", {}).get("add")), where, "no capabilities may be added")
    seccomp = (csc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
    check(seccomp == "RuntimeDefault", where, f"seccompProfile must be RuntimeDefault, got {seccomp}")


def check_chart_render(docs, values, label):
    where = f"chart ({label})"
    kinds = by_kind(docs)
    name = fullname(values)
    cfg = values["config"]
    http_port = int(str(cfg["OUTBOX_HTTP_ADDR"]).rsplit(":", 1)[1])
    timeout = seconds(cfg["OUTBOX_PUBLISH_TIMEOUT"])

    dep = one(kinds, "Deployment", where)
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
            check_security(pod, relay, w)
            database_secret = values["database"]["existingSecret"] or f"{name}-database"
            check_env(relay, values, w, database_secret, values["database"]["secretKey"])
            listen = {e["name"]: e for e in relay.get("env", [])}.get("OUTBOX_LISTEN_DATABASE_URL")
            listen_key = values["database"].get("listenSecretKey")
            want = ({"valueFrom": {"secretKeyRef": {"name": database_secret, "key": listen_key}}}
                    if listen_key else None)
            got = {k: v for k, v in listen.items() if k != "name"} if listen else None
            check(got == want, w, f"OUTBOX_LISTEN_DATABASE_URL must be {want}, got {got}")
            check_tls_files(pod, relay, values, w)
        grace = pod.get("terminationGracePeriodSeconds")
        check(grace == values["terminationGracePeriodSeconds"] and grace > timeout, w,
              f"terminationGracePeriodSeconds {grace} must be set from values and exceed OUTBOX_PUBLISH_TIMEOUT ({timeout}s)")
        check(pod.get("automountServiceAccountToken") is False, w, "automountServiceAccountToken must be false by default")

        sa_name = values["serviceAccount"].get("name") or name
        check(pod.get("serviceAccountName") == sa_name, w, f"serviceAccountName must be {sa_name}")
        sa = one(kinds, "ServiceAccount", where)
        if sa:
            check(sa["metadata"]["name"] == sa_name, where, "ServiceAccount name")
            check((sa["metadata"].get("annotations") or {}) == (values["serviceAccount"].get("annotations") or {}),
                  where, "ServiceAccount annotations must be those of values (IRSA)")

        svc = one(kinds, "Service", where)
        if svc:
            port = svc["spec"]["ports"][0]
            check(port["targetPort"] == "metrics" and port["port"] == values["service"]["port"], where,
                  f"Service must expose service.port -> metrics, got {port}")
            check(set(svc["spec"]["selector"].items()) <= set(pod_labels.items()), where, "Service selector does not match the pods")

        pdb = one(kinds, "PodDisruptionBudget", where)
        if pdb:
            check(set(pdb["spec"]["selector"]["matchLabels"].items()) <= set(pod_labels.items()), where,
                  "PDB selector does not match the pods")
            check(len({"minAvailable", "maxUnavailable"} & set(pdb["spec"])) == 1, where,
                  "PDB must set exactly one of minAvailable/maxUnavailable")

        job = one(kinds, "Job", where)
        if job:
            w = f"{where} migrate Job"
            hooks = set(job["metadata"].get("annotations", {}).get("helm.sh/hook", "").split(","))
            check({"pre-install", "pre-upgrade"} <= hooks, w, f"must be a pre-install,pre-upgrade hook, got {hooks}")
            jpod = job["spec"]["template"]["spec"]
            check(jpod.get("restartPolicy") == "Never", w, "restartPolicy must be Never")
            jlabels = job["spec"]["template"]["metadata"]["labels"]
            check(not set(spec["selector"]["matchLabels"].items()) <= set(jlabels.items()), w,
                  "the Deployment's selector must not select the migrate pod")
            mig = jpod["containers"][0]
            check(mig.get("args") == ["migrate"], w, f"args must be [migrate], got {mig.get('args')}")
            check_security(jpod, mig, w)
            m = values["migrations"]
            secret = m.get("existingSecret") or values["database"]["existingSecret"] or f"{name}-database"
            key = m["secretKey"] if m.get("existingSecret") else values["database"]["secretKey"]
            check_env(mig, values, w, secret, key)
            check_tls_files(jpod, mig, values, w)

    sm = kinds.get("ServiceMonitor", [])
    check(len(sm) == (1 if values["serviceMonitor"]["enabled"] else 0), where,
          f"ServiceMonitor must exist exactly when serviceMonitor.enabled ({len(sm)} found)")
    for monitor in sm:
        ep = monitor["spec"]["endpoints"][0]
        check(ep["port"] == "metrics" and ep["path"] == "/metrics", where, "ServiceMonitor must scrape metrics:/metrics")
        check({"action": "replace", "targetLabel": "job", "replacement": "outbox-relay"} in ep.get("relabelings", []),
              where, 'ServiceMonitor must set job="outbox-relay", which the alerts select')

    check_config_file(kinds, values, name, where)

    rules = kinds.get("PrometheusRule", [])
    check(len(rules) == (1 if values["prometheusRule"]["enabled"] else 0), where,
          f"PrometheusRule must exist exactly when prometheusRule.enabled ({len(rules)} found)")
    return rules[0] if rules else None


# --- alerts: one source ---------------------------------------------------

def expected_groups(file_groups, values):
    """The rule file after the substitutions the chart documents."""
    pr = values["prometheusRule"]
    groups = copy.deepcopy(file_groups)
    threshold = pr["oldestUnpublishedAge"]["threshold"]
    threshold = str(int(threshold)) if float(threshold).is_integer() else str(threshold)
    for group in groups:
        for rule in group["rules"]:
            if rule.get("alert") == AGE_ALERT:
                rule["expr"] = re.sub(r">\s*[0-9]+(\.[0-9]+)?\s*$", f"> {threshold}", rule["expr"].strip())
                rule["for"] = pr["oldestUnpublishedAge"]["for"]
            if rule.get("alert"):
                if pr.get("additionalRuleLabels"):
                    rule["labels"] = {**pr["additionalRuleLabels"], **rule.get("labels", {})}
                if pr.get("runbookUrl"):
                    rule["annotations"] = {**rule.get("annotations", {}), "runbook_url": pr["runbookUrl"]}
    return groups


def check_rule_file(rule_file, chart_values):
    where = str(RULES_FILE.relative_to(ROOT))
    groups = rule_file.get("groups", [])
    check([g["name"] for g in groups] == ["outbox-relay"], where, "one group named outbox-relay")
    rules = {r.get("alert"): r for g in groups for r in g["rules"]}
    check(set(rules) == ALERTS, where, f"alerts must be {sorted(ALERTS)}, got {sorted(rules)}")
    for name, rule in rules.items():
        ann = rule.get("annotations", {})
        check({"summary", "description", "runbook"} <= set(ann), where, f"{name} needs summary, description and runbook")
        check(rule.get("labels", {}).get("severity") in {"warning", "critical"}, where, f"{name} needs a severity")
        used = set(re.findall(r"\boutbox_[a-z_]+", rule["expr"]))
        check(used <= SPEC_METRICS, where, f"{name} uses metrics outside the specification: {used - SPEC_METRICS}")
        if used & DESTINATION_METRICS:
            sums = re.findall(r"\bsum\s+(without|by)\s*\(([^)]*)\)", rule["expr"])
            check(sums and all((kind == "without") == ("destination" in labels) for kind, labels in sums), where,
                  f"{name}: every sum over {sorted(used & DESTINATION_METRICS)} must drop the destination label (stay table-wide)")
    age = rules.get(AGE_ALERT, {})
    m = re.search(r">\s*([0-9]+(?:\.[0-9]+)?)\s*$", age.get("expr", ""))
    defaults = chart_values["prometheusRule"]["oldestUnpublishedAge"]
    check(m and float(m.group(1)) == float(defaults["threshold"]) and age.get("for") == defaults["for"],
          where, f"{AGE_ALERT} default threshold/for must equal values.yaml prometheusRule.oldestUnpublishedAge {defaults}")


def check_prometheus_rule(rule, file_groups, values, label, out):
    where = f"chart ({label}) PrometheusRule"
    want = expected_groups(file_groups, values)
    got = rule["spec"]["groups"]
    if not check(got == want, where, "differs from files/outbox-relay.rules.yml after the documented substitutions"):
        for g_got, g_want in zip(got, want):
            for r_got, r_want in zip(g_got["rules"], g_want["rules"]):
                if r_got != r_want:
                    failures.append(f"  {r_want.get('alert')}:\n    rendered {r_got}\n    expected {r_want}")
    out.write_text(yaml.safe_dump({"groups": got}, sort_keys=False))


# --- chart: values, schema, README ----------------------------------------

def check_values_and_docs(values, schema):
    where = "charts/outbox-relay/values.yaml"
    config_keys = set(values["config"])
    want = set(SPEC_VARS) - SECRET_VARS
    check(config_keys == want, where,
          f"config must hold every specification variable but {sorted(SECRET_VARS)}: missing {sorted(want - config_keys)}, extra {sorted(config_keys - want)}")
    check(set(schema["properties"]["config"]["properties"]) == want, "values.schema.json",
          f"config properties must be the specification variables but {sorted(SECRET_VARS)}")
    check(schema.get("additionalProperties") is False, "values.schema.json", "top level must set additionalProperties: false")
    check(set(values) <= set(schema["properties"]), "values.schema.json",
          f"values without a schema: {sorted(set(values) - set(schema['properties']))}")
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
        head = k.split(".")[0]
        check(head in values, "charts/outbox-relay/README.md", f"documents `{k}`, which values.yaml does not have")


def extract_sidecar_examples(render_dir):
    """The README's sidecar manifests, for kubernetes-validate."""
    readme = (CHART / "README.md").read_text()
    blocks = re.findall(r"<!-- sidecar-example -->\s*```yaml\n(.*?)```", readme, re.S)
    check(blocks, "charts/outbox-relay/README.md", "no sidecar example (a yaml block after <!-- sidecar-example -->)")
    for i, block in enumerate(blocks):
        docs = [d for d in yaml.safe_load_all(block) if d]
        where = f"charts/outbox-relay/README.md sidecar example {i + 1}"
        deployments = [d for d in docs if d.get("kind") == "Deployment"]
        if check(deployments, where, "has no Deployment"):
            pod = deployments[0]["spec"]["template"]["spec"]
            relay = [c for c in pod.get("containers", []) + pod.get("initContainers", []) if "outbox-relay" in c.get("image", "")]
            if check(relay and len(pod["containers"]) + len(pod.get("initContainers", [])) >= 2, where,
                     "needs the producer and the relay in one pod"):
                check_security(pod, relay[0], where)
                env = {e["name"]: e for e in relay[0].get("env", [])}
                check("secretKeyRef" in env.get("OUTBOX_DATABASE_URL", {}).get("valueFrom", {}), where,
                      "OUTBOX_DATABASE_URL must come from a Secret")
        (render_dir / f"sidecar-{i + 1}.yaml").write_text(block)


# --- docker-compose, Prometheus, Dockerfile -------------------------------

def check_compose():
    where = "docker-compose.yml"
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose.get("services", {})
    for name in ["postgres", "rabbitmq", "elasticmq", "relay-migrate", "relay", "producer", "prometheus"]:
        check(name in services, where, f"service {name} is missing")
    if set(services) < {"postgres", "rabbitmq", "relay-migrate", "relay", "producer", "prometheus"}:
        return
    for name in ["postgres", "rabbitmq"]:
        check("healthcheck" in services[name], where, f"{name} needs a healthcheck")
    check("15672:15672" in " ".join(services["rabbitmq"].get("ports", [])), where, "RabbitMQ management UI port 15672")

    allowed = set(SPEC_VARS) | {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    for name, command in [("relay-migrate", ["migrate"]), ("relay", ["run"])]:
        svc = services[name]
        env = svc.get("environment", {})
        check(set(env) <= allowed, where, f"{name}: variables outside the specification: {sorted(set(env) - allowed)}")
        check(set(SPEC_VARS) <= set(env), where, f"{name}: specification variables not set: {sorted(set(SPEC_VARS) - set(env))}")
        check(svc.get("command") == command, where, f"{name} must run {command}")
        check(svc.get("build") == "." or (svc.get("build") or {}).get("context") == ".", where, f"{name} builds the Dockerfile")
    relay = services["relay"]
    deps = relay.get("depends_on", {})
    check(deps.get("relay-migrate", {}).get("condition") == "service_completed_successfully", where,
          "relay must wait for relay-migrate to complete successfully")
    for dep in ["postgres", "rabbitmq"]:
        check(deps.get(dep, {}).get("condition") == "service_healthy", where, f"relay must wait for {dep} to be healthy")
    check(services["relay-migrate"].get("depends_on", {}).get("postgres", {}).get("condition") == "service_healthy",
          where, "relay-migrate must wait for postgres to be healthy")
    check(services["producer"].get("depends_on", {}).get("relay-migrate", {}).get("condition")
          == "service_completed_successfully", where, "producer must wait for the migration")
    producer = " ".join(map(str, services["producer"].get("command", [])))
    check("INSERT INTO outbox_event (id, event_type, aggregate_id, payload)" in producer, where,
          "producer must insert into outbox_event")
    grace = relay.get("stop_grace_period", "10s")
    check(seconds(grace) > seconds(relay["environment"]["OUTBOX_PUBLISH_TIMEOUT"]), where,
          "relay stop_grace_period must exceed OUTBOX_PUBLISH_TIMEOUT")

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
            check(re.fullmatch(r"apache/kafka:[0-9][0-9.]*", svc.get("image", "")), where,
                  f"{name} must use apache/kafka pinned by version, got {svc.get('image')}")
        check("healthcheck" in kafka, where, "kafka needs a healthcheck")
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
    for name, command in [("relay-migrate-routes", ["migrate"]), ("relay-routes", ["run"])]:
        svc = services[name]
        env = svc.get("environment", {})
        check(svc.get("command") == command, where, f"{name} must run {command}")
        mounts = {v.split(":")[1]: v.split(":")[0] for v in svc.get("volumes", [])}
        source = mounts.get(env.get("OUTBOX_CONFIG", ""))
        if not check(source and (ROOT / source).is_file(), where,
                     f"{name}: OUTBOX_CONFIG={env.get('OUTBOX_CONFIG')} must name a mounted file of the repository"):
            continue
        check(all(v.endswith(":ro") for v in svc.get("volumes", [])), where, f"{name}: mounts must be read-only")
        sink_vars = sorted(v for v in env if is_sink_var(v))
        check(not sink_vars, where, f"{name}: sink variables beside a file with destinations: {sink_vars}")
        check(env.get("OUTBOX_TABLE") and env.get("OUTBOX_TABLE") != relay_env.get("OUTBOX_TABLE"), where,
              f"{name} must relay a table of its own, not {relay_env.get('OUTBOX_TABLE')}")
        text = (ROOT / source).read_text()
        try:
            file = tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            check(False, source, f"not TOML: {error}")
            continue
        used = sorted(set(CONFIG_VAR.findall(text)) - set(env))
        check(not used, where, f"{name}: {source} uses ${{VAR}} of variables not set: {used}")
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


def check_kafka_render(docs, values):
    """The chart rendered for the Kafka sink: the relay (and the migrate Job,
    which validates the same configuration) gets every Kafka setting of
    values as it is, the SASL password only through its Secret, and its
    certificate files in the mounted tls Secret."""
    where = "chart (ci/kafka-values.yaml)"
    cfg = values["config"]
    check(cfg["OUTBOX_SINK"] == "kafka" and values["kafka"].get("existingSecret"), where,
          "ci/kafka-values.yaml must select the kafka sink with kafka.existingSecret")
    kinds = by_kind(docs)
    pods = [("Deployment", d["spec"]["template"]["spec"]) for d in kinds.get("Deployment", [])]
    pods += [("Job", j["spec"]["template"]["spec"]) for j in kinds.get("Job", [])]
    check(len(pods) == 2, where, f"expected the Deployment and the migrate Job, got {[k for k, _ in pods]}")
    for kind, pod in pods:
        container = pod["containers"][0]
        env = {e["name"]: e for e in container.get("env", [])}
        w = f"{where} {kind}"
        check(env.get("OUTBOX_SINK", {}).get("value") == "kafka", w, f"OUTBOX_SINK must be kafka, got {env.get('OUTBOX_SINK')}")
        for name in [v for v in SPEC_VARS if v.startswith("OUTBOX_KAFKA_") and v not in SECRET_VARS]:
            wanted = env_string(cfg.get(name))
            got = env.get(name, {}).get("value")
            if wanted:
                check(got == wanted, w, f"{name} must be {wanted!r}, got {env.get(name)}")
            else:
                check(name not in env, w, f"{name} is empty in values and must be left unset, got {env.get(name)}")
        password = env.get("OUTBOX_KAFKA_SASL_PASSWORD", {})
        check(password.get("valueFrom", {}).get("secretKeyRef")
              == {"name": values["kafka"]["existingSecret"], "key": values["kafka"]["passwordKey"]}
              and "value" not in password, w, f"OUTBOX_KAFKA_SASL_PASSWORD must come from kafka.existingSecret, got {password}")
        check_tls_files(pod, container, values, w)


def check_dockerfile():
    where = "Dockerfile"
    text = (ROOT / "Dockerfile").read_text()
    stages = re.split(r"^FROM\s", text, flags=re.M)
    check(len(stages) >= 3, where, "must be a multi-stage build")
    check(re.search(r"cargo build --release --locked --bin outbox-relay", text), where,
          "must build with cargo build --release --locked --bin outbox-relay")
    final = stages[-1]
    user = re.findall(r"^USER\s+(\S+)", final, re.M)
    check(user and re.fullmatch(r"[1-9][0-9]*(:[0-9]+)?", user[-1]), where, f"final stage needs a numeric non-root USER, got {user}")
    check(re.search(r'^ENTRYPOINT \["/usr/local/bin/outbox-relay"\]\s*$', final, re.M), where, "ENTRYPOINT")
    check(re.search(r'^CMD \["run"\]\s*$', final, re.M), where, 'CMD ["run"]')
    check(re.search(r"^EXPOSE 9090\s*$", final, re.M), where, "EXPOSE 9090")
    copies = re.findall(r"^COPY\s+(.*)$", final, re.M)
    check(len(copies) == 1 and "/usr/local/bin/outbox-relay" in copies[0], where, f"the runtime image gets the binary only, got {copies}")
    # The Kafka sink's librdkafka links OpenSSL 3 dynamically: without it
    # the binary does not start.
    check(re.search(r"apt-get install[^\n]*\blibssl3\b", final), where, "the runtime image needs libssl3 (librdkafka links libssl.so.3)")
    ignore = (ROOT / ".dockerignore").read_text().split()
    for entry in ["target/", ".git/"]:
        check(entry in ignore, ".dockerignore", f"must exclude {entry}")


def main():
    render_dir = Path(sys.argv[1])
    global CHART_YAML
    CHART_YAML = yaml.safe_load((CHART / "Chart.yaml").read_text())
    chart_values = yaml.safe_load((CHART / "values.yaml").read_text())
    full_values = deep_merge(chart_values, yaml.safe_load((CHART / "ci" / "full-values.yaml").read_text()))
    rules_default_values = deep_merge(chart_values, {"prometheusRule": {"enabled": True}, "serviceMonitor": {"enabled": True}})
    schema = json.loads((CHART / "values.schema.json").read_text())
    rule_file = yaml.safe_load(RULES_FILE.read_text())

    check_rule_file(rule_file, chart_values)
    check_values_and_docs(chart_values, schema)
    check(set(yaml.safe_load((CHART / "ci" / "full-values.yaml").read_text())) == set(chart_values),
          "charts/outbox-relay/ci/full-values.yaml", "must set every top-level value of values.yaml")

    check_chart_render(load_all(render_dir / "default.yaml"), chart_values, "default values")
    for label, values, name in [("prometheusRule enabled", rules_default_values, "rules-default"),
                                ("ci/full-values.yaml", full_values, "full")]:
        rule = check_chart_render(load_all(render_dir / f"{name}.yaml"), values, label)
        if rule:
            check_prometheus_rule(rule, rule_file["groups"], values, label, render_dir / f"{name}.rules.yml")

    routes_values = deep_merge(chart_values, yaml.safe_load((CHART / "ci" / "routes-values.yaml").read_text()))
    check(routed(routes_values) and len(routes_values["configFile"]["destination"]) >= 2
          and len(routes_values["configFile"].get("route") or []) >= 2,
          "charts/outbox-relay/ci/routes-values.yaml", "must set configFile with two destinations and two routes")
    check_chart_render(load_all(render_dir / "routes.yaml"), routes_values, "ci/routes-values.yaml")

    kafka_values = deep_merge(chart_values, yaml.safe_load((CHART / "ci" / "kafka-values.yaml").read_text()))
    kafka_docs = load_all(render_dir / "kafka.yaml")
    check_chart_render(kafka_docs, kafka_values, "ci/kafka-values.yaml")
    check_kafka_render(kafka_docs, kafka_values)

    extract_sidecar_examples(render_dir)
    check_compose()
    check_dockerfile()

    if failures:
        print(f"deploy_checks.py: {len(failures)} problem(s):", file=sys.stderr)
        for failure in failures:
            print(f"  - {failure}", file=sys.stderr)
        return 1
    print("deploy_checks.py: chart, alert rules, compose and Dockerfile assertions passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
