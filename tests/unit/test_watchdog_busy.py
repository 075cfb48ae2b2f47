"""A busy engine is judged by its work (issue 54): the watchdog's chat probe, timing out behind colleagues' long
prompts, is no failure while the engine's /metrics shows requests in flight and one of its moving series changed
since the previous tick; a frozen engine (no /metrics answer), a wedged one (busy, nothing moved) and an idle one
that does not answer still fail. The series are the guard's (contract/serving.py work_series), through the
serving file."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sparkfleet.contract import engines, serving
from sparkfleet.contract.settings import parse_settings
from sparkfleet.roles import guard
from tests.unit.helpers import host_data
from sparkfleet.host.serving import probe_verdict
from tests.unit.test_watchdog import ANSWERED, CFG, UP, quick, ticks, wd

BUSY, WAITING = CFG["work"]["busy"]
MOVES = CFG["work"]["moves"]


def metrics(running: int, waiting: int, moved: float) -> str:
    """An engine's /metrics: its in-flight gauges and every moving series at `moved`, with labels and comments."""
    lines = ["# HELP some help", "# TYPE some gauge", f'{BUSY}{{model_name="m"}} {running}',
             f'{WAITING}{{model_name="m"}} {waiting}', 'unrelated_total{model_name="m"} 7']
    return "\n".join(lines + [f'{name}{{model_name="m",engine="0"}} {moved}' for name in MOVES]) + "\n"


class _Engine(BaseHTTPRequestHandler):
    chat_s = 0.0  # how long the chat answer takes (past the probe's timeout: its turn behind long prompts)
    metrics: str | None = metrics(0, 0, 0)  # None: /metrics never answers (a frozen engine)
    first_reads: list[str] = []  # answered (one each) before `metrics`: a change at a given read, not a given time

    def _send(self, body: bytes):
        try:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:  # the probe gave up waiting
            pass

    def do_GET(self):
        if self.path == "/metrics":
            if _Engine.first_reads:
                return self._send(_Engine.first_reads.pop(0).encode())
            if _Engine.metrics is None:
                time.sleep(2)
                return
            return self._send(_Engine.metrics.encode())
        self._send(b'{"status": "ok"}')

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        time.sleep(_Engine.chat_s)
        self._send(json.dumps({"choices": [{"message": {"content": "p"}}], "usage": {"completion_tokens": 1}}).encode())

    def log_message(self, *args):
        pass


@pytest.fixture()
def engine(monkeypatch, tmp_path):
    """A fake engine on loopback, the watchdog's config for it (timeouts of 0.3 s), its state file, and the restarts
    the watchdog asked for."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    restarted: list[str] = []
    monkeypatch.setattr(wd, "engine_holds_port", lambda *args: (True, ""))
    monkeypatch.setattr(wd, "gpu_check", lambda container: (True, "GPU 0: fake"))
    monkeypatch.setattr(wd, "unit_info", lambda unit: UP)
    monkeypatch.setattr(wd, "restart", lambda cfg: restarted.append(cfg["unit"]) or subprocess.CompletedProcess([], 0))
    cfg = {**quick(CFG, 0.3), "port": server.server_address[1], "env_file": "/nonexistent"}
    state = tmp_path / "watchdog.json"
    state.write_text(json.dumps(ANSWERED))
    yield cfg, state, restarted
    _Engine.chat_s, _Engine.metrics, _Engine.first_reads = 0.0, metrics(0, 0, 0), []
    server.shutdown()


def tick(cfg, state) -> dict:
    wd.tick(cfg, state)
    return json.loads(state.read_text())


def test_a_busy_engine_whose_work_moves_is_busy_never_a_failure(engine, capsys):
    cfg, state, restarted = engine
    _Engine.metrics = metrics(0, 0, 10)
    after = tick(cfg, state)  # an idle engine answers: its values kept for the next tick
    assert after["last_action"] == "ok" and after["work"]["moves"] == {name: 10.0 for name in MOVES}
    _Engine.chat_s = 1.0  # the probe now waits behind long prompts, past its timeout
    for n in range(2 * cfg["failures"]):
        _Engine.metrics = metrics(2, 4, 11 + n)
        after = tick(cfg, state)
        assert (after["last_action"], after["last_result"], after["consecutive_failures"]) == ("busy", "busy", 0)
    assert restarted == [] and "restarts_total" not in after
    assert after["detail"].startswith("busy: 6 in flight, its work moved since the last tick")
    assert "busy: 6 in flight" in capsys.readouterr().out  # the journal says why it was not counted


@pytest.mark.parametrize("running, moving", [(2, False), (0, True)], ids=["wedged", "idle"])
def test_a_wedged_engine_and_an_idle_one_that_does_not_answer_still_fail(engine, running, moving):
    cfg, state, restarted = engine
    _Engine.metrics = metrics(running, 0, 10)
    assert tick(cfg, state)["last_action"] == "ok"
    _Engine.chat_s = 1.0
    actions = []
    for n in range(cfg["failures"]):
        _Engine.metrics = metrics(running, 0, 11 + n if moving else 10)
        after = tick(cfg, state)
        actions.append(after["last_action"])
    assert actions == ["failing"] * (cfg["failures"] - 1) + ["restart"] and restarted == ["sparkfleet-vllm.service"]
    assert ("nothing moved since the last tick" in after["detail"]) is (not moving)


def test_no_metrics_answer_is_a_failure(engine):
    cfg, state, restarted = engine
    _Engine.metrics = metrics(2, 0, 10)
    assert tick(cfg, state)["last_action"] == "ok"
    _Engine.chat_s, _Engine.metrics = 1.0, None  # frozen: the chat probe and /metrics both unanswered
    actions = [tick(cfg, state)["last_action"] for _ in range(cfg["failures"])]
    assert actions == ["failing"] * (cfg["failures"] - 1) + ["restart"] and restarted == ["sparkfleet-vllm.service"]
    after = json.loads(state.read_text())
    assert "/metrics: TimeoutError" in after["detail"] and "work" not in after


def test_a_first_busy_tick_without_earlier_values_counts_and_a_moving_one_resets_the_count():
    timed_out = {"serving": False, "failed": "chat", "detail": "1-token chat completion: TimeoutError: timed out",
                 "gpu_visible": True}
    at = [{**timed_out, "work": {"busy": 3.0, "moves": {MOVES[0]: v}}} for v in (1.0, 2.0, 2.0, 2.0, 2.0)]
    actions, state = ticks([at[0], at[1], at[2], at[3], at[4]])
    assert actions == ["failing", "busy", "failing", "failing", "restart"]
    # a tick whose /metrics did not answer keeps no values: the next one has nothing to compare
    actions, state = ticks([at[0], {**timed_out, "work": None}, at[1]], state=ANSWERED)
    assert actions == ["failing", "failing", "restart"] and "work" not in ticks([timed_out])[1]


def test_the_serving_file_carries_the_guards_series_for_every_engine():
    for name in engines.ENGINES:
        s = parse_settings("spark-1", host_data(engine=name))
        written = json.loads(serving.serving_file(s, [serving.watchdog_service("embed", "embedding", "E", 8001)]))
        ready = guard.ready_check(name, "m", None)
        assert written["work"] == {"busy": list(ready["busy"]), "moves": list(ready["moves"])}
        assert len(written["work"]["busy"]) == 2 and written["work"]["moves"], name
        pooling = serving.work_series(engines.POOLING_ENGINE)
        assert written["services"][0]["work"] == {what: list(names) for what, names in pooling.items()}
        assert wd.work_names(written["work"])


def test_an_older_serving_file_has_no_busy_rule_and_a_service_never_takes_the_chat_engines(tmp_path, monkeypatch):
    svc = {k: v for k, v in serving.watchdog_service("embed", "embedding", "E", 8001).items() if k != "work"}
    config = tmp_path / "serving.json"
    config.write_text(json.dumps({**CFG, "services": [{**svc, "state_file": str(tmp_path / "embed.json")}],
                                  "state_file": str(tmp_path / "chat.json")}))
    seen = {}

    def probe(cfg, earlier=None):
        seen[cfg["unit"]] = cfg.get("work")
        return {"serving": True, "failed": None, "detail": "", "gpu_visible": True}

    monkeypatch.setattr(wd, "unit_info", lambda unit: UP)
    monkeypatch.setattr(wd, "probe", probe)
    monkeypatch.setattr(sys, "argv", ["sparkfleet-watchdog", "--config", str(config)])
    assert wd.main() == 0
    assert seen == {"sparkfleet-vllm.service": CFG["work"], svc["unit"]: None}
    older = tmp_path / "older.json"
    older.write_text(json.dumps({k: v for k, v in CFG.items() if k != "work"}))
    assert "work" not in wd.load_config(older)
    malformed = tmp_path / "malformed.json"
    malformed.write_text(json.dumps({**CFG, "work": {"busy": "vllm:num_requests_running"}}))
    with pytest.raises(wd.ServingFileError, match='a "work" is not'):
        wd.load_config(malformed)


def test_a_busy_engine_is_no_engine_not_serving_alert(tmp_path):
    """The node exporter's reading of the watchdog's state: busy is a passing probe (EngineNotServing stays quiet
    while colleagues' long prompts queue), a failed one is not."""
    import runpy

    from sparkfleet import FILES_DIR

    lines = runpy.run_path(str(FILES_DIR / "sparkfleet-textfile"))["watchdog_lines"]
    state = tmp_path / "watchdog.json"
    serving_path = tmp_path / "serving.json"
    serving_path.write_text(json.dumps({"unit": "u", "state_file": str(state)}))
    for result, ok in (("busy", 1), ("ok", 1), ("chat", 0)):
        state.write_text(json.dumps({"last_result": result}))
        assert f'sparkfleet_watchdog_probe_ok{{unit="u"}} {ok}' in lines(str(serving_path)), result



@pytest.mark.parametrize("running, after, busy, why", [
    (2, 11, True, "busy: 6 in flight, its work moved within 0.6 s"),
    (2, 10, False, "busy (6 in flight) but nothing moved in 0.6 s"),
    (2, None, False, "/metrics: TimeoutError"),
    (0, 11, False, "1-token chat completion"),
], ids=["moving", "wedged", "frozen-since", "idle"])
def test_the_converges_probe_and_check_watch_the_work_move_having_no_earlier_tick(engine, running, after, busy, why):
    """`--probe` (the converge's fact) and `--check` (after its gate) have no earlier tick to compare with: a busy
    engine's work is read again for a while, and one whose work moves is left serving, where the converge would
    have restarted it (the probe's verdict "down") in the middle of the office's long prompts."""
    cfg, _, _ = engine
    _Engine.chat_s, _Engine.metrics = 1.0, metrics(running, 4 if running else 0, 10)
    result = wd.probe(cfg)
    assert not result["serving"] and result["work"]["busy"] == (6 if running else 0)
    _Engine.metrics = metrics(running, 4 if running else 0, after) if after is not None else None
    got, detail = wd.still_busy(cfg, result, wait_s=0.6, step_s=0.2)
    assert got is busy and why in detail, detail
    assert probe_verdict({**result, "busy": True} if got else {**result, "starting": False}) == \
        ("busy" if busy else "down")


@pytest.mark.parametrize("after, code", [(11, 0), (10, 1)], ids=["moving", "wedged"])
def test_check_exits_0_for_a_busy_engine_whose_work_moves(engine, tmp_path, monkeypatch, capsys, after, code):
    cfg, _, _ = engine
    config = tmp_path / "serving.json"
    config.write_text(json.dumps(cfg))
    monkeypatch.setattr(wd, "CHECK_BUSY_S", 0.6)
    _Engine.chat_s, _Engine.first_reads, _Engine.metrics = 1.0, [metrics(2, 4, 10)], metrics(2, 4, after)
    monkeypatch.setattr(sys, "argv", ["sparkfleet-watchdog", "--config", str(config), "--check"])
    assert wd.main() == code
    assert capsys.readouterr().err.startswith("serving, busy: 6 in flight" if code == 0 else "not serving: chat failed")
