#!/usr/bin/env python3
"""Checks of the Grafana dashboard, run by .ci/deploy-checks.

    dashboard_checks.py schema NODE_MODULES
    dashboard_checks.py rules OUT_FILE
    dashboard_checks.py metrics RELAY_BINARY

schema   deploy/grafana/outbox-relay.json against the dashboard types of
         Grafana's own schema package, @grafana/schema (NODE_MODULES holds it
         and TypeScript, pinned by deploy-checks): the dashboard as the
         `Dashboard` type of the Grafana version the chart targets, each
         panel's options and custom field config as its plugin's `Options`
         and `FieldConfig`, each query as a Prometheus query; type-checked by
         `tsc` with excess-property checks, so a misspelt or unknown field
         fails like a wrong type. Then what the types cannot say: ids, grid,
         data sources, variables, runbook links.
rules    every query (panel targets; variable queries) with the template
         variables replaced by valid values, as recording rules in OUT_FILE
         for `promtool check rules`.
metrics  starts RELAY_BINARY with two [[source]] tables (two databases
         created for the run on the local PostgreSQL, migrated, dropped
         after) and a [[destination]] on the local RabbitMQ, reads its
         /metrics, stops it, and fails if the dashboard names a metric the
         relay does not export, or leaves out the source or destination
         filter on a series that carries that label.

Every failure names the panel (or variable) and what is wrong; the exit
status is 1 if there is any.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "outbox-relay.json"
OPERATIONS = ROOT / "docs" / "operations.md"
RULES_FILE = ROOT / "charts" / "outbox-relay" / "files" / "outbox-relay.rules.yml"

# The dashboard's template variables and what they must be.
DATASOURCE_VAR = "datasource"
RUNBOOK_VAR = "runbook_url"
# Narrowing variables: each query selector filters on them. "All" is ".*",
# which also matches a series without the label: a relay without [[source]]
# tables has no source label, one without [[destination]] tables no
# destination label, and Prometheus outside Kubernetes no namespace or
# service label.
SCOPE_VARS = ["job", "namespace", "service"]
LABEL_VARS = ["source", "destination"]
# Grafana's own variables and a valid value for each, for promtool.
BUILTINS = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h", "__range_s": "3600",
            "__interval_ms": "60000", "__range_ms": "3600000"}
# Series Prometheus makes itself for every target: the only names a query
# may use that the relay does not export.
SCRAPE_SERIES = {"up"}
# Panel types and the directory of their types in @grafana/schema.
PANEL_TYPES = {"stat": "stat", "timeseries": "timeseries", "state-timeline": "statetimeline"}

PROMQL_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
                   "offset", "bool", "inf", "nan", "atan2", "start", "end"}

failures = []


def check(condition, where, message):
    if not condition:
        failures.append(f"{where}: {message}")
    return bool(condition)


def finish(ok_message):
    if failures:
        print(f"dashboard_checks.py: {len(failures)} problem(s):", file=sys.stderr)
        for failure in failures:
            print(f"  - {failure}", file=sys.stderr)
        return 1
    print(f"dashboard_checks.py: {ok_message}")
    return 0


# --- the dashboard -------------------------------------------------------------

def load_dashboard():
    try:
        return json.loads(DASHBOARD.read_text())
    except json.JSONDecodeError as error:
        print(f"dashboard_checks.py: {DASHBOARD.relative_to(ROOT)} is not valid JSON: {error}", file=sys.stderr)
        sys.exit(1)


def all_panels(dashboard):
    """Every panel, those inside collapsed rows too, rows included."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", []) if panel.get("type") == "row" else []


def panel_name(panel):
    return f'panel {panel.get("id")} "{panel.get("title", "")}"'


def variables(dashboard):
    return {v["name"]: v for v in dashboard.get("templating", {}).get("list", [])}


def queries(dashboard):
    """(where, expression) of every Prometheus query: the panels' targets
    and the query variables' label_values() selectors."""
    out = []
    for panel in all_panels(dashboard):
        for target in panel.get("targets", []):
            out.append((f'{panel_name(panel)} query {target.get("refId")}', target.get("expr", "")))
    for name, var in variables(dashboard).items():
        if var.get("type") == "query":
            m = re.fullmatch(r"\s*label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)\s*", str(var.get("query", "")))
            if check(m, f"variable {name}", f"query must be label_values(<selector>, <label>), got {var.get('query')!r}"):
                check(m.group(2) == name, f"variable {name}", f"must take the values of the label {name}, takes {m.group(2)}")
                out.append((f"variable {name}", m.group(1)))
    return out


VARIABLE_REF = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::[a-z]+)?\}|([A-Za-z_][A-Za-z0-9_]*))")


def substitute(expr):
    """The expression Prometheus would get: Grafana's variables as a valid
    value each, the dashboard's (only ever in regex matchers) as ".*"."""
    def value(m):
        name = m.group(1) or m.group(2)
        return BUILTINS.get(name, ".*")
    return VARIABLE_REF.sub(value, expr)


def without_strings(expr):
    return re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)


def metric_names(expr):
    """The metric names an expression selects: identifiers that are not a
    function, keyword, label (in matchers and grouping lists) or duration."""
    text = without_strings(expr)
    text = re.sub(r"\{[^}]*\}", " ", text)   # matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for m in re.finditer(r"(?<![A-Za-z0-9_:.])([A-Za-z_:][A-Za-z0-9_:]*)", text):
        name = m.group(1)
        if name.lower() in PROMQL_KEYWORDS or re.match(r"\s*\(", text[m.end():]):
            continue
        names.add(name)
    return names


def selectors(expr):
    """(name, {label: (operator, value)}) of every selector with matchers."""
    out = []
    for m in re.finditer(r"(?<![A-Za-z0-9_:])([A-Za-z_:][A-Za-z0-9_:]*)\s*\{([^}]*)\}", expr):
        matchers = {}
        for lm in re.finditer(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"', m.group(2)):
            matchers[lm.group(1)] = (lm.group(2), lm.group(3))
        out.append((m.group(1), matchers))
    return out


def anchors(markdown):
    """GitHub's anchors of a Markdown file's headings."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+\s+(.*)$", markdown, re.M)}


# --- schema ------------------------------------------------------------------------

def composable_module(package, directory):
    """The export of @grafana/schema that carries a panel plugin's types."""
    exports = package.get("exports", {})
    for key in exports:
        if re.fullmatch(rf"\./dist/esm/raw/composable/{directory}/panelcfg/x/[A-Za-z]+_types\.gen", key):
            return "@grafana/schema" + key[1:]
    return None


def typescript_program(dashboard, package, node_modules):
    """A TypeScript module that type-checks only if the dashboard fits
    Grafana's types. JSON is TypeScript's object-literal syntax, so each
    part is pasted as it is, under the type it must have. Json<T> reads a
    string enum of the types as the union of its values, which is what JSON
    carries (TypeScript would otherwise insist on the enum's members)."""
    lines = [
        "// Generated by .ci/dashboard_checks.py from deploy/grafana/outbox-relay.json.",
        "import type { Dashboard, DataQuery } from '@grafana/schema';",
    ]
    modules = {}
    for panel_type, directory in PANEL_TYPES.items():
        module = composable_module(package, directory)
        if module:
            alias = "panel_" + directory
            modules[panel_type] = alias
            lines.append(f"import type * as {alias} from '{module}';")
    lines += [
        "",
        "type Json<T> = T extends string ? `${T}`",
        "  : T extends number | boolean | null | undefined ? T",
        "  : T extends ReadonlyArray<infer U> ? Array<Json<U>>",
        "  : T extends object ? { [K in keyof T]: Json<T[K]> }",
        "  : T;",
        "",
        "// A Prometheus query as Grafana's Prometheus data source stores it in a",
        "// panel (the schema package leaves targets open to each data source).",
        "interface PrometheusQuery extends DataQuery {",
        "  expr: string;",
        "  legendFormat?: string;",
        "  range?: boolean;",
        "  instant?: boolean;",
        "  format?: 'time_series' | 'table' | 'heatmap';",
        "  editorMode?: 'code' | 'builder';",
        "  exemplar?: boolean;",
        "  interval?: string;",
        "}",
        "",
        "// the dashboard",
        f"export const dashboard: Json<Dashboard> = {json.dumps(dashboard, indent=2)};",
    ]
    have_field_config = {}
    for panel_type, directory in PANEL_TYPES.items():
        path = Path(node_modules) / "@grafana" / "schema" / "dist" / "types" / "raw" / "composable" / directory / "panelcfg" / "x" / "types.gen.d.ts"
        have_field_config[panel_type] = path.is_file() and "export interface FieldConfig " in path.read_text()
    for panel in all_panels(dashboard):
        if panel.get("type") == "row":
            continue
        where = panel_name(panel)
        alias = modules.get(panel.get("type"))
        if not check(alias, where, f"type {panel.get('type')!r} is none of the types this check knows ({sorted(PANEL_TYPES)}): add it there"):
            continue
        n = panel.get("id")
        lines.append(f"\n// {where}")
        lines.append(f"export const options_{n}: Json<{alias}.Options> = {json.dumps(panel.get('options', {}), indent=2)};")
        custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom")
        if have_field_config[panel["type"]]:
            lines.append(f"export const custom_{n}: Json<{alias}.FieldConfig> = {json.dumps(custom or {}, indent=2)};")
        else:
            check(custom is None, where, f"fieldConfig.defaults.custom set, but the {panel['type']} panel has no custom field config")
        lines.append(f"export const targets_{n}: Array<Json<PrometheusQuery>> = {json.dumps(panel.get('targets', []), indent=2)};")
    return "\n".join(lines) + "\n"


def run_tsc(program, node_modules):
    """tsc over the program; (ok, report) with each error named by panel."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "node_modules").symlink_to(Path(node_modules).resolve())
        (tmp / "check.ts").write_text(program)
        (tmp / "tsconfig.json").write_text(json.dumps({
            "compilerOptions": {"strict": True, "noEmit": True, "target": "es2022", "module": "esnext",
                                "moduleResolution": "bundler", "types": [], "skipLibCheck": True,
                                "noErrorTruncation": True},
            "files": ["check.ts"],
        }))
        tsc = Path(node_modules) / "typescript" / "bin" / "tsc"
        result = subprocess.run(["node", str(tsc), "-p", str(tmp / "tsconfig.json"), "--pretty", "false"],
                                cwd=tmp, capture_output=True, text=True, timeout=120)
    if result.returncode == 0:
        return True, ""
    source = program.splitlines()
    report = []
    for line in (result.stdout + result.stderr).splitlines():
        m = re.match(r"check\.ts\((\d+),\d+\): (.*)", line)
        if m:
            number = int(m.group(1))
            context = next((source[i][3:] for i in range(number - 1, -1, -1) if source[i].startswith("// ")), "")
            report.append(f"{context}, line {number} of the generated check ({source[number - 1].strip()[:80]}): {m.group(2)}")
        elif line.strip():
            report.append(line)
    return False, "\n".join(report) or f"tsc exited with {result.returncode}"


def grid_checks(dashboard):
    cells = {}
    for panel in dashboard.get("panels", []):
        g = panel.get("gridPos", {})
        where = panel_name(panel)
        if not check({"x", "y", "w", "h"} <= set(g), where, f"gridPos needs x, y, w and h, got {g}"):
            continue
        check(g["w"] > 0 and g["h"] > 0 and g["x"] >= 0 and g["y"] >= 0 and g["x"] + g["w"] <= 24, where,
              f"gridPos {g} is outside the 24-column grid")
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                other = cells.setdefault((x, y), where)
                if other != where:
                    check(False, where, f"overlaps {other} at column {x}, row {y}")
                    break
            else:
                continue
            break


def check_structure(dashboard, package_schema_version):
    where = str(DASHBOARD.relative_to(ROOT))
    check(dashboard.get("uid") == "outbox-relay", where, f"uid must stay outbox-relay (links and the chart's ConfigMap rely on it), got {dashboard.get('uid')!r}")
    check(dashboard.get("id") is None, where, "id must be null: it is internal to one Grafana instance")
    check(dashboard.get("schemaVersion") == package_schema_version, where,
          f"schemaVersion must be {package_schema_version}, the targeted Grafana's (@grafana/schema's defaultDashboard), got {dashboard.get('schemaVersion')}")
    check(dashboard.get("title"), where, "needs a title")

    ids = [p.get("id") for p in all_panels(dashboard)]
    check(all(isinstance(i, int) for i in ids) and len(ids) == len(set(ids)), where, f"panel ids must be unique integers, got {ids}")
    grid_checks(dashboard)

    vars_ = variables(dashboard)
    ds = vars_.get(DATASOURCE_VAR, {})
    check(ds.get("type") == "datasource" and ds.get("query") == "prometheus", f"variable {DATASOURCE_VAR}",
          "must be a datasource variable of type prometheus")
    runbook = vars_.get(RUNBOOK_VAR, {})
    check(runbook.get("type") == "constant" and runbook.get("query") == "docs/operations.md"
          and runbook.get("current", {}).get("value") == "docs/operations.md", f"variable {RUNBOOK_VAR}",
          "must be a constant docs/operations.md (the chart replaces it with prometheusRule.runbookUrl)")
    for name in SCOPE_VARS + LABEL_VARS:
        var = vars_.get(name)
        if not check(var, where, f"no template variable {name}"):
            continue
        w = f"variable {name}"
        check(var.get("type") == "query" and var.get("datasource") == {"type": "prometheus", "uid": f"${{{DATASOURCE_VAR}}}"},
              w, "must be a query variable on the datasource variable")
        if name != "job":
            check(var.get("includeAll") is True and var.get("allValue") == ".*" and var.get("multi") is True, w,
                  'needs includeAll, multi and allValue ".*" (".*" also matches series without the label)')
            check(var.get("current", {}).get("value") in ("$__all", ["$__all"]), w, "must default to All")

    defined = set(vars_) | set(BUILTINS)
    operation_anchors = anchors(OPERATIONS.read_text())
    linked = set()
    for panel in all_panels(dashboard):
        w = panel_name(panel)
        if panel.get("type") == "row":
            continue
        check(panel.get("title") and panel.get("description"), w, "needs a title and a description")
        check(panel.get("datasource") == {"type": "prometheus", "uid": f"${{{DATASOURCE_VAR}}}"}, w,
              f"datasource must be the ${{{DATASOURCE_VAR}}} variable, got {panel.get('datasource')}")
        refs = [t.get("refId") for t in panel.get("targets", [])]
        check(refs and len(refs) == len(set(refs)), w, f"needs queries with distinct refIds, got {refs}")
        for target in panel.get("targets", []):
            check(target.get("datasource") == panel.get("datasource"), w, f"query {target.get('refId')}: datasource must be the panel's")
        for link in panel.get("links", []):
            url = link.get("url", "")
            m = re.fullmatch(r"\$\{" + RUNBOOK_VAR + r"\}#([a-z0-9-]+)", url)
            if check(m, w, f"link {url!r} must be ${{{RUNBOOK_VAR}}}#<a section of docs/operations.md>"):
                check(m.group(1) in operation_anchors, w, f"link {url!r}: docs/operations.md has no section #{m.group(1)}")
                linked.add(m.group(1))
    for link in dashboard.get("links", []):
        check(link.get("url", "").startswith(f"${{{RUNBOOK_VAR}}}"), where, f"dashboard link {link.get('url')!r} must start with ${{{RUNBOOK_VAR}}}")

    # Every runbook is a click away, and so is every alert's.
    runbooks = {a for a in operation_anchors if a.startswith("runbook-")}
    alert_runbooks = set(re.findall(r"runbook_url:\s*docs/operations\.md#([a-z0-9-]+)", RULES_FILE.read_text()))
    check(runbooks <= linked, where, f"runbooks no panel links to: {sorted(runbooks - linked)}")
    check(alert_runbooks <= linked, where, f"alert runbooks no panel links to: {sorted(alert_runbooks - linked)}")

    for w, expr in queries(dashboard):
        for m in VARIABLE_REF.finditer(expr):
            name = m.group(1) or m.group(2)
            check(name in defined, w, f"uses ${name}, which is no variable of the dashboard")
        for name, matchers in selectors(expr):
            if w.startswith("variable "):
                continue
            for var in SCOPE_VARS:
                check(matchers.get(var) == ("=~", f"${var}"), w, f'selector {name} must have {var}=~"${var}", got {matchers}')


def cmd_schema(node_modules):
    dashboard = load_dashboard()
    package_dir = Path(node_modules) / "@grafana" / "schema"
    package = json.loads((package_dir / "package.json").read_text())
    defaults = (package_dir / "dist" / "esm" / "raw" / "dashboard" / "x" / "types.gen.mjs").read_text()
    version = re.search(r"schemaVersion:\s*(\d+)", defaults)
    check(version, "@grafana/schema", "no schemaVersion in its defaultDashboard")
    check_structure(dashboard, int(version.group(1)) if version else None)
    ok, report = run_tsc(typescript_program(dashboard, package, node_modules), node_modules)
    check(ok, f"{DASHBOARD.relative_to(ROOT)} against @grafana/schema {package['version']}", "\n" + report)
    panels = sum(1 for p in all_panels(dashboard) if p.get("type") != "row")
    return finish(f"dashboard fits @grafana/schema {package['version']} (schemaVersion {version.group(1) if version else '?'}); "
                  f"{panels} panels, their links and variables checked")


# --- rules -------------------------------------------------------------------------

def cmd_rules(out):
    """Recording rules, one per query: promtool parses each expression."""
    dashboard = load_dashboard()
    rules = []
    for i, (where, expr) in enumerate(queries(dashboard)):
        concrete = substitute(expr)
        # ("$1" of label_replace is a capture group, not a variable.)
        check(not VARIABLE_REF.search(concrete), where, f"a variable is left after substitution: {concrete}")
        rules.append({"record": f"dashboard:query_{i}", "expr": concrete, "labels": {"where": where}})
    Path(out).write_text(json.dumps({"groups": [{"name": "dashboard-queries", "rules": rules}]}, indent=2))
    return finish(f"{len(rules)} dashboard queries written to {out} for promtool")


# --- metrics ----------------------------------------------------------------------

def exposition(text):
    """(name -> set of label names) of the samples, and the names a family's
    TYPE implies (counters' _total; histograms' _bucket, _sum, _count)."""
    samples = {}
    implied = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(None, 3)
            suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"],
                        "summary": ["", "_sum", "_count"]}.get(kind.strip(), [""])
            implied |= {family + s if not family.endswith(s) else family for s in suffixes}
        elif line and not line.startswith("#"):
            m = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s", line)
            if m:
                labels = set(re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="', m.group(3) or ""))
                samples.setdefault(m.group(1), set()).update(labels)
    return samples, implied


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def psql(url, sql):
    subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url, "-c", sql],
                   check=True, capture_output=True, text=True, timeout=60)


def scrape(binary):
    """The relay's /metrics with two sources and a destination."""
    pg_url = os.environ.get("OUTBOX_TEST_PG_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    amqp_host = os.environ.get("OUTBOX_TEST_AMQP_HOST", "127.0.0.1")
    sources = ["orders", "billing"]
    databases = {s: f"outbox_dashboard_check_{os.getpid()}_{s}" for s in sources}
    tmp = Path(tempfile.mkdtemp(prefix="outbox-dashboard-"))
    created, proc, log = [], None, tmp / "relay.log"
    try:
        for s, db in databases.items():
            psql(pg_url, f'CREATE DATABASE "{db}"')
            created.append(db)
        parts = urlsplit(pg_url)
        config = "".join(
            f'[[source]]\nname = "{s}"\ndatabase_url = "{urlunsplit(parts._replace(path="/" + db))}"\n\n'
            for s, db in databases.items())
        config += ('[[destination]]\nname = "events"\nsink = "rabbitmq"\n'
                   f'amqp_url = "amqp://guest:guest@{amqp_host}:5672/%2f"\namqp_exchange = "amq.topic"\n')
        (tmp / "outbox-relay.toml").write_text(config)
        port = free_port()
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OUTBOX_CONFIG": str(tmp / "outbox-relay.toml"),
               "OUTBOX_HTTP_ADDR": f"127.0.0.1:{port}"}
        migrate = subprocess.run([binary, "migrate"], env=env, capture_output=True, text=True, timeout=120)
        if migrate.returncode != 0:
            raise RuntimeError(f"outbox-relay migrate exited with {migrate.returncode}:\n{migrate.stdout}{migrate.stderr}")
        with open(log, "w") as out:
            proc = subprocess.Popen([binary, "run"], env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        # Every source's and the destination's series, once the relay has
        # started them all.
        wanted = [f'outbox_source_ready{{source="{s}"}}' for s in sources] + ['outbox_destination_ready{destination="events"}']
        deadline = time.monotonic() + 20
        text = ""
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"outbox-relay run exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                    text = response.read().decode()
                if all(w in text for w in wanted):
                    return text
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"no /metrics with {wanted} within 20 s; last answer:\n{text[-2000:]}\nrelay log:\n{log.read_text()[-3000:]}")
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for db in created:
            try:
                psql(pg_url, f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            except subprocess.SubprocessError as error:
                print(f"dashboard_checks.py: could not drop database {db}: {error}", file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)


def cmd_metrics(binary):
    dashboard = load_dashboard()
    started = time.monotonic()
    try:
        text = scrape(binary)
    except (RuntimeError, subprocess.SubprocessError, OSError) as error:
        detail = getattr(error, "stderr", "") or ""
        print(f"dashboard_checks.py: could not read a live /metrics: {error}\n{detail}", file=sys.stderr)
        return 1
    samples, implied = exposition(text)
    exported = set(samples) | implied
    used = set()
    for where, expr in queries(dashboard):
        names = metric_names(substitute(expr))
        check(names, where, f"selects no metric: {expr}")
        for name in sorted(names):
            used.add(name)
            check(name in exported or name in SCRAPE_SERIES, where,
                  f"uses {name}, which the relay does not export (exported: {', '.join(sorted(exported))})")
        if where.startswith("variable "):
            continue
        # A series that carries the label must be filtered by its variable.
        for name, matchers in selectors(expr):
            for label in LABEL_VARS:
                if label in samples.get(name, set()):
                    check(matchers.get(label) == ("=~", f"${label}"), where,
                          f'selector {name} must filter on {label}=~"${label}": the relay labels it so')
    unused = sorted(n for n in samples if n not in used)
    if unused:
        print(f"dashboard_checks.py: NOTE: exported but on no panel: {', '.join(unused)}", file=sys.stderr)
    relay_metrics = sorted(n for n in used if n not in SCRAPE_SERIES)
    return finish(f"the dashboard's {len(relay_metrics)} metric names (and Prometheus's up) are all on a live /metrics "
                  f"of {binary} with two sources and a destination (read in {time.monotonic() - started:.1f}s)")


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in {"schema", "rules", "metrics"}:
        print(__doc__, file=sys.stderr)
        return 2
    command, argument = sys.argv[1], sys.argv[2]
    return {"schema": cmd_schema, "rules": cmd_rules, "metrics": cmd_metrics}[command](argument)


if __name__ == "__main__":
    sys.exit(main())
