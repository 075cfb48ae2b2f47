"""files/grafana/sparkfleet.json: a Grafana dashboard that parses, asks its datasource through one input, and names
only metrics that exist: the contract's, vLLM's as the stand-in engine exports them, the node exporter's and
HAProxy's promex (as the real binaries here print them); every query is PromQL the real Prometheus accepts."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
import requests

from sparkfleet.contract import engines
from sparkfleet.contract import monitoring as m
from tests.conftest import free_port
from tests.unit.helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "files" / "grafana" / "sparkfleet.json"
STANDIN = ROOT / "sim" / "engine" / "standin_vllm.py"
KEYWORDS = {"and", "or", "unless", "on", "ignoring", "bool", "offset", "group_left", "group_right", "inf", "nan"}


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def expressions() -> list[str]:
    """Every PromQL expression of the dashboard (a variable's label_values(SELECTOR, LABEL) as its selector)."""
    d = dashboard()
    found = [t["expr"] for p in d["panels"] for t in p.get("targets", ())]
    found += [re.fullmatch(r"label_values\((.*), *\w+\)", v["query"]["query"]).group(1)
              for v in d["templating"]["list"]]
    found += [a["expr"] for a in d["annotations"]["list"]]
    return found


def metric_names(expr: str) -> set[str]:
    """The series names an expression selects: identifiers that are not functions, keywords, labels or numbers."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        after = text[match.end():].lstrip()
        if after.startswith("(") or match.group(0) in KEYWORDS:
            continue
        names.add(match.group(0))
    return names


def standin_vllm_names() -> set[str]:
    """vLLM's metrics as the stand-in engine exports them (its metrics_text), histograms with their series."""
    source = STANDIN.read_text()
    plain = set(re.findall(r'metric\("(vllm:[a-z_:]+)"', source)) | set(re.findall(r"# TYPE (vllm:[a-z_:]+)", source))
    hists = set(re.findall(r'hist\("(vllm:[a-z_:]+)"', source))
    return plain | {f"{h}_{s}" for h in hists for s in ("bucket", "sum", "count")}


def all_names() -> set[str]:
    return set().union(*map(metric_names, expressions()))


def test_it_parses_with_one_datasource_input_and_distinct_panels():
    d = dashboard()
    assert d["uid"] == "sparkfleet" and d["title"] == "sparkfleet"
    assert [i["name"] for i in d["__inputs"]] == ["DS_PROMETHEUS"]
    panels = d["panels"]
    assert len({p["id"] for p in panels}) == len(panels) > 20
    assert len({p["title"] for p in panels}) == len(panels)
    for p in panels:
        assert {"h", "w", "x", "y"} <= set(p["gridPos"]) and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"} and p["targets"]


def test_the_name_finder_sees_metrics_not_functions_labels_or_keywords():
    assert metric_names('sum by (host) (rate(vllm:x_total{host=~"a|b"}[5m])) / on (host) y > 0 and z') == \
        {"vllm:x_total", "y", "z"}


def test_it_names_only_metrics_the_fleet_exports():
    others = {name for e in engines.ENGINES if e != "vllm" for name in vars(engines.metrics(e)).values() if name}
    known = {*m.GPU_METRICS, *m.WATCHDOG_METRICS, *m.USAGE_METRICS, "up", "ALERTS"} | standin_vllm_names() | others
    ours = {n for n in all_names() if not n.startswith(("node_", "haproxy_"))}
    assert ours and ours - known == set()
    assert {"vllm:kv_cache_usage_perc", "sparkfleet_gpu_sm_clock_mhz", "sparkfleet_user_requests_total"} <= ours
    jobs = {j for e in expressions() for alt in re.findall(r'job=~?"([^"]+)"', e) for j in alt.split("|")}
    assert jobs and jobs <= {m.JOB_ENGINE, m.JOB_NODE, m.JOB_FRONT_DOOR, m.JOB_FRONT_DOOR_TLS, m.JOB_USAGE}


def _scrape_names(command: list[str], url: str) -> set[str]:
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: requests.get(url, timeout=2).status_code == 200)
        text = requests.get(url, timeout=5).text
    finally:
        proc.terminate()
        proc.wait()
    return {line.split("{")[0].split()[0] for line in text.splitlines() if line and not line.startswith("#")}


@pytest.mark.node_exporter
def test_the_node_exporters_names_exist():
    port = free_port()
    exported = _scrape_names(["prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{port}"],
                             f"http://127.0.0.1:{port}/metrics")
    wanted = {n for n in all_names() if n.startswith("node_")}
    assert wanted and wanted - exported == set()


@pytest.mark.haproxy
def test_promex_names_exist(tmp_path):
    port = free_port()
    (tmp_path / "h.cfg").write_text(
        "defaults\n    mode http\n    timeout connect 1s\n    timeout client 5s\n    timeout server 5s\n"
        f"frontend f\n    bind 127.0.0.1:{port}\n    http-request use-service prometheus-exporter\n"
        f"backend {m.FRONT_DOOR_PROXY}\n    server spark-1 127.0.0.1:1\n")
    exported = _scrape_names(["haproxy", "-f", str(tmp_path / "h.cfg")], f"http://127.0.0.1:{port}/metrics")
    wanted = {n for n in all_names() if n.startswith("haproxy_")}
    assert m.SERVER_STATUS_METRIC in wanted and wanted - exported == set()


@pytest.mark.prometheus
def test_every_query_is_promql_prometheus_accepts(tmp_path):
    (tmp_path / "p.yml").write_text("global: {}\n")
    port = free_port()
    proc = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'p.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/api/v1/query"
    try:
        wait_for(lambda: requests.get(f"http://127.0.0.1:{port}/-/ready", timeout=2).status_code == 200, 30)
        refused = {}
        for expr in expressions():
            answer = requests.get(url, params={"query": expr.replace("$host", ".+"), "time": time.time()}, timeout=5)
            if answer.status_code != 200:
                refused[expr] = answer.json().get("error")
        assert refused == {}
    finally:
        proc.terminate()
        proc.wait()
