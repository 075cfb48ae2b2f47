"""`sparkfleet upgrade`: the apt simulation's parsing, refused versions, the reboot rule, and the batches with hosts
faked (no SSH)."""

import pytest

from sparkfleet.contract.settings import parse_settings
from sparkfleet.fleet import upgrade as upgrade_module
from sparkfleet.fleet.converge import HostResult
from sparkfleet.fleet.upgrade import HostSurvey, front_doors_last, judge, survey_of, upgrade
from sparkfleet.host.facts import Unreadable
from sparkfleet.host.upgrade import (
    END,
    REBOOT_OP,
    REFUSED_OP,
    UPGRADE_OP,
    Change,
    Simulation,
    UpgradeSimulation,
    needs_reboot,
    parse_simulation,
    platform_version,
    refused_changes,
    upstream,
)

from .helpers import RecordingDoor, host_data

DRIVER = Change("nvidia-driver-580-open", "580.95.05-1", "580.95.99-1")
KERNEL = Change("linux-image-6.17.0-1008-nvidia", None, "6.17.0-1008.8")
TOOL = Change("curl", "8.5.0-2ubuntu10.1", "8.5.0-2ubuntu10.6")


def test_the_simulation_reads_inst_lines_new_packages_and_the_reboot_flag():
    sim = parse_simulation([
        "Inst nvidia-driver-580-open [580.95.05-1] (580.95.99-1 sparkfleet-sim DGX OS stand-in:x [amd64])",
        "Inst linux-image-6.17.0-1008-nvidia (6.17.0-1008.8 Ubuntu:24.04/noble-updates [arm64])",
        "reboot-required", END,
    ])
    assert sim == Simulation((DRIVER, KERNEL), True)
    assert parse_simulation([END]) == Simulation((), False)
    assert isinstance(parse_simulation([]), Unreadable)  # cut short, or no answer: not "nothing to upgrade"
    assert isinstance(UpgradeSimulation().default(), Unreadable)
    assert DRIVER.line() == "nvidia-driver-580-open 580.95.05-1 -> 580.95.99-1"
    assert KERNEL.line() == "linux-image-6.17.0-1008-nvidia (new) -> 6.17.0-1008.8"


def test_an_apt_error_is_unreadable_not_an_empty_upgrade():
    found = parse_simulation(["Inst curl [1] (2 x [arm64])", "E: apt-get update failed (run it on the host to see why)",
                              END])
    assert isinstance(found, Unreadable) and "apt-get update failed" in found.problem


def test_platform_versions_of_packages():
    assert upstream("1:580.95.99-0ubuntu0.24.04.2") == "580.95.99"
    assert platform_version(DRIVER) == ("NVIDIA driver", "580.95.99")
    assert platform_version(KERNEL) == ("kernel", "6.17.0-1008-nvidia")
    assert platform_version(Change("linux-image-nvidia-hwe-24.04", "1", "2")) is None  # a metapackage: no kernel
    assert platform_version(TOOL) is None
    assert platform_version(Change("libnvidia-compute-580", "1", "2")) is None


def settings(**data):
    return parse_settings("spark-a", host_data(**data))


def test_refused_driver_and_kernel_versions_are_named_with_the_package_and_why():
    s = settings(refused_drivers={"580.95.99*": "breaks NVML"}, refused_kernels={"6.17.0-1008*": "panics"})
    lines = refused_changes("spark-a", s, [DRIVER, KERNEL, TOOL])
    assert lines[0].startswith("spark-a: nvidia-driver-580-open 580.95.99-1 (NVIDIA driver 580.95.99) is refused "
                               "(refused_drivers '580.95.99*'): breaks NVML: not installed; pin")
    assert lines[1].startswith("spark-a: linux-image-6.17.0-1008-nvidia 6.17.0-1008.8 (kernel 6.17.0-1008-nvidia) is "
                               "refused (refused_kernels '6.17.0-1008*'): panics")
    assert len(lines) == 2
    assert refused_changes("spark-a", settings(refused_drivers={"580.95.05*": "old"}), [DRIVER]) == []


def test_a_pair_kernel_is_refused_on_a_group_member_only():
    s = settings(refused_pair_kernels={"6.17.0-1008*": "NCCL over RoCE"}, refused_kernels={})
    assert refused_changes("spark-a", s, [KERNEL]) == []
    assert "refused_pair_kernels" in refused_changes("spark-a", s, [KERNEL], in_group=True)[0]


def test_a_reboot_for_a_kernel_a_driver_or_the_hosts_own_flag_only():
    assert needs_reboot(Simulation((DRIVER,), False)) and needs_reboot(Simulation((KERNEL,), False))
    assert needs_reboot(Simulation((TOOL,), True))
    assert not needs_reboot(Simulation((TOOL,), False)) and not needs_reboot(Simulation((), False))


def test_a_survey_says_what_would_change_and_what_stops_it():
    refuse = lambda sim: ["refused"] if DRIVER in sim.changes else []  # noqa: E731
    assert survey_of("a", Simulation((DRIVER,), False), refuse) == HostSurvey(
        "a", [DRIVER.line()], True, refused=["refused"])
    assert survey_of("a", Simulation((), False), refuse).todo is False
    assert survey_of("a", None, refuse).problem == "unreachable over SSH"
    assert survey_of("a", Unreadable("apt", "E: x"), refuse).problem.startswith("a: apt: E: x")


def test_judge_names_the_step_that_failed():
    refused = HostResult("a", failed=["No hosts remaining!", f"Platform upgrade | {REFUSED_OP}: a: "
                                      "nvidia-driver-580-open 580.95.99-1 is refused"])
    assert judge(refused, None, None) == (
        "refused", "a: nvidia-driver-580-open 580.95.99-1 is refused; left drained on its old versions")
    assert judge(HostResult("a", failed=[UPGRADE_OP]), None, None)[0] == "failed"
    assert judge(HostResult("a", connected=False, failed=["unreachable over SSH"]), None, None)[0] == "unreachable"
    assert judge(HostResult("a"), HostResult("a", failed=["health"]), None) == (
        "failed", "converge after the upgrade failed: health; left drained")
    assert judge(HostResult("a"), HostResult("a"), "12 tokens/s < 40") == (
        "failed", "speed gate: 12 tokens/s < 40; left drained on its new versions")
    assert judge(HostResult("a"), None, None)[0] == "failed"  # its group's other member failed its step
    assert judge(HostResult("a", changed=[REBOOT_OP]), HostResult("a"), None) == ("upgraded", "")


def test_front_door_hosts_go_last():
    logged = []
    assert front_doors_last([("a",), ("b", "c"), ("d",)], ["a", "c"], logged.append) == [("d",), ("a",), ("b", "c")]
    assert len(logged) == 2 and logged[0].startswith("a: runs a front door; upgraded last")


def fake_fleet(monkeypatch, steps: dict | None = None, converges: dict | None = None, doors=()):
    """run_deploy and the front door replaced: each call recorded in order; upgrade.py gives `steps` (default: a
    reboot), deploy.py `converges` (default: passed); the front door records its drains (the hold: the upgrade's)."""
    calls = []

    def run_deploy(inventory, hosts, data=None, deploy_file="deploy.py", before_ops=None):
        if before_ops:
            before_ops()
        calls.append((deploy_file, list(hosts)))
        given = (steps if deploy_file == "upgrade.py" else converges) or {}
        default = [f"Platform upgrade | {op}" for op in (UPGRADE_OP, REBOOT_OP)] if deploy_file == "upgrade.py" else []
        return {h: given.get(h, HostResult(h, changed=default)) for h in hosts}

    monkeypatch.setattr(upgrade_module, "run_deploy", run_deploy)
    monkeypatch.setattr(upgrade_module.FrontDoorRuntime, "of",
                        classmethod(lambda cls, inventory: RecordingDoor(calls, "upgrade", [(d, {}) for d in doors])))
    return calls


def surveys(*todo: str, hosts=("a", "b", "c")) -> list[HostSurvey]:
    return [HostSurvey(h, [DRIVER.line()] if h in todo else [], h in todo) for h in hosts]


def test_cohorts_with_something_to_do_go_batch_by_batch_drained_upgraded_converged_and_back(monkeypatch):
    calls = fake_fleet(monkeypatch, doors=("a",))
    reports = upgrade("inv.py", surveys("a", "c"), batch="1", log=lambda m: None)
    assert calls == [("drain", ["c"]), ("upgrade.py", ["c"]), ("deploy.py", ["c"]), ("ready", ["c"]),
                     ("drain", ["a"]), ("upgrade.py", ["a"]), ("deploy.py", ["a"]), ("ready", ["a"])]
    assert [(r.host, r.result, r.rebooted) for r in reports] == [
        ("a", "upgraded", True), ("b", "unchanged", False), ("c", "upgraded", True)]


def test_a_refusal_at_the_canary_halts_and_leaves_it_drained(monkeypatch):
    logged = []
    refused = HostResult("a", failed=[f"{REFUSED_OP}: a: nvidia-driver-580-open 580.95.99-1 is refused"])
    calls = fake_fleet(monkeypatch, steps={"a": refused})
    reports = upgrade("inv.py", surveys("a", "b", "c"), batch="2", canary=True, log=logged.append)
    assert calls == [("drain", ["a"]), ("upgrade.py", ["a"]), ("ready", [])]
    assert [r.result for r in reports] == ["refused", "not reached", "not reached"]
    assert "a: nvidia-driver-580-open 580.95.99-1 is refused; left drained on its old versions" in logged
    assert reports[1].detail.startswith("halted: 1 failed > --max-fail 0")


def test_max_fail_lets_the_upgrade_go_on_past_a_failure(monkeypatch):
    calls = fake_fleet(monkeypatch, converges={"a": HostResult("a", failed=["vLLM up"])})
    reports = upgrade("inv.py", surveys("a", "b"), max_fail=1, log=lambda m: None)
    assert [r.result for r in reports] == ["failed", "upgraded", "unchanged"]
    assert ("ready", []) in calls and ("ready", ["b"]) in calls


def test_a_canary_slower_on_its_new_platform_stays_drained_and_the_upgrade_halts(monkeypatch):
    """The rollout's speed gate on the upgrade's canary: its release's kept figure against the new platform's."""
    from sparkfleet.contract.speed import Figures

    from .test_rollout import FakeGate

    calls = fake_fleet(monkeypatch)
    gate = FakeGate(calls, {("a", False): Figures(30.1, 121.0)}, kept={("a", "r1"): Figures(50.2, 119.0)})
    logged = []
    reports = upgrade("inv.py", surveys("a", "b"), speed=gate, releases={"a": "r1", "b": "r1"}, log=logged.append)
    assert calls == [("drain", ["a"]), ("upgrade.py", ["a"]), ("deploy.py", ["a"]), ("measure", "a"), ("ready", [])]
    halt = "a: decode 30.1 tok/s vs 50.2 before (-40 %), over rollout_max_regression 10 %: halted"
    assert logged[-1] == f"a: failed: speed gate: {halt}; left drained on its new versions"
    assert [(r.host, r.result) for r in reports] == [("a", "failed"), ("b", "not reached"), ("c", "unchanged")]
    assert reports[0].detail == f"speed gate: {halt}; left drained on its new versions"
    assert reports[0].speed["verdict"] == "regressed" and gate.written == {"a": {"r1": Figures(30.1, 121.0)}}


def test_an_upgrade_canary_without_a_kept_figure_is_measured_on_its_old_platform_first(monkeypatch):
    from sparkfleet.contract.speed import Figures

    from .test_rollout import FakeGate

    calls = fake_fleet(monkeypatch)
    gate = FakeGate(calls, {("a", True): Figures(50.0, 110.0), ("a", False): Figures(49.5, 112.0)})
    reports = upgrade("inv.py", surveys("a", "b"), batch="2", speed=gate, releases={"a": "r1"}, log=lambda m: None)
    assert calls[:4] == [("drain", ["a", "b"]), ("measure running", "a"), ("upgrade.py", ["a", "b"]),
                         ("deploy.py", ["a", "b"])] and ("measure", "b") not in calls  # the canary alone
    assert [r.result for r in reports[:2]] == ["upgraded", "upgraded"]
    assert reports[0].speed["verdict"] == "passed" and reports[0].speed["baseline"]["source"] == "measured now"
    assert upgrade_module.report_json(reports)["speed_gate"]["checks"] == [reports[0].speed]


def test_a_group_is_one_cohort_and_a_failed_step_on_a_member_skips_the_converge_of_all(monkeypatch):
    calls = fake_fleet(monkeypatch, steps={"c": HostResult("c", failed=[UPGRADE_OP])})
    groups = {"b": ("b", "c"), "c": ("b", "c")}
    reports = upgrade("inv.py", surveys("b", "c"), groups=groups, log=lambda m: None)
    assert calls == [("drain", ["b"]), ("upgrade.py", ["b", "c"]), ("ready", [])]
    assert [(r.host, r.result, r.group) for r in reports] == [
        ("a", "unchanged", None), ("b", "failed", "b+c"), ("c", "failed", "b+c")]


def test_nothing_to_do_drains_nothing(monkeypatch):
    calls = fake_fleet(monkeypatch)
    assert [r.result for r in upgrade("inv.py", surveys(), log=lambda m: None)] == ["unchanged"] * 3
    assert calls == []


@pytest.mark.parametrize("args", [["--batch", "0"], ["--data", "refused_drivers=nope"]])
def test_bad_input_exits_2_before_any_host(args, capsys, monkeypatch):
    from sparkfleet import cli

    monkeypatch.setattr(upgrade_module, "read_hosts", lambda *a: pytest.fail("a host was read"))
    assert cli.main(["upgrade", "inventory/office.py", *args]) == 2
    assert "sparkfleet:" in capsys.readouterr().err


def test_the_simulation_reads_the_pins_platform_pins_names_in_place_of_the_hosts_copy():
    import shlex

    from sparkfleet.host.pins import render_pins

    pins = render_pins({"nvidia-driver-580-open": "580.95.05-1"})
    with_pins, without = UpgradeSimulation().command(pins), UpgradeSimulation().command("")
    assert f"printf %s {shlex.quote(pins)} > \"$d\"/sparkfleet-platform" in with_pins
    assert "printf" not in without and 'rm -f "$d"/sparkfleet-platform' in without  # none: the old copy not read
    assert '-o Dir::Etc::PreferencesParts="$d"' in without and without.endswith("echo 'end of the simulation'")
