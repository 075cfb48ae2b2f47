import json

import pytest

from sparkfleet.fleet import batches as batches_module
from sparkfleet.fleet import rollout as rollout_module
from sparkfleet.fleet.converge import HostResult
from sparkfleet.fleet.rollout import batches, judge, rollout
from tests.unit.helpers import NoAddress

HOSTS = ["a", "b", "c", "d", "e"]


def test_batches_by_count_and_share():
    assert batches(HOSTS, "1") == [["a"], ["b"], ["c"], ["d"], ["e"]]
    assert batches(HOSTS, "2") == [["a", "b"], ["c", "d"], ["e"]]
    assert batches(HOSTS, "40%") == [["a", "b"], ["c", "d"], ["e"]]
    assert batches(HOSTS, "10%") == [["a"], ["b"], ["c"], ["d"], ["e"]]  # never an empty batch
    assert batches(HOSTS, "100%") == [HOSTS]


def test_canary_goes_alone_first():
    assert batches(HOSTS, "2", canary=True) == [["a"], ["b", "c"], ["d", "e"]]


@pytest.mark.parametrize("bad", ["0", "-1", "x", "0%", ""])
def test_bad_batch_is_refused(bad):
    with pytest.raises(ValueError, match="give a number of hosts"):
        batches(HOSTS, bad)


def test_judge():
    assert judge(HostResult("a", changed=["unit"])) == "converged"
    assert judge(HostResult("a")) == "unchanged"
    assert judge(HostResult("a", failed=["health"])) == "failed"
    assert judge(HostResult("a", connected=False, failed=["unreachable over SSH"])) == "unreachable"


def fake_deploy(monkeypatch, results: dict, staged: dict | None = None):
    """run_deploy replaced: stage.py gives `staged` (default: every host ready), deploy.py `results`; rollback.py
    records which hosts it ran on."""
    rolled_back = []

    def run_deploy(inventory, hosts, data=None, deploy_file="deploy.py", before_ops=None):
        if before_ops:
            before_ops()
        if deploy_file == "stage.py":
            return {h: (staged or {}).get(h, HostResult(h, changed=["Model files verified"])) for h in hosts}
        if deploy_file == "rollback.py":
            rolled_back.extend(hosts)
            return {h: HostResult(h, changed=["restored"], health_gate="passed") for h in hosts}
        return {h: results[h] for h in hosts}

    monkeypatch.setattr(rollout_module, "run_deploy", run_deploy)
    return rolled_back


def test_a_failed_health_gate_is_rolled_back_by_its_result(monkeypatch):
    rolled_back = fake_deploy(monkeypatch, {"a": HostResult("a", failed=["vLLM up"], health_gate="failed")})
    [report] = rollout("inv.py", ["a"], {"a": ("old", "new")}, log=lambda m: None)
    assert rolled_back == ["a"]
    assert (report.result, report.new_release) == ("rolled back", "old")


def test_another_failure_is_not_rolled_back_whatever_its_name(monkeypatch):
    rolled_back = fake_deploy(monkeypatch, {"a": HostResult("a", failed=["Q answers on port 8000"])})
    [report] = rollout("inv.py", ["a"], {"a": ("old", "new")}, log=lambda m: None)
    assert rolled_back == [] and report.result == "failed"


# --- staging: every host that will change is prepared before the first drain -------------------------------------

RELEASES = {"a": ("a0", "a1"), "b": ("b0", "b0"), "c": (None, "c1")}


class Clock:
    """time.monotonic for the rollout: each step it fakes takes the seconds it says."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self):
        return self.now


def fake_fleet(monkeypatch, staged: dict | None = None, results: dict | None = None, doors=("door",)):
    """Every deploy and front-door call recorded, in order, on a fake clock: a deploy run connects and plans for
    3 s (then its `before_ops`, the batch's drain: 2 s), then runs its operations (staging 37 s, a batch 5 s);
    putting hosts back takes 1 s."""
    calls, clock = [], Clock()

    def run_deploy(inventory, hosts, data=None, deploy_file="deploy.py", before_ops=None):
        clock.now += 3  # connect and plan: before the drain
        if before_ops:
            before_ops()
        calls.append((deploy_file, list(hosts)))
        clock.now += 37 if deploy_file == "stage.py" else 5
        given = (staged if deploy_file == "stage.py" else results) or {}
        return {h: given.get(h, HostResult(h, changed=["x"], health_gate="passed")) for h in hosts}

    class Door(NoAddress):
        def __init__(self):
            self.doors = list(doors)

        def put_back_stale(self, log):
            return []

        def drain(self, hosts, log, operation=None):
            assert operation == "rollout"  # held by the rollout (test_front_door_holds)
            calls.append(("drain", list(hosts)))
            clock.now += 2

        def ready(self, hosts, log):
            calls.append(("ready", list(hosts)))
            clock.now += 1

    monkeypatch.setattr(rollout_module, "run_deploy", run_deploy)
    monkeypatch.setattr(rollout_module, "time", clock)  # the staging's time
    monkeypatch.setattr(batches_module, "time", clock)  # the batch loop's: each batch's, each drain's
    monkeypatch.setattr(rollout_module.FrontDoorRuntime, "of", classmethod(lambda cls, inventory: Door()))
    return calls


def test_only_hosts_whose_release_changes_are_staged_and_a_group_whole():
    assert rollout_module.to_stage(["a", "b", "c"], RELEASES) == ["a", "c"]
    pair = {"b": ("b", "d"), "d": ("b", "d")}  # b keeps its release, its worker d changes: both are staged
    assert rollout_module.to_stage(["a", "b", "d"], {**RELEASES, "d": ("d1", "d2")}, pair) == ["a", "b", "d"]
    assert rollout_module.to_stage(["b"], RELEASES) == []


def test_a_host_that_holds_what_its_new_release_needs_is_not_staged():
    from types import SimpleNamespace

    plan = SimpleNamespace(model_dir="/m/qwen-abc", engine_ref="reg/vllm@sha256:1",
                           services=[SimpleNamespace(model_dir="/m/embed-1", image=None)])
    installed = {"model_dir": "/m/qwen-abc", "image": "reg/vllm@sha256:1",
                 "services": {"embed": {"model_dir": "/m/embed-1"}}}
    assert rollout_module.holds_what_it_needs(plan, installed)  # new arguments only: nothing to fetch or pull
    assert not rollout_module.holds_what_it_needs(plan, {**installed, "model_dir": "/m/qwen-old"})  # a new model
    assert not rollout_module.holds_what_it_needs(plan, {**installed, "image": "reg/vllm@sha256:2"})  # a new image
    assert not rollout_module.holds_what_it_needs(plan, {**installed, "services": {}})  # a new service's model
    assert not rollout_module.holds_what_it_needs(plan, {**installed, "services": ["/m/embed-1"]})  # not a record
    llama = SimpleNamespace(model_dir="/m/gguf-1", image="reg/llama:b1", engine_ref="reg/llama@sha256:3")
    both = SimpleNamespace(**{**vars(plan), "services": [*plan.services, llama]})
    services = {**installed["services"], "llama": {"model_dir": "/m/gguf-1", "image": "reg/llama@sha256:3"}}
    assert rollout_module.holds_what_it_needs(both, {**installed, "services": services})
    # a chat service's own image, new: staged (pulled while the host serves)
    assert not rollout_module.holds_what_it_needs(both, {**installed, "services": {
        **services, "llama": {"model_dir": "/m/gguf-1", "image": "reg/llama@sha256:2"}}})
    assert not rollout_module.holds_what_it_needs(plan, {})  # no record (a new or unreachable host)
    assert rollout_module.to_stage(["a", "b", "c"], RELEASES, prepared={"a"}) == ["c"]
    pair = {"b": ("b", "d"), "d": ("b", "d")}  # one member holding it is not enough: the group stages whole
    assert rollout_module.to_stage(["b", "d"], {**RELEASES, "d": ("d1", "d2")}, pair, prepared={"d"}) == ["b", "d"]


def test_every_changing_host_is_staged_in_one_run_before_the_first_drain(monkeypatch):
    calls = fake_fleet(monkeypatch)
    logged = []
    reports = rollout("inv.py", ["a", "b", "c"], RELEASES, log=logged.append)
    assert calls == [("stage.py", ["a", "c"]),
                     ("drain", ["a"]), ("deploy.py", ["a"]), ("ready", ["a"]),
                     ("drain", ["b"]), ("deploy.py", ["b"]), ("ready", ["b"]),
                     ("drain", ["c"]), ("deploy.py", ["c"]), ("ready", ["c"])]
    assert logged[:2] == ["stage: a, c: the new release prepared beside the running one, still serving",
                          "stage: 2 hosts ready in 40 s"]
    assert [(r.host, r.result, r.staged_s, r.seconds, r.out_of_rotation_s) for r in reports] == [
        ("a", "converged", 40, 10, 8), ("b", "converged", None, 10, 8), ("c", "converged", 40, 10, 8)]
    assert rollout_module.report_json(reports)["phases"] == {
        "stage": {"hosts": ["a", "c"], "seconds": 40}, "switch": {"batches": 3, "seconds": 30}}


def test_nothing_to_stage_runs_no_staging(monkeypatch):
    calls = fake_fleet(monkeypatch)
    [report] = rollout("inv.py", ["b"], RELEASES, log=lambda m: None)
    assert calls == [("drain", ["b"]), ("deploy.py", ["b"]), ("ready", ["b"])]
    assert report.staged_s is None
    assert rollout_module.report_json([report])["phases"]["stage"] == {"hosts": [], "seconds": 0.0}


def test_a_staging_failure_on_any_host_halts_before_anything_is_drained(monkeypatch):
    disk = "c: free disk at /m: found 4.0 MiB, required 8.0 MiB for the model files still to fetch: free space"
    calls = fake_fleet(monkeypatch, staged={"c": HostResult("c", failed=["Preflight failed: this host is left "
                                                                          "untouched"], said=[disk])})
    logged = []
    reports = rollout("inv.py", ["a", "b", "c"], RELEASES, batch="2", log=logged.append)
    assert calls == [("stage.py", ["a", "c"])]  # no drain, no deploy: every host keeps its release
    assert logged[-2:] == ["stage: failed on c after 40 s: halted, no host drained", f"stage: {disk}"]
    assert [(r.host, r.result, r.batch, r.staged_s, r.out_of_rotation_s) for r in reports] == [
        ("a", "not reached", None, 40, None), ("b", "not reached", None, None, None), ("c", "failed", None, 40, None)]
    assert reports[2].detail == f"staging failed: {disk}; its release is unchanged"
    assert reports[0].detail == "halted: staging failed on c; no host was drained"
    assert not rollout_module.report_json(reports)["ok"]
    assert rollout_module.report_json(reports)["phases"]["switch"] == {"batches": 0, "seconds": 0}


def test_an_unreachable_host_fails_the_staging_too(monkeypatch):
    calls = fake_fleet(monkeypatch, staged={"a": HostResult("a", connected=False, failed=["unreachable over SSH"])})
    reports = rollout("inv.py", ["a", "c"], RELEASES, log=lambda m: None)
    assert calls == [("stage.py", ["a", "c"])]
    assert [r.result for r in reports] == ["unreachable", "not reached"]


def test_out_of_rotation_is_only_for_a_backend_put_back_behind_a_front_door(monkeypatch):
    fake_fleet(monkeypatch, results={"c": HostResult("c", failed=["Model files verified"])})
    reports = rollout("inv.py", ["a", "c"], RELEASES, max_fail=1, log=lambda m: None)
    assert [(r.host, r.result, r.out_of_rotation_s) for r in reports] == [("a", "converged", 8),
                                                                          ("c", "failed", None)]  # stays out
    fake_fleet(monkeypatch, doors=())
    assert [r.out_of_rotation_s for r in rollout("inv.py", ["a"], RELEASES, log=lambda m: None)] == [None]


def test_the_report_prints_both_phases_and_the_out_of_rotation_times(monkeypatch, capsys):
    from sparkfleet.commands import common

    fake_fleet(monkeypatch)
    common.print_reports(rollout("inv.py", ["a", "b", "c"], RELEASES, log=lambda m: None), False)
    err = capsys.readouterr().err
    assert "out of rotation s" in err
    assert "phases: stage 2 hosts in 40 s (all at once, before any drain), switch 3 batches in 30 s" in err
    common.print_reports(rollout("inv.py", ["a"], RELEASES, log=lambda m: None), True)
    printed = json.loads(capsys.readouterr().out)
    assert printed["hosts"][0]["out_of_rotation_s"] == 8 and printed["hosts"][0]["staged_s"] == 40
    assert printed["phases"]["stage"] == {"hosts": ["a"], "seconds": 40}


def test_what_a_failed_host_said_reaches_the_report_printable_and_short():
    """A host's stderr is untrusted: an escape sequence or a megabyte line must not reach the terminal whole."""
    from sparkfleet.fleet.converge import SAID_MAX_CHARS, host_said

    lines = ["", "first", "\x1b[2J\x1b]0;pwned\x07spark-2: free disk", "  ", "x" * 5000, "last\r"]
    assert host_said(lines) == ["[2J]0;pwnedspark-2: free disk", "x" * SAID_MAX_CHARS, "last"]
    assert host_said(["only"]) == ["only"] and host_said([]) == []


# --- the speed gate: the canary measured after its health gate, still drained ---------------------------------------

class FakeGate:
    """fleet/speed.py SpeedGate's questions answered from `figures` ({(host, running): Figures}; absent: it cannot
    be measured), each call recorded in `calls` beside the deploys and the front door's."""

    def __init__(self, calls, figures, kept=None):
        self.calls, self.figures, self.kept, self.written = calls, figures, kept or {}, {}

    def max_regression(self, host):
        return 0.10

    def baseline(self, host, release):
        return self.kept.get((host, release))

    def measure(self, host, running=False):
        from sparkfleet.fleet.speed import SpeedError

        self.calls.append(("measure running" if running else "measure", host))
        from sparkfleet.fleet.speed import ReachError

        found = self.figures.get((host, running))
        if found is None:
            raise SpeedError("APIConnectionError: refused")
        if found == "no forward":
            raise ReachError(f"ssh forward to {host} failed: administratively prohibited")
        return found

    def keep(self, host, figures):
        self.written[host] = figures
        return True


def test_a_canary_slower_than_its_previous_release_is_rolled_back_and_the_rollout_halts(monkeypatch):
    from sparkfleet.contract.speed import Figures

    calls = fake_fleet(monkeypatch)
    gate = FakeGate(calls, {("a", False): Figures(30.1, 121.0)}, kept={("a", "a0"): Figures(50.2, 119.0)})
    logged = []
    reports = rollout("inv.py", ["a", "b", "c"], RELEASES, speed=gate, log=logged.append)
    assert calls == [("stage.py", ["a", "c"]), ("drain", ["a"]), ("deploy.py", ["a"]), ("measure", "a"),
                     ("rollback.py", ["a"]), ("ready", ["a"])]  # measured while drained; back in on its old release
    halt = "a: decode 30.1 tok/s vs 50.2 before (-40 %), over rollout_max_regression 10 %: rolled back; halted"
    assert halt in "\n".join(logged)
    assert [(r.host, r.result, r.new_release) for r in reports] == [
        ("a", "rolled back", "a0"), ("b", "not reached", "b0"), ("c", "not reached", "c1")]
    assert reports[0].detail == f"{halt}; previous release restored on it"
    assert reports[2].detail == "halted: the speed gate stopped the canary a"
    assert reports[0].speed["verdict"] == "regressed" and reports[0].speed["baseline"]["source"] == "speed record"
    assert gate.written == {"a": {"a1": Figures(30.1, 121.0)}}
    assert not rollout_module.report_json(reports)["ok"]
    assert rollout_module.report_json(reports)["speed_gate"]["checks"] == [reports[0].speed]


def test_without_a_kept_figure_the_running_release_is_measured_after_the_drain_before_the_switch(monkeypatch):
    from sparkfleet.contract.speed import Figures

    calls = fake_fleet(monkeypatch)
    gate = FakeGate(calls, {("a", True): Figures(50.0, 120.0), ("a", False): Figures(49.5, 122.0)})
    reports = rollout("inv.py", ["b", "a", "c"], RELEASES, speed=gate, log=lambda m: None)
    # b keeps its release: the canary is a, the first cohort that changes; only it is measured
    assert [c for c in calls if c[0] != "stage.py"] == [
        ("drain", ["b"]), ("deploy.py", ["b"]), ("ready", ["b"]),
        ("drain", ["a"]), ("measure running", "a"), ("deploy.py", ["a"]), ("measure", "a"), ("ready", ["a"]),
        ("drain", ["c"]), ("deploy.py", ["c"]), ("ready", ["c"])]
    assert [r.result for r in reports] == ["converged"] * 3
    check = reports[1].speed
    assert check["verdict"] == "passed" and check["baseline"]["source"] == "measured now"
    assert "(baseline measured now)" in check["line"]
    assert gate.written == {"a": {"a1": Figures(49.5, 122.0), "a0": Figures(50.0, 120.0)}}  # both kept


def test_where_no_baseline_can_be_had_the_first_measurement_is_the_baseline(monkeypatch):
    from sparkfleet.contract.speed import Figures

    calls = fake_fleet(monkeypatch)
    gate = FakeGate(calls, {("a", False): Figures(30.0, 120.0)})  # the running release does not answer the bench
    reports = rollout("inv.py", ["a"], RELEASES, speed=gate, log=lambda m: None)
    assert reports[0].result == "converged" and reports[0].speed["verdict"] == "baseline"
    gate = FakeGate(calls, {("c", False): Figures(30.0, 120.0)})  # a new host: no previous release to measure
    reports = rollout("inv.py", ["c"], RELEASES, speed=gate, log=lambda m: None)
    assert ("measure running", "c") not in calls and reports[0].speed["verdict"] == "baseline"


def test_a_canary_that_cannot_be_measured_is_rolled_back(monkeypatch):
    from sparkfleet.contract.speed import Figures

    calls = fake_fleet(monkeypatch)
    gate = FakeGate(calls, {}, kept={("a", "a0"): Figures(50.0, 120.0)})
    reports = rollout("inv.py", ["a", "c"], RELEASES, speed=gate, log=lambda m: None)
    assert [r.result for r in reports] == ["rolled back", "not reached"]
    assert reports[0].speed["verdict"] == "failed" and "APIConnectionError" in reports[0].speed["line"]


def test_a_canary_the_controller_cannot_reach_is_not_judged(monkeypatch):
    from sparkfleet.contract.speed import Figures

    calls = fake_fleet(monkeypatch)
    gate = FakeGate(calls, {("a", False): "no forward"}, kept={("a", "a0"): Figures(50.0, 120.0)})
    reports = rollout("inv.py", ["a", "c"], RELEASES, speed=gate, log=lambda m: None)
    assert [r.result for r in reports] == ["converged", "converged"] and ("rollback.py", ["a"]) not in calls
    assert reports[0].speed["verdict"] == "not measured" and "--no-speed-gate" in reports[0].speed["line"]
    assert gate.written == {}


def test_a_canary_failing_its_health_gate_is_not_measured(monkeypatch):
    from sparkfleet.contract.speed import Figures

    calls = fake_fleet(monkeypatch, results={"a": HostResult("a", failed=["vLLM up"], health_gate="failed")})
    gate = FakeGate(calls, {}, kept={("a", "a0"): Figures(50.0, 120.0)})
    reports = rollout("inv.py", ["a"], {"a": ("a0", "a1")}, speed=gate, log=lambda m: None)
    assert not [c for c in calls if c[0].startswith("measure")]
    assert reports[0].speed["verdict"] == "not measured"
    assert reports[0].speed["line"].startswith("a: not measured: failed (health gate failed")


def test_no_speed_gate_measures_nothing_and_the_report_says_so(monkeypatch, capsys):
    from sparkfleet.commands import common

    calls = fake_fleet(monkeypatch)
    reports = rollout("inv.py", ["a"], RELEASES, speed=None, log=lambda m: None)
    assert not [c for c in calls if c[0].startswith("measure")] and reports[0].speed is None
    common.print_reports(reports, False, speed_skipped=True)
    assert "speed gate: skipped (--no-speed-gate)" in capsys.readouterr().err
    common.print_reports(reports, True, speed_skipped=True)
    assert json.loads(capsys.readouterr().out)["speed_gate"] == {"skipped": True, "checks": []}
    common.print_reports(reports, True)  # a rollback's report has no speed gate
    assert "speed_gate" not in json.loads(capsys.readouterr().out)


def test_doors_sharing_an_address_are_converged_one_at_a_time_then_the_other_service_hosts_together():
    from sparkfleet.fleet.rollout import service_steps

    assert service_steps(["door-1", "door-2", "prom"], {"door-1", "door-2"}) == [["door-1"], ["door-2"], ["prom"]]
    assert service_steps(["door-1", "prom"], set()) == [["door-1", "prom"]]  # one door, or none shared: as before
    assert service_steps(["door-1", "door-2"], {"door-1", "door-2"}) == [["door-1"], ["door-2"]]
