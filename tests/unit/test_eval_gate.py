"""The quality gate's host side (fleet/quality.py) against a loopback OpenAI-compatible fake: the first evaluation
of a release is its baseline, a changed answer is a regression named in one line, a model that cannot be asked is
not evaluated (never a regression nor a pass), and the record the host keeps is written by the command the gate
sends (run here under sh, its paths in a temporary directory)."""

from __future__ import annotations

import json
import subprocess
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sparkfleet.contract import monitoring, paths
from sparkfleet.contract.settings import parse_settings
from sparkfleet.fleet import quality
from sparkfleet.fleet.tls import guard_client

from .helpers import host_data

RELEASE = "abcdef123456"
SUITE = """repeats = 1

[[probe]]
id = "sum"
kind = "exact"
prompt = "What is 2 + 2? Reply with the number only."
max_tokens = 8

[[probe]]
id = "word"
kind = "format"
prompt = "Say one lower-case word."
regex = "^[a-z]+$"
max_tokens = 8
"""


class Fake:
    """The engine behind the guard: answers each chat by the prompt's first word (`answers`), or `status`."""

    def __init__(self):
        self.answers = {"What": "4", "Say": "hello"}
        self.status = 200
        self.seen: list[tuple[str, str | None, dict]] = []


@pytest.fixture
def fake():
    engine = Fake()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            engine.seen.append((self.path, self.headers.get("Authorization"), body))
            said = engine.answers.get((str(body["messages"][-1]["content"]).split() or [""])[0], "ok")
            answer = {"choices": [{"message": {"role": "assistant", "content": said}, "finish_reason": "stop"}]}
            data = json.dumps(answer if engine.status == 200 else {"error": {"message": "down"}}).encode()
            self.send_response(engine.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    engine.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield engine
    server.shutdown()
    server.server_close()


@pytest.fixture
def host_root(tmp_path, monkeypatch):
    """The host's state directory and textfile directory under tmp_path; the gate's SSH round trip runs its command
    here under sh (the command is what a host would run)."""
    state, textfile = tmp_path / "state", tmp_path / "state" / "textfile"
    textfile.mkdir(parents=True)
    monkeypatch.setattr(paths, "STATE_DIR", str(state))
    monkeypatch.setattr(paths, "QUALITY_FILE", str(state / "quality.json"))
    monkeypatch.setattr(monitoring, "TEXTFILE_DIR", str(textfile))
    monkeypatch.setattr(monitoring, "QUALITY_TEXTFILE", str(textfile / "quality.prom"))
    sent = []

    class Host:
        name = "spark-1"

    class State:
        failed_hosts: set = set()

    @contextmanager
    def connected(inventory, hosts, data=None):
        yield State(), [Host()]

    def as_the_host_runs(host, command, timeout=None):
        sent.append(command)
        return subprocess.run(["sh", "-c", command], timeout=30).returncode == 0, None

    monkeypatch.setattr("sparkfleet.fleet.converge.connected", connected)
    monkeypatch.setattr("sparkfleet.host.run.as_the_host_runs", as_the_host_runs)
    return state, sent


def gate_for(fake, tmp_path, records=None, **settings) -> quality.QualityGate:
    probes = tmp_path / "probes.toml"
    probes.write_text(SUITE)
    data = host_data(api_key="sim-key", controller_api_url=fake.url, **settings)
    s = parse_settings("spark-1", data)
    return quality.QualityGate("inventory.py", {"spark-1": (s, data)}, {"spark-1": records},
                               {"spark-1": {"release_id": RELEASE, "served_model_name": s.served_model_name,
                                            "api_port": s.api_port}}, ca=None, probes=probes)


def test_the_first_eval_is_the_baseline_and_a_changed_answer_is_named_in_one_line(fake, tmp_path, host_root):
    state, sent = host_root
    gate = gate_for(fake, tmp_path)
    [first] = quality.evaluate_hosts(gate, ["spark-1"])
    [model] = first.models
    assert (model.verdict, model.evaluation.score, first.kept) == ("baseline", 1.0, True)
    assert all(auth == "Bearer sim-key" and body["temperature"] == 0 for _, auth, body in fake.seen)
    record = json.loads((state / "quality.json").read_text())["releases"][RELEASE]
    assert record["baseline"]["models"] == record["last"]["models"]
    prom = (state / "textfile/quality.prom").read_text()
    assert 'sparkfleet_quality_below_baseline{model="Qwen3.5-35B-A3B"} 0' in prom

    fake.answers["What"] = "5"  # the engine now answers the exact probe otherwise
    baseline = gate.baseline("spark-1", RELEASE)
    now = gate.measure("spark-1", running=True, baseline=baseline)
    line = gate.judge("spark-1", baseline, now)
    assert line is not None and "\n" not in line
    assert line.startswith("spark-1: Qwen3.5-35B-A3B: probe sum passed in the baseline and fails now")
    assert '"4"' in line and '"5"' in line and line.endswith("override with --no-quality-gate")

    [second] = quality.evaluate_hosts(gate, ["spark-1"])
    [model] = second.models
    assert model.verdict == "regressed" and model.baseline_score == 1.0 and model.evaluation.score == 0.5
    assert any("probe sum" in line for line in model.lines)
    record = json.loads((state / "quality.json").read_text())["releases"][RELEASE]
    assert record["baseline"]["models"]["Qwen3.5-35B-A3B"]["score"] == 1.0  # the baseline is never replaced
    assert record["last"]["below"] == {"Qwen3.5-35B-A3B": ["sum", "score"]}
    assert 'below_baseline{model="Qwen3.5-35B-A3B"} 1' in (state / "textfile/quality.prom").read_text()
    assert len(sent) == 2


def test_a_model_that_cannot_be_asked_is_not_evaluated_and_never_a_regression(fake, tmp_path, host_root):
    state, sent = host_root
    gate = gate_for(fake, tmp_path)
    quality.evaluate_hosts(gate, ["spark-1"])
    fake.status = 503
    baseline = gate.baseline("spark-1", RELEASE)
    now = gate.measure("spark-1", running=True, baseline=baseline)
    [evaluation] = now.values()
    assert not evaluation.evaluated and evaluation.score is None
    assert gate.judge("spark-1", baseline, now) is None
    [host] = quality.evaluate_hosts(gate, ["spark-1"])
    assert [m.verdict for m in host.models] == ["not evaluated"]
    record = json.loads((state / "quality.json").read_text())["releases"][RELEASE]
    assert record["baseline"]["models"]["Qwen3.5-35B-A3B"]["evaluated"] is True  # kept from the first


def test_a_release_with_no_answer_records_no_baseline(fake, tmp_path, host_root):
    """The first evaluation of a release that *serves* is its baseline: one where nothing answered keeps none."""
    state, sent = host_root
    fake.status = 500
    gate = gate_for(fake, tmp_path)
    [host] = quality.evaluate_hosts(gate, ["spark-1"])
    assert host.kept is None and sent == [] and gate.baseline("spark-1", RELEASE) is None


def test_an_unreachable_guard_is_not_evaluated(tmp_path, host_root):
    """Nothing listens at the URL: each probe is not evaluated, with why in words (no library text)."""
    class Closed:
        url = "http://127.0.0.1:9"

    gate = gate_for(Closed, tmp_path)
    [evaluation] = gate.measure("spark-1", running=True).values()
    assert not evaluation.evaluated
    assert all(r.verdict == "not_evaluated" and "connection refused" in r.why for r in evaluation.results)


def test_a_loopback_api_is_asked_through_an_ssh_forward_to_the_guard(fake, monkeypatch):
    """An API on loopback only: the guard's port on the host through fleet/speed.py's forward, the same client."""
    forwarded = []

    @contextmanager
    def forward(name, data, port):
        forwarded.append((name, port))
        yield fake.url

    monkeypatch.setattr("sparkfleet.fleet.speed.forwarded", forward)
    s = parse_settings("spark-1", host_data(api_host="127.0.0.1"))
    with guard_client(None) as client, quality.guard_url(client, "spark-1", s, host_data(), s.api_port) as url:
        assert url == fake.url
    assert forwarded == [("spark-1", s.api_port)]


def test_a_service_is_asked_at_its_own_port_of_the_guard(monkeypatch):
    """The API reached on the LAN: a service's port at the host's address; behind a controller_api_url (a published
    port, a tunnel) the service's port is forwarded over SSH instead."""
    s = parse_settings("spark-1", host_data(api_host="0.0.0.0"))
    with guard_client(None) as client, quality.guard_url(client, "spark-1", s, {"ssh_hostname": "10.0.0.7"},
                                                         8001) as url:
        assert url == "http://10.0.0.7:8001"
    forwarded = []

    @contextmanager
    def forward(name, data, port):
        forwarded.append(port)
        yield "http://127.0.0.1:40001"

    monkeypatch.setattr("sparkfleet.fleet.speed.forwarded", forward)
    s = parse_settings("spark-1", host_data(api_host="0.0.0.0", controller_api_url="http://127.0.0.1:18000"))
    with guard_client(None) as client, quality.guard_url(client, "spark-1", s, {}, 8001) as url:
        assert url == "http://127.0.0.1:40001" and forwarded == [8001]


def test_what_a_host_serves_comes_from_its_release_record_when_running():
    """Read back from the host (untrusted): the record's served names and ports; an entry of the wrong shape is
    left out; an on-demand service is listed as such (an evaluation does not start it)."""
    s = parse_settings("spark-1", host_data())
    record = {"served_model_name": "chat-now", "api_port": 8000, "services": {
        "embed": {"kind": "embedding", "served_model_name": "bge", "api_port": 8001},
        "rerank": {"kind": "reranker", "served_model_name": "rr", "api_port": 8002, "on_demand": {"socket": "x"}},
        "bad": {"kind": "embedding", "served_model_name": "x", "api_port": "8003"},
        "odd": {"kind": "vision", "served_model_name": "y", "api_port": 8004}}}
    found = quality.served_models("spark-1", s, record)
    assert [(m.model, m.serves, m.port, m.on_demand) for m in found] == [
        ("chat-now", "chat", 8000, False), ("bge", "embedding", 8001, False), ("rr", "rerank", 8002, True)]
    assert found[0].context_tokens == s.max_model_len
    assert [m.model for m in quality.served_models("spark-1", s)] == [s.served_model_name]
    assert quality.served_models("spark-1", s, {}) == quality.served_models("spark-1", s)  # no record read


def test_an_idle_on_demand_model_is_not_started_by_an_eval(fake, tmp_path):
    """An on-demand service is not asked (its first request would start it): each of its probes not evaluated."""
    from sparkfleet.quality.suite import load_suite

    s = parse_settings("spark-1", host_data(controller_api_url=fake.url))
    record = {"services": {"rerank": {"kind": "reranker", "served_model_name": "rr", "api_port": 8002,
                                      "on_demand": {"socket": "x"}}}}
    with guard_client(None) as client:
        found = quality.measure_host("spark-1", s, host_data(), load_suite(None), client, record)
    assert not found["rr"].evaluated and found["rr"].results
    assert all(r.verdict == "not_evaluated" and "on demand" in r.why for r in found["rr"].results)
    assert not any(body["model"] == "rr" for _, _, body in fake.seen)


def test_due_follows_the_interval(fake, tmp_path, host_root):
    """--due: off at 0; else a host evaluated less than the interval ago is skipped, an older or unknown one is due."""
    gate = gate_for(fake, tmp_path)
    assert "off" in quality.due(gate, "spark-1", RELEASE)
    gate = gate_for(fake, tmp_path, quality_eval_interval_s=3600)
    assert quality.due(gate, "spark-1", RELEASE) is None
    [host] = quality.evaluate_hosts(gate, ["spark-1"], only_due=True)
    assert host.kept is True
    [again] = quality.evaluate_hosts(gate, ["spark-1"], only_due=True)
    assert again.skipped and "min ago" in again.skipped and again.models == []
    import time

    assert quality.due(gate, "spark-1", RELEASE, at=time.time() + 3601) is None


# --- the command: `sparkfleet eval INVENTORY` -------------------------------------------------------------------


def eval_inventory(tmp_path, fake, monkeypatch) -> str:
    """One Spark whose API the controller reaches at the fake; its records 'read over SSH': a release, and the
    quality record the gate wrote under host_root (none at first)."""
    path = tmp_path / "office.py"
    path.write_text(f"sparks = [('spark-1', {{'ssh_hostname': '10.0.0.1', 'api_host': '0.0.0.0', "
                    f"'api_key': 'k' * 16, 'controller_api_url': {fake.url!r}}})]\n")
    def kept():
        record = Path(paths.QUALITY_FILE)
        return json.loads(record.read_text()) if record.exists() else None

    monkeypatch.setattr(quality, "read_records", lambda inv, hosts: (
        {h: {"release_id": RELEASE} for h in hosts}, {h: kept() for h in hosts}))
    return str(path)


def test_eval_exits_0_on_its_baseline_then_1_on_a_regression_naming_the_probe(fake, tmp_path, host_root, monkeypatch,
                                                                              capsys):
    from sparkfleet import cli

    inventory = eval_inventory(tmp_path, fake, monkeypatch)
    (tmp_path / "probes.toml").write_text(SUITE)
    assert cli.main(["eval", inventory, "--probes", str(tmp_path / "probes.toml"), "--json"]) == 0
    [host] = json.loads(capsys.readouterr().out)["hosts"]
    [model] = host["models"]
    assert (host["record_written"], model["verdict"], model["score"]) == (True, "baseline", 1.0)
    assert [(r["id"], r["verdict"]) for r in model["results"]] == [("sum", "pass"), ("word", "pass")]

    fake.answers["What"] = "5"
    assert cli.main(["eval", inventory, "--probes", str(tmp_path / "probes.toml")]) == 1
    printed = capsys.readouterr()
    assert "regressed" in printed.out and "sum" in printed.out
    assert "spark-1: Qwen3.5-35B-A3B: probe sum passed in the baseline and fails now" in printed.err

    fake.status = 502  # down: not evaluated, exit 1, never a regression
    assert cli.main(["eval", inventory, "--probes", str(tmp_path / "probes.toml"), "--json"]) == 1
    [model] = json.loads(capsys.readouterr().out)["hosts"][0]["models"]
    assert model["verdict"] == "not evaluated" and model["regressions"] == []


def test_eval_refuses_a_probe_file_that_does_not_parse_before_asking_anything(fake, tmp_path, host_root, monkeypatch,
                                                                             capsys):
    from sparkfleet import cli

    inventory = eval_inventory(tmp_path, fake, monkeypatch)
    (tmp_path / "bad.toml").write_text("[[probe]\nid = 'x'\n")
    assert cli.main(["eval", inventory, "--probes", str(tmp_path / "bad.toml")]) == 2
    err = capsys.readouterr().err
    assert "does not parse as TOML" in err and "Traceback" not in err and fake.seen == []


def test_what_a_host_serves_as_its_settings_plan_it():
    """The chat model, then each service by name with the suite's kind, its port and its context (its own
    max_model_len, else its model's)."""
    s = parse_settings("spark-1", host_data(services={
        "vectors": {"recipe": "qwen3-embedding-0.6b", "api_port": 9100, "max_model_len": 4096},
        "rerank": {"recipe": "qwen3-reranker-0.6b", "on_demand": True}}))
    chat, rerank, vectors = quality.served_models("spark-1", s)
    assert (chat.serves, chat.port, chat.service) == ("chat", s.api_port, None)
    assert (vectors.serves, vectors.port, vectors.context_tokens, vectors.on_demand) == ("embedding", 9100, 4096, False)
    assert (rerank.serves, rerank.service, rerank.on_demand) == ("rerank", "rerank", True)
    assert rerank.context_tokens > 512  # the recipe's model tells its context
