"""The Grafana dashboard of a sparkfleet office (`sparkfleet dashboard` prints it): a `host` variable and panels
for the engines, the GB10, memory, the front door and per-user usage, over the office's Prometheus (the monitoring
host's: scrape jobs and labels in contract/monitoring.py).

The engines' panels are built from their descriptors (contract/engines.py): each panel asks every engine's series
of one meaning (`or`, so a fleet of mixed engines shows in one panel), and a panel no engine has a series for is
left out; nothing here names an engine, so a new one's series reach the dashboard with its descriptor. Pure:
`dashboard()` is plain data, `dashboard_json()` its text."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from sparkfleet.contract import engines
from sparkfleet.contract import monitoring as m

DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
HOST = 'host=~"$host"'  # the dashboard's `host` variable, on every per-host series
RATE = "5m"
WIDTH = 24  # Grafana's grid
HEIGHT = 7
_DOORS = f'job=~"{m.JOB_FRONT_DOOR}|{m.JOB_FRONT_DOOR_TLS}",proxy="{m.FRONT_DOOR_PROXY}",server=~"$host"'


@dataclass
class Panel:
    """One panel: its targets as (PromQL, legend) and how Grafana shows them; laid out by `dashboard`."""

    title: str
    targets: list[tuple[str, str]]
    kind: str = "timeseries"
    width: int = 8
    unit: str | None = None
    description: str | None = None
    table: bool = False  # instant queries shown as a table
    mappings: list[dict] = field(default_factory=list)

    def to_dict(self, panel_id: int, x: int, y: int) -> dict:
        defaults: dict = {}
        if self.unit:
            defaults["unit"] = self.unit
        if self.mappings:
            defaults["mappings"] = self.mappings
        targets = [{"datasource": DATASOURCE, "refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend,
                    **({"instant": True, "format": "table"} if self.table else {})}
                   for i, (expr, legend) in enumerate(self.targets)]
        return {"type": self.kind, "title": self.title, "datasource": DATASOURCE,
                "gridPos": {"h": HEIGHT, "w": self.width, "x": x, "y": y}, "targets": targets,
                "fieldConfig": {"defaults": defaults, "overrides": []}, "options": {},
                **({"description": self.description} if self.description else {}), "id": panel_id}


def selected(series: Iterable[str], each: str = "{}") -> str:
    """Every engine's series of one meaning on the chosen hosts, `each` around each one, joined with `or`."""
    return " or ".join(each.format(f"{name}{{{HOST}}}") for name in series)


def rate(name: str) -> str:
    return f"rate({name}{{{HOST}}}[{RATE}])"


def ratios(pairs: Iterable[tuple[str, str]]) -> list[str]:
    """Per host, each engine's rate of one counter over another's (its hit rate, its acceptance)."""
    return [f"sum by (host) ({rate(a)}) / sum by (host) ({rate(b)})" for a, b in pairs]


def engine_panels() -> list[Panel]:
    """The engines' panels, each from every descriptor that exports its series (none: the panel is left out)."""
    found = tuple(engines.DESCRIPTORS.values())
    hists = {"ttft": [d.metrics.ttft_seconds for d in found if d.metrics.ttft_seconds],
             "itl": [d.metrics.inter_token_seconds for d in found if d.metrics.inter_token_seconds]}
    prefix = [*ratios((d.bench.prefix_hits[0], d.bench.prefix_queries[0]) for d in found
                      if d.bench.prefix_hits and d.bench.prefix_queries),
              *(f"max by (host) ({d.bench.prefix_gauge}{{{HOST}}})" for d in found if d.bench.prefix_gauge)]
    spec = ratios((d.bench.spec_accepted[0], d.bench.spec_draft_tokens[0]) for d in found
                  if d.bench.spec_accepted and d.bench.spec_draft_tokens)
    finished = [d.metrics.finished for d in found if d.metrics.finished]

    def quantile(names: list[str]) -> str:
        return (f"histogram_quantile(0.95, sum by (host, le) "
                f"({' or '.join(rate(f'{name}_bucket') for name in names)}))")

    panels = [
        Panel("KV cache usage", [(selected(engines.every("kv_usage")), "{{host}}")], unit="percentunit"),
        Panel("Requests running and waiting",
              [(f"sum by (host) ({selected(engines.every('running'))})", "{{host}} running"),
               (f"sum by (host) ({selected(engines.every('waiting'))})", "{{host}} waiting")]),
        Panel("Decode rate", [(f"sum by (host) ({' or '.join(map(rate, engines.every('generation_tokens')))})",
                               "{{host}}")], unit="short", description="generation tokens per second"),
        Panel("Prefill rate", [(f"sum by (host) ({' or '.join(map(rate, engines.every('prompt_tokens')))})",
                                "{{host}}")], unit="short", description="prompt tokens per second"),
        Panel("Time to first token, p95", [(quantile(hists["ttft"]), "{{host}}")] if hists["ttft"] else [],
              unit="s"),
        Panel("Inter-token latency, p95", [(quantile(hists["itl"]), "{{host}}")] if hists["itl"] else [], unit="s"),
        Panel("Prefix cache hit rate", [(" or ".join(prefix), "{{host}}")] if prefix else [], unit="percentunit"),
        Panel("Speculative decoding: draft acceptance", [(" or ".join(spec), "{{host}}")] if spec else [],
              unit="percentunit",
              description="accepted draft tokens / draft tokens (hosts serving with speculative decoding)"),
        Panel("Requests finished", [(f"sum by (host, {label}) ({rate(name)})", f"{{{{host}}}} {{{{{label}}}}}")
                                    for name, label in finished], unit="reqps"),
    ]
    return [p for p in panels if p.targets and all(expr for expr, _ in p.targets)]


def sections() -> list[tuple[str, list[Panel]]]:
    """The dashboard's rows, in order, each with its panels."""
    benign = "|".join(m.BENIGN_THROTTLE_REASONS)
    up = {"type": "value", "options": {"0": {"text": "down", "color": "red"},
                                       "1": {"text": "serving", "color": "green"}}}
    memory = f'job="{m.JOB_NODE}",{HOST}'
    return [
        ("Hosts", [
            Panel("Engine up", [(f'min by (host) (up{{job="{m.JOB_ENGINE}",{HOST}}})', "{{host}}")], kind="stat",
                  width=6, mappings=[up],
                  description="1: every engine on the host answers its scrape (through the guard, with the backend "
                              "key)"),
            Panel("Out of rotation on the front door",
                  [(f'{m.SERVER_STATUS_METRIC}{{{_DOORS},state=~"{"|".join(m.DRAINED_STATES)}"}} == 1',
                    "{{server}} {{state}}")], kind="table", width=6, table=True,
                  description="MAINT: drained (sparkfleet drain, or a rollout's batch); DRAIN: finishing its requests"),
            Panel("Watchdog gave up", [(f"sum by (host) (sparkfleet_watchdog_gave_up{{{HOST}}})", "{{host}}")],
                  kind="stat", width=6),
            Panel("Watchdog restarts, last hour",
                  [(f"sum by (host) (increase(sparkfleet_watchdog_restarts_total{{{HOST}}}[1h]))", "{{host}}")],
                  kind="stat", width=6),
        ]),
        ("Engines", engine_panels()),
        ("GB10", [
            Panel("SM clock / its maximum",
                  [(f"max by (host) (sparkfleet_gpu_sm_clock_mhz{{{HOST}}}) / "
                    f"max by (host) (sparkfleet_gpu_sm_clock_max_mhz{{{HOST}}} > 0)", "{{host}}")],
                  unit="percentunit", description="power-delivery throttling (500-850 MHz) costs 15-35 % of decode "
                                                  "speed"),
            Panel("SM clock", [(f"sparkfleet_gpu_sm_clock_mhz{{{HOST}}}", "{{host}}")], unit="suffix: MHz"),
            Panel("Throttle reasons active",
                  [(f'sparkfleet_gpu_throttle_active{{{HOST},reason!~"{benign}"}} == 1', "{{host}} {{reason}}")],
                  description="active throttle reasons; gpu_idle, applications_clocks_setting and sync_boost slow "
                              "nothing and are left out"),
            Panel("Power draw", [(f"sparkfleet_gpu_power_draw_watts{{{HOST}}}", "{{host}}")], unit="watt"),
            Panel("Temperature", [(f"sparkfleet_gpu_temperature_celsius{{{HOST}}}", "{{host}}")], unit="celsius"),
            Panel("GPU reading", [(f"min by (host) (sparkfleet_gpu_reading_ok{{{HOST}}})", "{{host}}")], kind="stat",
                  description="0: nvidia-smi did not answer, or its fields could not be read"),
        ]),
        ("Memory", [
            Panel("Memory available", [(f"node_memory_MemAvailable_bytes{{{memory}}}", "{{host}}"),
                                       (f"predict_linear(node_memory_MemAvailable_bytes{{{memory}}}[30m], 3600)",
                                        "{{host}} in 1 h (trend)")], width=12, unit="bytes",
                  description="memory that keeps falling over tens of minutes means leaked requests or connections"),
            Panel("Memory available / total",
                  [(f"node_memory_MemAvailable_bytes{{{memory}}} / node_memory_MemTotal_bytes{{{memory}}}",
                    "{{host}}")], width=12, unit="percentunit"),
        ]),
        ("Front door and users", [
            Panel("Sessions per backend", [(f"haproxy_server_current_sessions{{{_DOORS}}}", "{{server}}")]),
            Panel("Requests per user", [(f"sum by (user) (rate(sparkfleet_user_requests_total[{RATE}]))", "{{user}}")],
                  unit="reqps"),
            Panel("Tokens per user",
                  [(f"sum by (user) (rate(sparkfleet_user_prompt_tokens_total[{RATE}]))", "{{user}} prompt"),
                   (f"sum by (user) (rate(sparkfleet_user_completion_tokens_total[{RATE}]))", "{{user}} completion")],
                  unit="short"),
            Panel("Refused with 429 per user",
                  [(f"sum by (user) (rate(sparkfleet_user_limited_total[{RATE}]))", "{{user}}")], unit="reqps"),
            Panel("Errors per user", [(f"sum by (user) (rate(sparkfleet_user_errors_total[{RATE}]))", "{{user}}")],
                  unit="reqps"),
            Panel("In flight per user", [("sum by (user) (sparkfleet_user_in_flight)", "{{user}}")]),
            Panel("Usage per user, last 24 hours",
                  [("sum by (user) (increase(sparkfleet_user_requests_total[1d]))", "requests"),
                   ("sum by (user) (increase(sparkfleet_user_completion_tokens_total[1d]))", "completion tokens"),
                   ("sum by (user) (increase(sparkfleet_user_bytes_out_total[1d]))", "bytes out"),
                   ("sum by (user) (increase(sparkfleet_user_bytes_in_total[1d]))", "bytes in")],
                  kind="table", width=24, table=True),
        ]),
    ]


def layout(rows: list[tuple[str, list[Panel]]]) -> list[dict]:
    """Every row and panel with its id and place: a row's panels left to right, HEIGHT high, wrapping at WIDTH."""
    panels: list[dict] = []
    y = 0
    for title, row in rows:
        panels.append({"type": "row", "title": title, "collapsed": False,
                       "gridPos": {"h": 1, "w": WIDTH, "x": 0, "y": y}, "panels": [], "id": len(panels) + 1})
        y, x = y + 1, 0
        for panel in row:
            if x + panel.width > WIDTH:
                y, x = y + HEIGHT, 0
            panels.append(panel.to_dict(len(panels) + 1, x, y))
            x += panel.width
        y += HEIGHT if row else 0
    return panels


def dashboard() -> dict:
    """The dashboard as Grafana imports it (one datasource input, DS_PROMETHEUS)."""
    selector = f'up{{job=~"{m.JOB_ENGINE}|{m.JOB_NODE}"}}'
    return {
        "__inputs": [{"name": "DS_PROMETHEUS", "label": "Prometheus",
                      "description": "the office's Prometheus (sparkfleet's monitoring host)", "type": "datasource",
                      "pluginId": "prometheus", "pluginName": "Prometheus"}],
        "__requires": [{"type": "grafana", "id": "grafana", "name": "Grafana", "version": "9.0.0"},
                       {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"}],
        "title": "sparkfleet", "uid": "sparkfleet",
        "description": "A sparkfleet office: engines, GB10 health, memory, the front door and per-user usage (scrape "
                       "jobs and labels: sparkfleet/contract/monitoring.py)",
        "tags": ["sparkfleet", *engines.ENGINES, "dgx-spark"], "timezone": "browser", "editable": True,
        "schemaVersion": 39, "version": 1, "refresh": "30s", "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": [{
            "name": "host", "label": "Host", "type": "query", "datasource": DATASOURCE,
            "query": {"query": f"label_values({selector}, host)", "refId": "hosts"},
            "definition": f"label_values({selector}, host)", "includeAll": True, "multi": True, "allValue": ".+",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "refresh": 2, "sort": 1}]},
        "annotations": {"list": [{"name": "Alerts firing", "datasource": DATASOURCE, "enable": True,
                                  "iconColor": "red", "expr": 'ALERTS{alertstate="firing"}',
                                  "titleFormat": "{{alertname}}", "textFormat": "{{host}}"}]},
        "panels": layout(sections()),
    }


def dashboard_json() -> str:
    """The dashboard's text, as `sparkfleet dashboard` prints it."""
    return json.dumps(dashboard(), indent=2) + "\n"
