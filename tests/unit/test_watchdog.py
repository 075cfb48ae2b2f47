"""The watchdog (files/sparkfleet-watchdog): its rules as a pure function, its probe against the stand-in
engine, and the converge's serving operation against fake probes."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from pyinfra.api.operation import OperationMeta
from pyinfra.connectors.util import CommandOutput
from pyinfra_testing.operations import make_operation_tests

from sparkfleet.host.operations import health_gate_results, record_health_gate
from sparkfleet.host.state import parse_state
from sparkfleet.host.serving import (
    describe,
    probe_verdict,
    watchdog_cell,
    watchdog_summary,
)
from sparkfleet.contract.serving import serving_file, watchdog_config, watchdog_service
from sparkfleet.contract.settings import SettingsError, parse_settings
from tests.unit.helpers import KEY, Server, host_data, make_model
from tests.unit.test_hostile_values import gated_hub  # noqa: F401  (a fixture: the hub a token opens)

ROOT = Path(__file__).resolve().parents[2]
CASES = Path(__file__).parent / "operations"


def load_watchdog():
    """The script by path; its sibling package sparkfleet_host is registered first, as the hosts' bin dir has it."""
    import sparkfleet.contract.shared  # noqa: F401  (registers sparkfleet_host in sys.modules)

    loader = importlib.machinery.SourceFileLoader("sparkfleet_watchdog", str(ROOT / "files" / "sparkfleet-watchdog"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


wd = load_watchdog()
# the serving file a converge writes from the defaults: interval 30, 3 failures, 3 restarts in 1800 s, start 1800 s
CFG = {**json.loads(serving_file(parse_settings("spark-1", host_data()))), "served_name": "m"}


def quick(cfg: dict, timeout_s: float) -> dict:
    """`cfg` with every probe's timeouts at `timeout_s`: a stand-in answers at once, or never."""
    return {**cfg, "probes": {name: {**probe, "timeout_s": timeout_s, "gate_timeout_s": timeout_s}
                              for name, probe in cfg["probes"].items()}}
STARTED = 5_000_000_000  # the unit's ActiveEnterTimestampMonotonic (µs)
UP = {"active": "active", "sub": "running", "started": STARTED, "up_s": 4000.0, "systemd_restarts": 0}
OK = {"serving": True, "failed": None, "detail": "", "gpu_visible": True}
HUNG = {"serving": False, "failed": "health", "detail": "/health: TimeoutError: timed out", "gpu_visible": None}
ANSWERED = {"answered_start": STARTED}

TestServing = make_operation_tests("sparkfleet.host", "serving.serving", CASES / "serving")
TestStartLimitCleared = make_operation_tests("sparkfleet.host", "serving.start_limit_cleared",
                                             CASES / "start_limit_cleared")


def ticks(results, state=None, unit=UP, start=1_000_000.0, step=30.0):
    """Run decide() over probe results, a tick every `step` seconds; the actions and the last state."""
    state, actions = dict(state or ANSWERED), []
    for n, result in enumerate(results):
        action, state = wd.decide(CFG, state, unit, result, start + n * step)
        actions.append(action)
    return actions, state


def test_healthy_host_never_restarts():
    actions, state = ticks([OK] * 20)
    assert actions == ["ok"] * 20
    assert state["consecutive_failures"] == 0 and state["restarts"] == [] and state["gave_up"] is False


def test_three_failures_in_a_row_restart_once():
    actions, state = ticks([HUNG, HUNG, HUNG])
    assert actions == ["failing", "failing", "restart"]
    assert state["restarts"] == [1_000_060.0] and state["restarts_total"] == 1 and state["consecutive_failures"] == 0


def test_an_answer_between_failures_resets_the_count():
    actions, _ = ticks([HUNG, HUNG, OK, HUNG, HUNG])
    assert actions == ["failing", "failing", "ok", "failing", "failing"]


def test_a_start_is_not_counted_until_it_answered_or_timed_out():
    fresh = {**UP, "started": STARTED + 1, "up_s": 100.0}  # a new start: not answered since
    actions, state = ticks([HUNG] * 5, unit=fresh)
    assert actions == ["starting"] * 5 and state.get("consecutive_failures", 0) == 0
    slow = {**fresh, "up_s": 1800.0}  # start_timeout_s passed without an answer: now it counts
    assert ticks([HUNG] * 3, unit=slow)[0] == ["failing", "failing", "restart"]


def test_a_start_whose_health_answered_is_over_even_if_no_probe_saw_it_serve():
    # the engine loaded (/health 200) and hung its generation before any tick saw it serve: counted, not "starting"
    fresh = {**UP, "started": STARTED + 1, "up_s": 100.0}
    chat_hung = {"serving": False, "failed": "chat", "detail": "1-token chat completion: timed out", "gpu_visible": True}
    actions, state = ticks([chat_hung] * 3, unit=fresh)
    assert actions == ["failing", "failing", "restart"] and state["answered_start"] == STARTED + 1


def test_activating_unit_is_starting_but_a_crash_loop_is_not():
    pulling = {**UP, "active": "activating", "sub": "start-pre", "up_s": None}
    assert ticks([HUNG], unit=pulling)[0] == ["starting"]
    looping = {**UP, "active": "activating", "sub": "auto-restart", "up_s": None}
    assert ticks([HUNG], unit=looping)[0] == ["failing"]


def test_a_unit_a_person_stopped_is_left_alone():
    stopped = {**UP, "active": "inactive", "sub": "dead", "up_s": None}
    assert ticks([HUNG] * 6, unit=stopped)[0] == ["stopped"] * 6


def test_restarts_back_off_then_give_up():
    # ticks every 30 s; restarts at 60 s, then not before 90 s later, then not before 180 s later; then gives up
    actions, state = ticks([HUNG] * 20)
    assert [n for n, a in enumerate(actions) if a == "restart"] == [2, 5, 11]
    assert actions[3:5] == ["failing", "failing"] and actions[8:11] == ["backoff"] * 3
    assert actions[14] == "gave-up" and state["gave_up"] is True
    assert state["restarts"] == [1_000_060.0, 1_000_150.0, 1_000_330.0]


def test_gave_up_stays_until_the_engine_answers():
    _, state = ticks([HUNG] * 20)
    later = 1_000_330.0 + 1800 + 1  # every restart now older than the window: still no restart
    actions, state = ticks([HUNG] * 3, state=state, start=later)
    assert actions == ["gave-up"] * 3 and state["restarts"] == []
    actions, state = ticks([OK, HUNG, HUNG, HUNG], state=state, start=later + 90)
    assert actions == ["ok", "failing", "failing", "restart"] and state["gave_up"] is False


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """The stand-in engine with a knob file, and the root-only env file a host keeps its key in."""
    root = tmp_path_factory.mktemp("watchdog")
    knobs = root / "engine.json"
    server = Server(make_model(root / "model"), "--served-model-name", "sim-qwen", "--api-key", KEY,
                    SIM_KNOB_FILE=str(knobs))
    (root / "engine.env").write_text(f"# Managed by sparkfleet\nVLLM_API_KEY={KEY}\n")
    yield server, knobs, {**quick(CFG, 0.5), "port": server.port, "served_name": "sim-qwen",
                          "env_file": str(root / "engine.env"), "container": "no-such-container"}
    knobs.write_text("{}")
    server.stop()


def test_probe_against_the_stand_in_engine(engine, tmp_path, monkeypatch):
    _, knobs, cfg = engine
    monkeypatch.setattr(wd, "engine_holds_port", lambda *args: (True, ""))  # the stand-in runs in no container
    result = wd.probe(cfg)
    assert (result["serving"], result["failed"], result["detail"]) == (True, None, "")
    knobs.write_text('{"fault": "generation-hang"}')
    result = wd.probe(cfg)
    assert (result["failed"], result["detail"]) == ("chat", "1-token chat completion: TimeoutError: timed out")
    knobs.write_text('{"fault": "hang"}')
    result = wd.probe(cfg)
    assert (result["failed"], result["detail"]) == ("health", "/health: TimeoutError: timed out")
    knobs.write_text("{}")
    wrong_key = tmp_path / "wrong.env"
    wrong_key.write_text("VLLM_API_KEY=nope\n")
    result = wd.probe({**cfg, "env_file": str(wrong_key)})
    assert (result["failed"], result["detail"]) == ("chat", "1-token chat completion: HTTP 401")
    assert wd.probe(cfg)["serving"] is True


# an env file as a host may hold it: comments (one indented), a blank line, a line that is no pair, a value with
# "=" and a space in it; what files/sparkfleet_host/envfiles.py's read_env_file keeps of it is the whole value
ENV_LINES = "# Managed by sparkfleet\n\n{name}={value}\n  # an indented comment\nSIM_X = 1\nnot a pair\n"
TRICKY_KEY = "sk-a=b c"


def test_the_env_file_rules(tmp_path):
    from sparkfleet.contract.shared import envfiles

    env = tmp_path / "engine.env"
    env.write_text(ENV_LINES.format(name="VLLM_API_KEY", value=TRICKY_KEY))
    assert envfiles.read_env_file(env) == {"VLLM_API_KEY": TRICKY_KEY, "SIM_X": " 1"}
    assert envfiles.read_env_file(tmp_path / "absent.env") == {}
    assert envfiles.read_env_file(tmp_path) == {}  # a directory: unreadable, no key


def test_the_watchdog_and_the_health_gate_read_the_key_by_those_rules(tmp_path, monkeypatch, capsys):
    """The engine's key with "=" and a space, amid comments and a line that is no pair, reaches the engine whole
    from the watchdog's probe and from the health gate (each reads the env file as the host module does)."""
    from tests.unit.test_serving_contract import run_health, write_serving

    engine = Server(make_model(tmp_path / "model"), "--served-model-name", "sim-qwen", "--api-key", TRICKY_KEY)
    try:
        env = tmp_path / "engine.env"
        env.write_text(ENV_LINES.format(name="VLLM_API_KEY", value=TRICKY_KEY))
        monkeypatch.setattr(wd, "engine_holds_port", lambda *args: (True, ""))  # the stand-in runs in no container
        cfg = {**quick(CFG, 5), "port": engine.port, "served_name": "sim-qwen", "env_file": str(env),
               "container": "no-such-container"}
        assert wd.probe(cfg)["serving"] is True
        gate = ["--serving", str(write_serving(tmp_path / "serving.json")), "--port", str(engine.port),
                "--served-name", "sim-qwen", "--container", "vllm", "--once", "--env-file", str(env)]
        rc, _, err = run_health(monkeypatch, capsys, *gate)
        assert rc == 0, err
        env.write_text(ENV_LINES.format(name="VLLM_API_KEY", value="sk-a"))  # the value cut at its "=": refused
        assert wd.probe(cfg)["detail"] == "1-token chat completion: HTTP 401"
        assert run_health(monkeypatch, capsys, *gate)[:3:2] == (1, "health: /v1/models: HTTP 401\n")
    finally:
        engine.stop()


def test_the_fetch_reads_the_hub_token_by_those_rules(gated_hub, tmp_path, monkeypatch):
    """sparkfleet-fetch's --env-file, with a hub token holding "=", amid comments and a line that is no pair: the
    gated hub answers it (and refuses the fetch without that file)."""
    from sparkfleet.model.hubs import hub_resolver
    from sparkfleet.release.plan import plan_hosts
    from tests.unit import test_hostile_values
    from tests.unit.helpers import run_fetch

    token = "hf_gated=0123456789abcdef"
    monkeypatch.setattr(test_hostile_values, "HUB_TOKEN", token)  # what the gated hub asks for from now on
    [plan] = plan_hosts([("a", host_data(model_hub="huggingface", model_revision="main", hub_endpoint=gated_hub,
                                         hub_token=token, model_root=str(tmp_path / "models")))],
                        resolve=hub_resolver)
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"manifest": plan.manifest.to_dict(), "model_dir": plan.model_dir,
                               "staging_dir": str(tmp_path / "models/.staging/x"), "endpoint": gated_hub}))
    env = tmp_path / "fetch.env"
    env.write_text(ENV_LINES.format(name="HF_TOKEN", value=token))
    assert run_fetch(job)[0] != 0  # no env file: the gated hub refuses
    code, report = run_fetch(job, "--env-file", str(env))
    assert code == 0, report


def test_gpu_check_names_a_lost_gpu(monkeypatch):
    class Done:
        def __init__(self, rc, out):
            self.returncode, self.stdout, self.stderr = rc, out, ""

    outputs = {"lost": Done(255, "Failed to initialize NVML: Unknown Error\n"),
               "fine": Done(0, "GPU 0: NVIDIA GB10 (UUID: GPU-5f3c)\n"),
               "paused": Done(1, "Error response from daemon: container abc is paused, unpause it\n")}
    monkeypatch.setattr(wd.subprocess, "run", lambda cmd, **kw: outputs[cmd[2]])
    assert wd.gpu_check("fine") == (True, "GPU 0: NVIDIA GB10 (UUID: GPU-5f3c)")
    assert wd.gpu_check("lost") == (False, "Failed to initialize NVML: Unknown Error")
    assert wd.gpu_check("paused")[0] is None


def test_a_converges_probe_reuses_the_last_ticks_gpu_check_of_the_same_start_only():
    """A tick records its GPU check; `--probe` takes it only from this start, seen, within two ticks."""
    _, state = wd.decide(CFG, {}, UP, {**OK, "gpu_detail": "GPU 0: GB10"}, 1000.0)
    assert state["gpu_check"] == {"start": STARTED, "at": 1000.0, "visible": True, "detail": "GPU 0: GB10"}
    assert wd.recent_gpu_check(state, UP, 1000.0 + 2 * CFG["interval_s"], CFG["interval_s"]) == state["gpu_check"]
    assert wd.recent_gpu_check(state, UP, 1001.0 + 2 * CFG["interval_s"], CFG["interval_s"]) is None  # stale
    assert wd.recent_gpu_check(state, {**UP, "started": STARTED + 1}, 1001.0, CFG["interval_s"]) is None  # restarted
    assert wd.recent_gpu_check(state, UP, 999.0, CFG["interval_s"]) is None  # from the future
    _, lost = wd.decide(CFG, {}, UP, {**OK, "serving": False, "failed": "gpu", "gpu_visible": False}, 1000.0)
    assert wd.recent_gpu_check(lost, UP, 1001.0, CFG["interval_s"]) is None  # a lost GPU is asked again
    _, again = wd.decide(CFG, state, UP, {**OK, "gpu_reused": True}, 1010.0)
    assert again["gpu_check"]["at"] == 1000.0  # a reused answer never refreshes its own age


def test_the_probe_asks_the_container_unless_handed_a_recent_check(monkeypatch):
    asked = []
    monkeypatch.setattr(wd, "ask", lambda *args: (None, None))
    monkeypatch.setattr(wd, "engine_holds_port", lambda *args: (True, ""))
    monkeypatch.setattr(wd, "gpu_check", lambda container: asked.append(container) or (True, "GPU 0: GB10"))
    cfg = {**CFG, "env_file": "/nonexistent", "container": "vllm"}
    assert wd.probe(cfg)["gpu_detail"] == "GPU 0: GB10" and asked == ["vllm"]
    reused = wd.probe(cfg, {"start": STARTED, "at": 1000.0, "visible": True, "detail": "GPU 0: GB10"})
    assert asked == ["vllm"] and reused["serving"] and reused["gpu_reused"]
    assert reused["gpu_detail"] == "GPU 0: GB10 (the watchdog's check at 1000)"


def test_verdicts_and_descriptions():
    assert probe_verdict({"serving": True}) == "serving"
    assert probe_verdict({"serving": False, "starting": True}) == "starting"
    assert probe_verdict({"serving": False, "busy": True, "starting": False}) == "busy"
    assert probe_verdict({"serving": False, "starting": False}) == "down"
    assert describe({"failed": "gpu", "detail": "x", "gpu_visible": False, "gpu_detail": "Failed to initialize NVML"}) \
        == "the engine container cannot see the GPU: Failed to initialize NVML"
    assert describe({"failed": "chat", "detail": "1-token chat completion: HTTP 500, 0 tokens", "gpu_visible": True}) \
        == "chat failed: 1-token chat completion: HTTP 500, 0 tokens"


def test_watchdog_settings_are_validated_and_shipped_without_secrets():
    s = parse_settings("spark-1", host_data(api_key="k-123", watchdog_interval_s=10))
    config = watchdog_config(s)
    assert config["interval_s"] == 10 and config["failures"] == 3 and config["max_restarts"] == 3
    assert config["window_s"] == 1800 and config["enabled"] is True and config["host"] == "127.0.0.1"
    assert "k-123" not in json.dumps(config)
    with pytest.raises(SettingsError, match="spark-1: setting `watchdog_interval_s` = 1 is invalid"):
        parse_settings("spark-1", host_data(watchdog_interval_s=1))


def test_status_summary_names_gave_up_and_a_lost_gpu():
    healthy = {"serving": True, "gpu_visible": True, "now": 1000.4, "restarts_in_window": 1,
               "watchdog": {"last_probe": 990.0, "last_result": "ok", "consecutive_failures": 0, "gave_up": False}}
    assert watchdog_summary(healthy) == {
        "last_probe_s_ago": 10, "last_result": "ok", "consecutive_failures": 0, "restarts_in_window": 1,
        "gave_up": False, "gpu_visible": True, "serving": True, "problem": None}
    gave_up = {**healthy, "serving": False, "restarts_in_window": 3,
               "watchdog": {"last_probe": 990.0, "gave_up": True, "detail": "/health: timed out"}}
    assert watchdog_summary(gave_up)["problem"] == "watchdog gave up after 3 restarts: /health: timed out"
    lost = {**healthy, "serving": False, "gpu_visible": False, "gpu_detail": "Failed to initialize NVML: Unknown Error"}
    assert watchdog_summary(lost)["problem"] == \
        "the engine container cannot see the GPU: Failed to initialize NVML: Unknown Error"
    assert watchdog_summary({"serving": False, "failed": "absent"})["last_probe_s_ago"] is None


def test_status_cell_shows_the_watchdog_and_the_gpu():
    summary = {"last_probe_s_ago": 12, "last_result": "ok", "consecutive_failures": 0, "restarts_in_window": 1,
               "gave_up": False, "gpu_visible": True, "serving": True, "problem": None}
    assert watchdog_cell(summary) == "ok 12 s ago, 1 restarts"
    assert watchdog_cell({**summary, "last_result": "health", "consecutive_failures": 3, "restarts_in_window": 3,
                          "gave_up": True}) == "[red]GAVE UP[/], health 12 s ago, 3 failing, 3 restarts"
    assert watchdog_cell({**summary, "last_result": "gpu", "gpu_visible": False}) == \
        "gpu 12 s ago, 1 restarts, [red]GPU LOST[/]"
    assert watchdog_cell({**summary, "last_probe_s_ago": None, "gpu_visible": None}) == \
        "no probe yet, 1 restarts, GPU ?"
    assert watchdog_cell({**summary, "restarts_in_window": 0}) == "ok 12 s ago"  # all well: one short cell
    assert watchdog_cell(None) == "-"


def gate_meta(ran: bool, success: bool = True) -> OperationMeta:
    meta = OperationMeta("hash", None)
    meta.set_complete(success, ["check"] if ran else [], CommandOutput([]))
    return meta


def test_the_serving_check_is_the_gate_a_rollout_reads_when_nothing_changed():
    """Each host records the gate after a change and the serving check; the one that ran decides."""
    state = type("State", (), {})()
    record_health_gate(state, "changed-ok", gate_meta(True))
    record_health_gate(state, "changed-ok", gate_meta(False))  # serving check skipped: the unit was (re)started
    record_health_gate(state, "not-serving", gate_meta(False))  # gate skipped: nothing changed
    record_health_gate(state, "not-serving", gate_meta(True, success=False))
    record_health_gate(state, "serving", gate_meta(False))
    record_health_gate(state, "serving", gate_meta(True))
    record_health_gate(state, "bad-release", gate_meta(True, success=False))
    record_health_gate(state, "bad-release", gate_meta(False))
    assert health_gate_results(state) == {"changed-ok": "passed", "not-serving": "failed", "serving": "passed",
                                          "bad-release": "failed"}


def test_a_failed_unit_reads_as_failed_in_the_batched_state():
    lines = ["U Id=sparkfleet-vllm.service", "U ActiveState=failed", "U SubState=failed", "U UnitFileState=enabled",
             "U ", "U Id=sparkfleet-watchdog.timer", "U ActiveState=active", "U SubState=waiting",
             "U UnitFileState=enabled", "U ", "U Id=sparkfleet-vllm-long.service", "U ActiveState=inactive",
             "U SubState=dead", "U UnitFileState=static"]
    units = parse_state(lines)["units"]
    assert units["sparkfleet-vllm.service"] == {"running": False, "enabled": True, "failed": True, "linked": True}
    assert units["sparkfleet-watchdog.timer"] == {"running": True, "enabled": True, "failed": False, "linked": True}
    # an on-demand engine's unit has no [Install]: enabled as pyinfra counts it, linked to start at boot it is not
    assert units["sparkfleet-vllm-long.service"] == {"running": False, "enabled": True, "failed": False,
                                                     "linked": False}


def test_each_service_is_kept_serving_under_the_same_rules_with_its_own_state(tmp_path, monkeypatch):
    """A tick watches the chat model, then every engine of "services": a service that stopped answering is
    restarted after `failures` ticks (its own unit and container), one a person stopped (inactive) never, and the
    chat model's state is not touched by either."""
    services = [{**watchdog_service(name, kind, name.upper(), port), "state_file": str(tmp_path / f"{name}.json")}
                for name, kind, port in (("coder", "chat", 8003), ("embed", "embedding", 8001))]
    config = tmp_path / "serving.json"
    config.write_text(json.dumps({**json.loads(serving_file(parse_settings("spark-1", host_data()),
                                                            services)), "state_file": str(tmp_path / "chat.json")}))
    units = {"sparkfleet-vllm.service": UP, "sparkfleet-vllm-coder.service": UP,
             "sparkfleet-vllm-embed.service": {**UP, "active": "inactive", "sub": "dead"}}
    answers = {"vllm": OK, "vllm-coder": HUNG, "vllm-embed": HUNG}
    restarted = []
    monkeypatch.setattr(wd, "unit_info", lambda unit: units[unit])
    monkeypatch.setattr(wd, "probe", lambda cfg, earlier=None: dict(answers[cfg["container"]]))
    monkeypatch.setattr(wd, "restart", lambda cfg: restarted.append((cfg["unit"], cfg["container"])) or
                        subprocess.CompletedProcess([], 0, "", ""))
    monkeypatch.setattr(sys, "argv", ["sparkfleet-watchdog", "--config", str(config)])
    (tmp_path / "coder.json").write_text(json.dumps(ANSWERED))  # it answered since its start: a hang counts
    for _ in range(CFG["failures"]):
        assert wd.main() == 0
    assert restarted == [("sparkfleet-vllm-coder.service", "vllm-coder")]
    states = {name: json.loads((tmp_path / f"{name}.json").read_text()) for name in ("chat", "coder", "embed")}
    assert (states["chat"]["last_action"], states["coder"]["last_action"], states["embed"]["last_action"]) == (
        "ok", "restart", "stopped")
    assert states["coder"]["restarts_total"] == 1 and "restarts_total" not in states["chat"]


def test_a_malformed_services_list_stops_the_watchdog_with_one_line(tmp_path, monkeypatch, capsys):
    config = tmp_path / "serving.json"
    config.write_text(json.dumps({**CFG, "services": [{"name": "x", "unit": "u"}]}))
    monkeypatch.setattr(sys, "argv", ["sparkfleet-watchdog", "--config", str(config)])
    assert wd.main() == 2
    assert '"services" is not a list of engines' in capsys.readouterr().err
