"""The Grafana dashboard (sparkfleet/roles/dashboard.py, `sparkfleet dashboard`): it parses, asks its datasource
through one input, builds its engine panels from the descriptors (every engine's series there, none named by hand),
and names only metrics that exist: the contract's, the engines' (their descriptors; vLLM's as the stand-in engine
exports them), the node exporter's and HAProxy's promex (as the real binaries here print them); every query is
PromQL the real Prometheus accepts."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
import requests

from sparkfleet import cli
from sparkfleet.contract import engines
from sparkfleet.contract import monitoring as m
from sparkfleet.roles import dashboard as grafana
from tests.conftest import free_port
from tests.unit.helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
STANDIN = ROOT / "sim" / "engine" / "standin_vllm.py"
KEYWORDS = {"and", "or", "unless", "on", "ignoring", "bool", "offset", "group_left", "group_right", "inf", "nan"}


def dashboard() -> dict:
    return json.loads(grafana.dashboard_json())


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


def descriptor_series(d: engines.EngineDescriptor) -> set[str]:
    """Every series name a descriptor gives: its metrics (histograms with their buckets) and its bench counters."""
    found = {value for value in vars(d.metrics).values() if isinstance(value, str)}
    found |= {f"{h}_bucket" for h in (d.metrics.ttft_seconds, d.metrics.inter_token_seconds) if h}
    found |= {d.metrics.finished[0]} if d.metrics.finished else set()
    for value in vars(d.bench).values():
        found |= set(value) if isinstance(value, tuple) else {value} if value else set()
    return found


def test_it_names_only_metrics_the_fleet_exports():
    others = {name for d in engines.DESCRIPTORS.values() if d.name != "vllm" for name in descriptor_series(d)}
    known = {*m.GPU_METRICS, *m.WATCHDOG_METRICS, *m.USAGE_METRICS, "up", "ALERTS"} | standin_vllm_names() | others
    ours = {n for n in all_names() if not n.startswith(("node_", "haproxy_"))}
    assert ours and ours - known == set()
    assert {"vllm:kv_cache_usage_perc", "sparkfleet_gpu_sm_clock_mhz", "sparkfleet_user_requests_total"} <= ours
    jobs = {j for e in expressions() for alt in re.findall(r'job=~?"([^"]+)"', e) for j in alt.split("|")}
    assert jobs and jobs <= {m.JOB_ENGINE, m.JOB_NODE, m.JOB_FRONT_DOOR, m.JOB_FRONT_DOOR_TLS, m.JOB_USAGE}


@pytest.mark.parametrize("name", engines.ENGINES)
def test_every_descriptors_series_appear(name):
    """Each engine's load, queue, KV gauge, tokens, latency histograms, finished requests and bench counters (where
    it has them) are in the panels, each on the chosen hosts."""
    d = engines.descriptor(name)
    text = json.dumps(dashboard())
    wanted = [d.metrics.running, d.metrics.waiting, d.metrics.kv_usage, d.metrics.prompt_tokens,
              d.metrics.generation_tokens, d.bench.prefix_gauge,
              *(f"{h}_bucket" for h in (d.metrics.ttft_seconds, d.metrics.inter_token_seconds) if h),
              *(d.metrics.finished[:1] if d.metrics.finished else ()),
              *(series[0] for series in (d.bench.prefix_hits, d.bench.prefix_queries, d.bench.spec_accepted,
                                         d.bench.spec_draft_tokens) if series)]
    for series in filter(None, wanted):
        assert f'{series}{{host=~\\"$host\\"}}' in text, series
    assert name in dashboard()["tags"]


def test_a_new_descriptor_reaches_the_dashboard_and_a_panel_no_engine_feeds_is_left_out(monkeypatch):
    """An engine added to contract/engines.py gets its series into the panels without a hand edit; a panel whose
    series no engine exports (here: every engine without latency histograms) is not shown empty."""
    from dataclasses import replace

    new = replace(engines.descriptor("llamacpp"), name="trtllm", label="TensorRT-LLM",
                  metrics=engines.EngineMetrics(running="trtllm:running", waiting="trtllm:waiting",
                                                kv_usage="trtllm:kv", prompt_tokens=None,
                                                generation_tokens="trtllm:generated_total"))
    monkeypatch.setitem(engines.DESCRIPTORS, "trtllm", new)
    exprs = {p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in dashboard()["panels"] if p["type"] != "row"}
    assert 'trtllm:kv{host=~"$host"}' in exprs["KV cache usage"]
    assert 'trtllm:running{host=~"$host"}' in exprs["Requests running and waiting"]
    assert 'rate(trtllm:generated_total{host=~"$host"}[5m])' in exprs["Decode rate"]
    assert "trtllm" not in exprs["Prefill rate"]  # it exports no prompt counter
    for name in [n for n in engines.DESCRIPTORS if n != "trtllm"]:
        monkeypatch.setitem(engines.DESCRIPTORS, name, replace(engines.DESCRIPTORS[name], metrics=replace(
            engines.DESCRIPTORS[name].metrics, ttft_seconds=None)))
    titles = [p["title"] for p in dashboard()["panels"]]
    assert "Time to first token, p95" not in titles and "Inter-token latency, p95" in titles


def test_the_command_prints_it(capsys, tmp_path):
    assert cli.main(["dashboard"]) == 0
    assert json.loads(capsys.readouterr().out) == grafana.dashboard()
    assert cli.main(["dashboard", "--output", str(tmp_path / "d.json"), "--json"]) == 0
    assert json.loads((tmp_path / "d.json").read_text()) == grafana.dashboard()
    assert json.loads(capsys.readouterr().out) == {"written": str(tmp_path / "d.json")}


def test_the_layout_wraps_each_row_and_keeps_rows_apart():
    """Panels sit left to right and wrap at Grafana's 24 columns; no two panels overlap."""
    panels = dashboard()["panels"]
    cells = set()
    for p in panels:
        g = p["gridPos"]
        here = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not here & cells, p["title"]
        cells |= here


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
