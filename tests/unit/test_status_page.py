"""The office status page (templates/consoles/sparkfleet.html) rendered by the real Prometheus from a sample fleet
on loopback: a row per host, the drained one says so, the GPU and usage columns filled, no template error."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest
import requests

from sparkfleet.contract import engines
from sparkfleet.contract import monitoring as m
from tests.unit import status_page_fleet as fleet


class _Rows(HTMLParser):
    """The text of each <tr> with a data-host or data-user attribute, by that value."""

    def __init__(self):
        super().__init__()
        self.rows: dict[str, str] = {}
        self._key: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "tr" and ("data-host" in a or "data-user" in a):
            self._key = a.get("data-host") or a.get("data-user")
            self.rows[self._key] = ""

    def handle_endtag(self, tag):
        if tag == "tr":
            self._key = None

    def handle_data(self, data):
        if self._key:
            self.rows[self._key] += " " + data.strip()


@pytest.fixture(scope="module")
def page(sample_prometheus):
    return requests.get(sample_prometheus + m.STATUS_PAGE, timeout=10)


def rows(html: str) -> dict[str, str]:
    parser = _Rows()
    parser.feed(html)
    return {k: re.sub(r"\s+", " ", v).strip() for k, v in parser.rows.items()}


def test_the_page_renders_without_a_template_error(page):
    assert page.status_code == 200, page.text[:2000]
    assert "error executing" not in page.text.lower() and "template:" not in page.text
    assert "<script" not in page.text and "http://" not in page.text and "https://" not in page.text


def test_each_host_has_its_row_and_the_drained_one_says_so(page):
    found = rows(page.text)
    assert set(fleet.HOSTS) <= set(found)
    serving, drained = found["spark-1"], found[fleet.DRAINED]
    assert "serving" in serving and "in rotation" in serving and "drained" not in serving
    assert "drained" in drained and "in rotation" not in drained
    assert fleet.MODEL in serving and "42%" in serving and "tokens/s" in serving
    assert "2418 / 2418 MHz" in serving and "96 W" in serving and "67 °C" in serving
    assert "none (gpu_idle)" in serving  # an idle GPU's lower clock is no throttle
    assert "850 / 2418 MHz" in drained and "sw_power_cap" in drained and "none" not in drained
    assert "SGLang" in serving and "vLLM" in drained  # spark-1's series are SGLang's


def test_a_llamacpp_host_shows_its_load_without_a_kv_gauge(page):
    llama = rows(page.text)[fleet.LLAMA]
    assert "llama.cpp" in llama and "3 running" in llama and "2 waiting" in llama and "tokens/s" in llama
    assert "%" not in llama.split("running")[1].split("tokens/s")[0]  # no KV cache figure: it exports none


def test_a_failed_host_says_what_failed(page):
    """spark-3's engine answers its scrape but not the watchdog's chat probe (a wedged engine)."""
    failed = rows(page.text)[fleet.FAILED]
    assert failed.split()[:3] == [fleet.FAILED, "not", "serving"] and "failing checks" in failed
    assert "no GPU reading" in failed and "gave up on vllm" in failed and "MHz" not in failed
    assert "97%" in failed


def test_the_usage_table_names_each_user(page):
    found = rows(page.text)
    for user in fleet.USERS:
        assert user in found
    assert re.search(r"bob \d+ 0 \d+ \d+ [1-9]\d* 0", found["bob"]), found["bob"]


@pytest.mark.prometheus
def test_an_empty_prometheus_renders_the_page_too(tmp_path):
    """Before the first scrape (or with every target gone) the page says so instead of failing."""
    with fleet.prometheus(tmp_path, scrape=False) as url:
        response = requests.get(url + m.STATUS_PAGE, timeout=10)
    assert response.status_code == 200, response.text[:2000]
    assert "Prometheus scrapes no host yet." in response.text and "No usage recorded" in response.text
    assert rows(response.text) == {}


def test_a_hostile_label_value_is_shown_as_text(page):
    """Label values come from the hosts' exporters: html/template escapes them (no markup from a host)."""
    assert fleet.HOSTILE not in page.text
    assert "&lt;b onmouseover=alert(1)&gt;x&lt;/b&gt;" in page.text
    assert fleet.HOSTILE in rows(page.text)[fleet.DRAINED]


def page_text() -> str:
    """The page as the monitoring host gets it: the template with its engine fields filled in."""
    from sparkfleet.roles import status_page

    return status_page.render((fleet.CONSOLES / m.STATUS_PAGE_FILE).read_text())


def test_the_page_asks_only_for_names_the_fleet_exports():
    """Every metric the page queries is the contract's, an engine's (its descriptor's) or promex's; every job is a
    contract job."""
    text = page_text()
    names = set(re.findall(r"\b((?:sparkfleet_|vllm:|sglang:|llamacpp:|haproxy_)[a-z_:]+)", text))
    known = {*m.GPU_METRICS, *m.WATCHDOG_METRICS, *m.USAGE_METRICS, m.SERVER_STATUS_METRIC,
             *(name for e in engines.ENGINES for name in (engines.metrics(e).running, engines.metrics(e).waiting,
                                                          engines.metrics(e).kv_usage,
                                                          engines.metrics(e).generation_tokens) if name)}
    assert names and names <= known, names - known
    jobs = set(re.findall(r'job=~?"([^"]+)"', text))
    assert {j for alt in jobs for j in alt.split("|")} <= {m.JOB_ENGINE, m.JOB_NODE, m.JOB_FRONT_DOOR,
                                                           m.JOB_FRONT_DOOR_TLS, m.JOB_USAGE}
    assert f'job=~"{m.JOB_FRONT_DOOR}|{m.JOB_FRONT_DOOR_TLS}"' in text  # a door's scrape job, http or https
    benign = "|".join(m.BENIGN_THROTTLE_REASONS)
    assert text.count(f'reason!~"{benign}"') == 1 and text.count(f'reason=~"{benign}"') == 1
    assert f'proxy="{m.FRONT_DOOR_PROXY}"' in text and all(f'"{s}"' in text for s in m.DRAINED_STATES)


def test_the_monitoring_host_gets_the_page_and_the_flags_that_load_it():
    from sparkfleet.roles import status_page

    files = status_page.console_files()
    assert files == {f"{m.PROMETHEUS_CONSOLES}/{m.STATUS_PAGE_FILE}": page_text()}
    assert "[[" not in page_text()  # every engine field filled in
    assert m.STATUS_PAGE == f"/consoles/{m.STATUS_PAGE_FILE}"  # Prometheus serves its console dir at /consoles/
    assert status_page.prometheus_flags() == [f"--web.console.templates={m.PROMETHEUS_CONSOLES}",
                                              f"--web.console.libraries={m.PROMETHEUS_CONSOLE_LIBRARIES}"]


def engine_cells(text: str) -> str:
    """The page's Hosts table (where the engine fields stand)."""
    return text.split('<table id="hosts">', 1)[1].split("</table>", 1)[0]


def test_the_template_names_no_engine_and_the_page_every_descriptors_series_and_label():
    """The engine cells come from the descriptors: the template holds none of their series or labels, the page
    holds each engine's load, queue, KV gauge (where it has one), tokens and label, each asked per host."""
    template = (fleet.CONSOLES / m.STATUS_PAGE_FILE).read_text()
    cells = engine_cells(page_text())
    for d in engines.DESCRIPTORS.values():
        series = [d.metrics.running, d.metrics.waiting, d.metrics.kv_usage, d.metrics.generation_tokens]
        for name in filter(None, series):
            assert name not in template and f"{name}{{host=%q}}" in cells, (d.name, name)
        assert f'<span class="dim">{d.label}</span>' in cells and d.label not in template
    assert cells.count("printf `max by (model_name) (") == 1


def test_a_new_descriptor_reaches_the_page_with_its_series(monkeypatch):
    """An engine added to contract/engines.py shows on the page without a hand edit: its label and each series."""
    from dataclasses import replace

    from sparkfleet.roles import status_page

    new = replace(engines.descriptor(engines.DEFAULT_ENGINE), name="trtllm", label="TensorRT-LLM",
                  metrics=engines.EngineMetrics(running="trtllm:running", waiting="trtllm:waiting",
                                                kv_usage=None, prompt_tokens=None,
                                                generation_tokens="trtllm:generated_total"))
    monkeypatch.setitem(engines.DESCRIPTORS, "trtllm", new)
    fields = status_page.engine_fields()
    assert 'printf `trtllm:running{host=%q}` $host) }} <span class="dim">TensorRT-LLM</span>' in fields["engine_labels"]
    assert "trtllm:running{host=%q}" in fields["running"] and "trtllm:waiting{host=%q}" in fields["waiting"]
    assert "rate(trtllm:generated_total{host=%q}[1h])" in fields["decode"] and "trtllm" not in fields["kv_usage"]
    assert "trtllm" not in fields["models"]  # its series carry no model_name label
    for field in ("running", "waiting", "decode"):  # one $host for each %q
        assert fields[field].count("%q") == fields[field].count("$host") == len(engines.DESCRIPTORS)
