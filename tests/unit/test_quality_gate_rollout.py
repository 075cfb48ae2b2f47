"""The quality gate in a rollout's and an upgrade's canary (fleet/rollout.py quality_gate, fleet/upgrade.py): the
canary's head, still drained after its health and speed gates, is evaluated and judged against the release it
replaces. The deploys, the front door and the evaluations are faked (no SSH, no engine); the judgement, the lines and
what is kept are the real QualityGate's."""

from __future__ import annotations

import json

import pytest

from sparkfleet.contract.settings import parse_settings
from sparkfleet.fleet import rollout as rollout_module
from sparkfleet.fleet import upgrade as upgrade_module
from sparkfleet.fleet.quality import QualityGate
from sparkfleet.fleet.rollout import quality_lines, rollout
from sparkfleet.fleet.upgrade import upgrade
from sparkfleet.quality.run import Evaluation, ProbeResult

from .helpers import host_data
from .test_rollout import RELEASES, FakeGate, fake_fleet
from .test_upgrade import fake_fleet as fake_upgrade_fleet
from .test_upgrade import surveys

MODEL = parse_settings("a", host_data()).served_model_name
OVERRIDE = "override with --no-quality-gate"


def evaluation(answers: dict[str, str] | None = None, failing: tuple[str, ...] = (), model: str = MODEL,
               why: str = "answered HTTP 503") -> Evaluation:
    """A chat model's evaluation: each probe's answer (`failing` ones failed); None: nothing answered."""
    if answers is None:
        results = [ProbeResult(p, "exact", "not_evaluated", "", why) for p in ("arithmetic", "tool_call")]
        return Evaluation(model, "chat", results, None, False, 0.4)
    results = [ProbeResult(p, "exact", "fail" if p in failing else "pass", a, "not the baseline's answer"
                           if p in failing else "", [a]) for p, a in answers.items()]
    passed = sum(r.verdict == "pass" for r in results)
    return Evaluation(model, "chat", results, round(passed / len(results), 4), True, 1.5)


GOOD = {"arithmetic": "5461", "tool_call": "get_weather({\"city\": \"Paris\"})"}
WRONG = {"arithmetic": "6572", "tool_call": "get_weather({\"city\": \"Paris\"})"}


class FakeQuality(QualityGate):
    """QualityGate with its host side faked: `found` {(host, running): {model: Evaluation}} answers `measure`
    (absent: nothing answered), `kept` {(host, release): {model: Evaluation}} is each release's baseline, `keep`
    records what it would write. The judgement (`judge`, `margin`, `on_demand`) is the real one."""

    def __init__(self, calls, found, kept=None, on_demand=()):
        hosts = {h: (parse_settings(h, host_data()), host_data()) for h in ("a", "b", "c")}
        super().__init__("inv.py", hosts, {h: None for h in hosts})
        self.calls, self.found, self.baselines, self.written = calls, found, kept or {}, {}
        self.lazy = set(on_demand)

    def baseline(self, host, release):
        return self.baselines.get((host, release))

    def measure(self, host, running=False, baseline=None):
        self.calls.append(("evaluate running" if running else "evaluate", host))
        return self.found.get((host, running)) or {MODEL: evaluation(None)}

    def keep(self, host, release, evaluations):
        self.written[(host, release)] = evaluations
        return True

    def on_demand(self, host):
        return super().on_demand(host) | self.lazy


def test_a_canary_whose_answers_changed_is_rolled_back_and_the_rollout_halts_in_one_line(monkeypatch):
    calls = fake_fleet(monkeypatch)
    gate = FakeQuality(calls, {("a", False): {MODEL: evaluation(WRONG, failing=("arithmetic",))}},
                       kept={("a", "a0"): {MODEL: evaluation(GOOD)}})
    logged = []
    reports = rollout("inv.py", ["a", "b", "c"], RELEASES, quality=gate, log=logged.append)
    assert calls == [("stage.py", ["a", "c"]), ("drain", ["a"]), ("deploy.py", ["a"]), ("evaluate", "a"),
                     ("rollback.py", ["a"]), ("ready", ["a"])]  # evaluated while drained; back in on its old release
    [halt] = [line for line in logged if line.startswith("quality gate: a: ")]
    assert "\n" not in halt and halt.startswith(f"quality gate: a: {MODEL}: probe arithmetic passed in the baseline")
    assert 'before "5461", now "6572"' in halt and halt.endswith(f"rolled back; halted; {OVERRIDE} (0.0 s)")
    assert [(r.host, r.result, r.new_release) for r in reports] == [
        ("a", "rolled back", "a0"), ("b", "not reached", "b0"), ("c", "not reached", "c1")]
    assert reports[2].detail == "halted: the quality gate stopped the canary a"
    check = reports[0].quality
    assert check["verdict"] == "regressed" and check["baseline"]["source"] == "quality record"
    assert check["measured"][MODEL]["failed"] == ["arithmetic"] and check["kept"] is None
    assert gate.written == {}  # a failing evaluation never becomes its release's baseline
    found = rollout_module.report_json(reports, quality_skipped=False)
    assert not found["ok"] and found["quality_gate"]["checks"] == [check]
    assert quality_lines(reports, False) == [f"quality gate: regressed: {check['line']}"]


def test_a_healthy_canary_proceeds_after_the_speed_gate_and_its_evaluation_becomes_its_baseline(monkeypatch):
    """No baseline kept for the running release: it is evaluated after the drain, before the switch (and kept as
    its release's); the new release, evaluated after the speed gate, passes and is kept as its own baseline."""
    from sparkfleet.contract.speed import Figures

    calls = fake_fleet(monkeypatch)
    speed = FakeGate(calls, {("a", False): Figures(49.5, 122.0)}, kept={("a", "a0"): Figures(50.0, 120.0)})
    before, after = {MODEL: evaluation(GOOD)}, {MODEL: evaluation(GOOD)}
    gate = FakeQuality(calls, {("a", True): before, ("a", False): after})
    logged = []
    reports = rollout("inv.py", ["b", "a", "c"], RELEASES, speed=speed, quality=gate, log=logged.append)
    assert [c for c in calls if c[0] != "stage.py"] == [
        ("drain", ["b"]), ("deploy.py", ["b"]), ("ready", ["b"]),
        ("drain", ["a"]), ("evaluate running", "a"), ("deploy.py", ["a"]), ("measure", "a"), ("evaluate", "a"),
        ("ready", ["a"]), ("drain", ["c"]), ("deploy.py", ["c"]), ("ready", ["c"])]  # only the canary is judged
    assert [r.result for r in reports] == ["converged"] * 3
    check = reports[1].quality
    assert (check["verdict"], check["baseline"]["source"], check["kept"]) == ("passed", "measured now", True)
    assert check["line"].endswith("(baseline evaluated now)") and f"{MODEL} 1.00 vs 1.00 before" in check["line"]
    assert gate.written == {("a", "a0"): before, ("a", "a1"): after}
    assert any(line.startswith("quality gate: a: no baseline kept for a0: evaluated it now") for line in logged)
    assert reports[0].quality is None and reports[2].quality is None


def test_a_model_not_evaluated_on_the_new_release_halts_with_its_own_line(monkeypatch):
    """The health gate passed, so a model the new release serves that answers no probe (5xx) is suspect: neither
    a regression nor a pass, it halts the rollout with a line of its own."""
    calls = fake_fleet(monkeypatch)
    gate = FakeQuality(calls, {}, kept={("a", "a0"): {MODEL: evaluation(GOOD)}})
    logged = []
    reports = rollout("inv.py", ["a", "c"], RELEASES, quality=gate, log=logged.append)
    assert [r.result for r in reports] == ["rolled back", "not reached"] and ("rollback.py", ["a"]) in calls
    line = (f"a: {MODEL}: not evaluated on the new release after its health gate passed (answered HTTP 503); "
            f"rolled back; halted; {OVERRIDE}")
    assert reports[0].quality["verdict"] == "not evaluated" and reports[0].quality["line"] == line
    assert f"quality gate: {line} (0.0 s)" in logged and gate.written == {}


def test_an_idle_on_demand_model_is_not_held_against_the_release(monkeypatch):
    """An evaluation never starts an on-demand model: its "not evaluated" neither halts nor passes."""
    calls = fake_fleet(monkeypatch)
    now = {MODEL: evaluation(GOOD), "embedder": evaluation(None, model="embedder", why="on demand")}
    gate = FakeQuality(calls, {("a", False): now}, kept={("a", "a0"): {MODEL: evaluation(GOOD)}},
                       on_demand=("embedder",))
    reports = rollout("inv.py", ["a"], RELEASES, quality=gate, log=lambda m: None)
    assert reports[0].result == "converged" and reports[0].quality["verdict"] == "passed"
    assert gate.written == {("a", "a1"): now}


def test_where_no_baseline_can_be_had_the_new_evaluation_is_the_baseline(monkeypatch):
    calls = fake_fleet(monkeypatch)
    after = {MODEL: evaluation(GOOD)}
    gate = FakeQuality(calls, {("a", False): after})  # the running release answers no probe
    logged = []
    reports = rollout("inv.py", ["a"], RELEASES, quality=gate, log=logged.append)
    assert reports[0].result == "converged" and reports[0].quality["verdict"] == "baseline"
    assert reports[0].quality["baseline"] is None and gate.written == {("a", "a1"): after}
    assert any("the running release could not be evaluated (" in line for line in logged)
    gate = FakeQuality(calls, {("c", False): after})  # a new host: no previous release to evaluate
    reports = rollout("inv.py", ["c"], RELEASES, quality=gate, log=lambda m: None)
    assert ("evaluate running", "c") not in calls and reports[0].quality["verdict"] == "baseline"


def test_a_canary_the_speed_gate_stopped_is_not_evaluated(monkeypatch):
    from sparkfleet.contract.speed import Figures

    calls = fake_fleet(monkeypatch)
    speed = FakeGate(calls, {("a", False): Figures(30.1, 121.0)}, kept={("a", "a0"): Figures(50.2, 119.0)})
    gate = FakeQuality(calls, {}, kept={("a", "a0"): {MODEL: evaluation(GOOD)}})
    reports = rollout("inv.py", ["a", "c"], RELEASES, speed=speed, quality=gate, log=lambda m: None)
    assert ("evaluate", "a") not in calls and reports[1].detail == "halted: the speed gate stopped the canary a"
    assert reports[0].quality["verdict"] == "not evaluated"
    assert reports[0].quality["line"].startswith("a: not evaluated: rolled back (a: decode 30.1 tok/s")


def test_no_quality_gate_evaluates_nothing_and_the_report_says_so(monkeypatch):
    from sparkfleet import cli

    calls = fake_fleet(monkeypatch)
    reports = rollout("inv.py", ["a"], RELEASES, quality=None, log=lambda m: None)
    assert not [c for c in calls if c[0].startswith("evaluate")] and reports[0].quality is None
    assert rollout_module.report_json(reports, False, True)["quality_gate"] == {"skipped": True, "checks": []}
    assert quality_lines(reports, True) == ["quality gate: skipped (--no-quality-gate)"]
    assert "quality_gate" not in rollout_module.report_json(reports)  # a rollback's report has no quality gate
    for command in ("rollout", "upgrade"):
        args = cli.parser().parse_args([command, "inv.py", "--no-quality-gate", "--no-speed-gate"])
        assert args.no_quality_gate and args.no_speed_gate
        assert not cli.parser().parse_args([command, "inv.py"]).no_quality_gate


@pytest.mark.parametrize("kept", [True, False])
def test_an_upgrade_canary_answering_worse_on_its_new_platform_stays_drained_and_the_upgrade_halts(monkeypatch, kept):
    """The upgrade's canary: its release's answers on the new platform against the release's kept baseline, or,
    where none is kept, against the old platform's evaluated right after the drain."""
    calls = fake_upgrade_fleet(monkeypatch)
    old = {MODEL: evaluation(GOOD)}
    found = {("a", False): {MODEL: evaluation(WRONG, failing=("arithmetic",))}, ("a", True): old}
    gate = FakeQuality(calls, found, kept={("a", "r1"): old} if kept else {})
    logged = []
    reports = upgrade("inv.py", surveys("a", "b"), quality=gate, releases={"a": "r1", "b": "r1"}, log=logged.append)
    assert calls == [("drain", ["a"]), *([] if kept else [("evaluate running", "a")]), ("upgrade.py", ["a"]),
                     ("deploy.py", ["a"]), ("evaluate", "a"), ("ready", [])]
    assert [(r.host, r.result) for r in reports] == [("a", "failed"), ("b", "not reached"), ("c", "unchanged")]
    detail = reports[0].detail
    assert detail.startswith(f"quality gate: a: {MODEL}: probe arithmetic passed in the baseline and fails now")
    assert detail.endswith(f"halted; {OVERRIDE}; left drained on its new versions")
    assert reports[0].quality["verdict"] == "regressed"
    assert gate.written == ({} if kept else {("a", "r1"): old})  # the old platform's answers, never the new's
    found = upgrade_module.report_json(reports)
    assert found["quality_gate"]["checks"] == [reports[0].quality] and not found["ok"]
    assert json.dumps(found)  # the report stays JSON


def test_an_upgrade_canary_answering_the_same_is_kept_and_the_upgrade_goes_on(monkeypatch):
    calls = fake_upgrade_fleet(monkeypatch)
    after = {MODEL: evaluation(GOOD)}
    gate = FakeQuality(calls, {("a", False): after}, kept={("a", "r1"): {MODEL: evaluation(GOOD)}})
    reports = upgrade("inv.py", surveys("a", "b"), quality=gate, releases={"a": "r1", "b": "r1"}, log=lambda m: None)
    assert [r.result for r in reports] == ["upgraded", "upgraded", "unchanged"]
    assert reports[0].quality["verdict"] == "passed" and gate.written == {("a", "r1"): after}
    assert ("evaluate", "b") not in calls  # the canary alone
