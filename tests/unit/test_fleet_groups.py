"""Fleet commands over tensor-parallel groups: one status row per group, one rollout cohort per group (the same
batch, rolled back together), one front door backend per group (its head)."""

from __future__ import annotations

import pytest

from sparkfleet.fleet import rollout as rollout_module
from sparkfleet.fleet import status
from sparkfleet.fleet.converge import HostResult
from sparkfleet.fleet.batches import batches, cohorts
from sparkfleet.fleet.rollout import (
    members_in_data,
    members_of,
    rollout,
    whole_groups,
)
from sparkfleet.release.group import TensorParallelGroup

from .helpers import RecordingDoor

PAIR = TensorParallelGroup(members=("spark-1", "spark-2"), addresses=("192.168.100.1", "192.168.100.2"),
                           interface="enp1s0f0np0", mtu=9000, ray_port=6379)
GROUPS = {"spark-1": ("spark-1", "spark-2"), "spark-2": ("spark-1", "spark-2")}


# --- rollout: a group is one cohort ----------------------------------------------------------------


def test_cohorts_keep_a_group_together_where_its_head_appears():
    assert cohorts(["spark-1", "spark-2", "spark-3"], GROUPS) == [("spark-1", "spark-2"), ("spark-3",)]
    assert cohorts(["spark-3", "spark-2", "spark-1"], GROUPS) == [("spark-3",), ("spark-1", "spark-2")]
    assert cohorts(["a", "b"], {}) == [("a",), ("b",)]


def test_a_partly_selected_group_is_refused():
    with pytest.raises(ValueError, match=r"spark-1: its group spark-1\+spark-2 is only partly selected \(spark-2 "
                                         r"missing\): roll out the whole group"):
        cohorts(["spark-1", "spark-3"], GROUPS)


def test_batches_count_cohorts_so_a_group_never_splits():
    found = cohorts(["spark-1", "spark-2", "spark-3", "spark-4"], GROUPS)
    assert batches(found, "1") == [[("spark-1", "spark-2")], [("spark-3",)], [("spark-4",)]]
    assert batches(found, "2") == [[("spark-1", "spark-2"), ("spark-3",)], [("spark-4",)]]
    assert batches(found, "34%") == [[("spark-1", "spark-2")], [("spark-3",)], [("spark-4",)]]
    assert batches(found, "1", canary=True) == [[("spark-1", "spark-2")], [("spark-3",)], [("spark-4",)]]


def test_a_limit_to_one_member_takes_its_whole_group():
    inventory = ["spark-1", "spark-2", "spark-3"]
    assert whole_groups(["spark-2"], inventory, GROUPS) == ["spark-1", "spark-2"]
    assert whole_groups(["spark-3"], inventory, GROUPS) == ["spark-3"]
    assert members_in_data([("spark-1", {"tensor_parallel_hosts": ["spark-1", "spark-2"]}),
                            ("spark-3", {"tensor_parallel_hosts": []})]) == {"spark-1": ("spark-1", "spark-2")}


def test_members_of_plans():
    class Plan:
        def __init__(self, name, group):
            self.name, self.group = name, group

    assert members_of([Plan("spark-1", PAIR), Plan("spark-2", PAIR), Plan("spark-3", None)]) == GROUPS


def fake_fleet(monkeypatch, results: dict, rollback_ok: bool = True):
    """run_deploy replaced (deploy.py gives `results`; rollback.py is recorded) and the front door recorded."""
    calls = []

    def run_deploy(inventory, hosts, data=None, deploy_file="deploy.py", before_ops=None):
        if before_ops:
            before_ops()
        calls.append((deploy_file, list(hosts)))
        if deploy_file == "rollback.py":
            return {h: HostResult(h, changed=["restored"], health_gate="passed") if rollback_ok else
                    HostResult(h, failed=["Release restored"]) for h in hosts}
        if deploy_file == "stage.py":
            return {h: HostResult(h, changed=["Model files verified"]) for h in hosts}
        return {h: results.get(h, HostResult(h, changed=["unit"], health_gate="passed")) for h in hosts}

    monkeypatch.setattr(rollout_module, "run_deploy", run_deploy)
    monkeypatch.setattr(rollout_module.FrontDoorRuntime, "of",
                        classmethod(lambda cls, inventory: RecordingDoor(calls, "rollout", ["spark-1"])))
    return calls


RELEASES = {"spark-1": ("r0", "r1"), "spark-2": ("r0", "r1"), "spark-3": ("s0", "s1")}


def test_a_group_changes_in_one_batch_and_the_log_names_it(monkeypatch):
    calls = fake_fleet(monkeypatch, {})
    logged = []
    reports = rollout("inv.py", ["spark-1", "spark-2", "spark-3"], RELEASES, groups=GROUPS, log=logged.append)
    assert calls == [("stage.py", ["spark-1", "spark-2", "spark-3"]),
                     ("drain", ["spark-1"]), ("deploy.py", ["spark-1", "spark-2"]), ("ready", ["spark-1"]),
                     ("drain", ["spark-3"]), ("deploy.py", ["spark-3"]), ("ready", ["spark-3"])]
    assert logged[-2:] == ["batch 1/2: spark-1+spark-2", "batch 2/2: spark-3"]
    assert [(r.host, r.result, r.group, r.batch) for r in reports] == [
        ("spark-1", "converged", "spark-1+spark-2", 1), ("spark-2", "converged", "spark-1+spark-2", 1),
        ("spark-3", "converged", None, 2)]


def test_a_failed_gate_on_the_head_rolls_every_member_back_and_halts(monkeypatch):
    calls = fake_fleet(monkeypatch, {"spark-1": HostResult("spark-1", failed=["answers"], health_gate="failed")})
    reports = rollout("inv.py", ["spark-1", "spark-2", "spark-3"], RELEASES, groups=GROUPS, log=lambda m: None)
    assert calls[1:] == [("drain", ["spark-1"]), ("deploy.py", ["spark-1", "spark-2"]),
                         ("rollback.py", ["spark-1", "spark-2"]), ("ready", ["spark-1"])]
    assert [(r.host, r.result, r.new_release) for r in reports] == [
        ("spark-1", "rolled back", "r0"), ("spark-2", "rolled back", "r0"), ("spark-3", "not reached", "s1")]
    assert reports[0].detail == "new release failed its health gate; previous release restored and healthy"
    assert reports[1].detail == ("spark-1 failed the health gate of the group spark-1+spark-2; "
                                 "previous release restored on every member")
    assert reports[2].detail == "halted: 1 failed > --max-fail 0"


def test_a_group_counts_once_against_max_fail(monkeypatch):
    fake_fleet(monkeypatch, {"spark-1": HostResult("spark-1", failed=["answers"], health_gate="failed")})
    reports = rollout("inv.py", ["spark-1", "spark-2", "spark-3"], RELEASES, groups=GROUPS, max_fail=1,
                      log=lambda m: None)
    assert [r.result for r in reports] == ["rolled back", "rolled back", "converged"]


def test_a_group_whose_rollback_fails_stays_out_of_the_front_door(monkeypatch):
    calls = fake_fleet(monkeypatch, {"spark-1": HostResult("spark-1", failed=["answers"], health_gate="failed")},
                       rollback_ok=False)
    reports = rollout("inv.py", ["spark-1", "spark-2"], RELEASES, groups=GROUPS, log=lambda m: None)
    assert calls[-1] == ("ready", [])
    assert [r.result for r in reports] == ["failed", "failed"]
    assert reports[1].detail == "health gate failed (spark-1) and rollback failed too: ['Release restored']"


def test_a_failure_other_than_the_gate_rolls_nothing_back(monkeypatch):
    calls = fake_fleet(monkeypatch, {"spark-2": HostResult("spark-2", failed=["Model shards verified"])})
    reports = rollout("inv.py", ["spark-1", "spark-2"], RELEASES, groups=GROUPS, log=lambda m: None)
    assert not any(name == "rollback.py" for name, _ in calls)
    assert [r.result for r in reports] == ["converged", "failed"]


# --- status: one row per group ---------------------------------------------------------------------


def facts(ray_active=True, verified=True, unit_active=False, ray=None) -> dict:
    found = {"driver": "580.95.05", "cuda": "13.0", "toolkit": "1.18.1-1", "release_id": "abc123",
             "model_verified": verified, "unit_active": unit_active, "watchdog": None, "services": {},
             "ray_active": ray_active}
    return {**found, "ray": ray} if ray is not None else found


RAY_OK = {"alive_nodes": 2, "gpus": [1, 1], "addresses": ["192.168.100.1", "192.168.100.2"]}


def head_row(healthy=True, error=None) -> dict:
    return {"host": "spark-1", "url": "http://127.0.0.1:8001", "healthy": healthy, "served": ["Q"],
            "metrics": {}, "error": error, "ssh": facts(unit_active=True, ray=RAY_OK)}


@pytest.mark.parametrize(("check", "expected"), [
    (RAY_OK, []),
    ({"alive_nodes": 1, "gpus": [1], "addresses": ["192.168.100.1"]},
     ["Ray sees 1 of 2 nodes: spark-2 (192.168.100.2) not in it"]),
    ({"alive_nodes": 2, "gpus": [1, 0], "addresses": ["192.168.100.1", "192.168.100.2"]},
     ["Ray nodes without a GPU: 192.168.100.2"]),
    ({"alive_nodes": 2, "gpus": [1, 1], "addresses": ["192.168.100.1", "10.0.0.2"]},
     ["Ray sees 2 of 2 nodes: spark-2 (192.168.100.2) not in it"]),
    (None, ["Ray check on spark-1 gave no answer"]),
    ({"alive_nodes": "2", "gpus": [1, 1], "addresses": []}, ["Ray check on spark-1 gave an unreadable answer"]),
])
def test_ray_problems(check, expected):
    assert status.ray_problems(PAIR, check) == expected


def test_a_serving_group_is_one_healthy_row_with_its_members():
    row = status.group_row(PAIR, head_row(), {"spark-1": facts(unit_active=True, ray=RAY_OK),
                                              "spark-2": facts()})
    assert (row["host"], row["group"], row["healthy"], row["error"]) == ("spark-1+spark-2", "spark-1+spark-2",
                                                                         True, None)
    assert [(m["host"], m["role"], m["address"]) for m in row["members"]] == [
        ("spark-1", "head", "192.168.100.1"), ("spark-2", "worker", "192.168.100.2")]
    assert (row["ssh"]["unit_active"], row["ssh"]["model_verified"], row["ssh"]["release_id"]) == (
        True, True, "abc123")


def test_ray_stopped_on_the_worker_makes_the_group_unhealthy():
    lost = {"alive_nodes": 1, "gpus": [1], "addresses": ["192.168.100.1"]}
    row = status.group_row(PAIR, head_row(), {"spark-1": facts(unit_active=True, ray=lost),
                                              "spark-2": facts(ray_active=False)})
    assert row["healthy"] is False
    assert row["error"] == ("sparkfleet-ray.service inactive on spark-2; "
                            "Ray sees 1 of 2 nodes: spark-2 (192.168.100.2) not in it")
    assert row["ssh"]["unit_active"] is False


def test_an_unreachable_worker_and_a_head_that_does_not_serve():
    row = status.group_row(PAIR, head_row(healthy=False, error="ConnectionError: refused"),
                           {"spark-1": facts(unit_active=True, ray=RAY_OK), "spark-2": None})
    assert row["healthy"] is False
    assert row["error"] == "spark-2 unreachable over SSH; spark-1: ConnectionError: refused"
    assert row["ssh"]["model_verified"] is None
    unverified = status.group_row(PAIR, head_row(), {"spark-1": facts(unit_active=True, ray=RAY_OK),
                                                     "spark-2": facts(verified=False)})
    assert (unverified["healthy"], unverified["ssh"]["model_verified"]) == (True, False)


def test_status_rows_one_per_group_in_inventory_order():
    asked = []

    def row_of(name):
        asked.append(name)
        return head_row() if name == "spark-1" else {**head_row(), "host": name, "ssh": facts()}

    found = {"spark-1": facts(unit_active=True, ray=RAY_OK), "spark-2": facts(), "spark-3": facts()}
    rows = status.fleet_rows(["spark-3", "spark-1", "spark-2"], {"spark-1": PAIR, "spark-2": PAIR}, found, row_of)
    assert [(r["host"], [m["host"] for m in r.get("members", [])]) for r in rows] == [
        ("spark-3", []), ("spark-1+spark-2", ["spark-1", "spark-2"])]
    assert asked == ["spark-3", "spark-1"]  # a worker's API is never asked: it has none


# --- front door: one backend per group -------------------------------------------------------------


def test_the_front_door_has_one_backend_per_group_its_head():
    from sparkfleet.roles.front_door import plan as fd_plan
    from sparkfleet.release.plan import plan_hosts

    from .helpers import KEY, host_data

    base = {"api_host": "0.0.0.0", "api_key": KEY, "front_door_users": {"alice": "alice-key-0123456789abcdef"},
            "front_door_allow_http": True}
    pair = {**base, "tensor_parallel_hosts": ["spark-1", "spark-2"], "tensor_parallel_size": 2}
    hosts = [("spark-1", host_data(**pair, lan_address="10.0.0.1", fabric_address="192.168.100.1")),
             ("spark-2", host_data(**pair, lan_address="10.0.0.2", fabric_address="192.168.100.2")),
             ("spark-3", host_data(**base, lan_address="10.0.0.3"))]
    plans = {p.name: p for p in plan_hosts(hosts, resolve=False)}
    door = fd_plan.front_door_plan("spark-3", plans)
    assert door.backends == (fd_plan.Backend("spark-1", "10.0.0.1", 8000), fd_plan.Backend("spark-3", "10.0.0.3", 8000))
    assert "server spark-2 " not in door.config() and "server spark-1 10.0.0.1:8000" in door.config()


def test_the_table_names_each_member_with_its_role():
    row = status.group_row(PAIR, head_row(), {"spark-1": facts(unit_active=True, ray=RAY_OK), "spark-2": facts()})
    assert status.host_cell(row) == "spark-1+spark-2 (head spark-1, worker spark-2)"
    assert status.host_cell(head_row()) == "spark-1"


# --- rollback of a group member: its units put back by the kept release's role ---------------------


@pytest.fixture
def host_dirs(tmp_path, monkeypatch):
    """The unit paths and the kept release's directory under tmp_path, and a `systemctl` that logs its calls."""
    from sparkfleet.contract import paths

    units, kept, bin_dir = tmp_path / "systemd", tmp_path / "previous", tmp_path / "bin"
    for d in (units, kept, bin_dir):
        d.mkdir()
    monkeypatch.setattr(paths, "SYSTEMD_DIR", str(units))
    monkeypatch.setattr(paths, "UNIT_PATH", str(units / paths.UNIT_NAME))
    monkeypatch.setattr(paths, "RAY_UNIT_PATH", str(units / paths.RAY_UNIT_NAME))
    monkeypatch.setattr(paths, "PREVIOUS_DIR", str(kept))
    (bin_dir / "systemctl").write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/systemctl.log\n')
    (bin_dir / "systemctl").chmod(0o755)
    return units, kept, tmp_path


def restore(role: str, tmp_path) -> list[str]:
    import os
    import subprocess

    from sparkfleet.host.operations import units_restored

    for command in units_restored(role, "spark-2"):
        subprocess.run(["sh", "-c", command], check=True, env={**os.environ, "PATH": f"{tmp_path}/bin:/usr/bin:/bin"})
    log = tmp_path / "systemctl.log"
    return log.read_text().splitlines() if log.exists() else []


def test_a_worker_gets_its_kept_ray_unit_back_and_a_second_rollback_returns(host_dirs):
    units, kept, tmp_path = host_dirs
    (units / "sparkfleet-ray.service").write_text("new ray\n")
    (kept / "sparkfleet-ray.service").write_text("old ray\n")
    assert restore("worker", tmp_path) == ["daemon-reload", "enable sparkfleet-ray.service",
                                           "reset-failed sparkfleet-ray.service", "restart sparkfleet-ray.service"]
    assert (units / "sparkfleet-ray.service").read_text() == "old ray\n"
    assert (kept / "sparkfleet-ray.service").read_text() == "new ray\n"
    assert not (units / "sparkfleet-vllm.service").exists()
    restore("worker", tmp_path)
    assert (units / "sparkfleet-ray.service").read_text() == "new ray\n"


def test_a_head_restarts_ray_before_its_engine(host_dirs):
    units, kept, tmp_path = host_dirs
    for name in ("sparkfleet-ray.service", "sparkfleet-vllm.service"):
        (units / name).write_text(f"new {name}\n")
        (kept / name).write_text(f"old {name}\n")
    assert restore("head", tmp_path) == ["daemon-reload", "enable sparkfleet-ray.service",
                                         "reset-failed sparkfleet-ray.service", "restart sparkfleet-ray.service",
                                         "enable sparkfleet-vllm.service", "reset-failed sparkfleet-vllm.service",
                                         "restart sparkfleet-vllm.service"]
    assert (units / "sparkfleet-vllm.service").read_text() == "old sparkfleet-vllm.service\n"


def test_a_host_back_to_single_sets_its_ray_unit_aside(host_dirs):
    """A host that had joined a group, rolled back to its single release: Ray stopped and kept for a re-run."""
    units, kept, tmp_path = host_dirs
    (units / "sparkfleet-ray.service").write_text("ray\n")
    (units / "sparkfleet-vllm.service").write_text("tp engine\n")
    (kept / "sparkfleet-vllm.service").write_text("single engine\n")
    assert restore("single", tmp_path) == ["disable --now sparkfleet-ray.service", "daemon-reload",
                                           "enable sparkfleet-vllm.service", "reset-failed sparkfleet-vllm.service",
                                           "restart sparkfleet-vllm.service"]
    assert not (units / "sparkfleet-ray.service").exists()
    assert (kept / "sparkfleet-ray.service").read_text() == "ray\n"
    assert (units / "sparkfleet-vllm.service").read_text() == "single engine\n"


def test_a_record_naming_its_units_gets_its_services_back_restarting_only_what_changed(host_dirs, monkeypatch):
    """The kept release's every unit swaps back (the chat's, each service's); a service the newer release added is
    set aside; only a unit whose file changed back restarts, unless the engine env changed (then every one)."""
    from sparkfleet.contract import paths
    from sparkfleet.host.operations import release_units_restored

    units, kept, tmp_path = host_dirs
    env = tmp_path / "engine.env"
    monkeypatch.setattr(paths, "ENGINE_ENV", str(env))
    # the host module's env-restore, standing in: rewrites the env file when the test says the names differ
    (tmp_path / "bin" / "python3").write_text(f'#!/bin/sh\n[ ! -e {tmp_path}/env-differs ] || echo B=1 >> {env}\n')
    (tmp_path / "bin" / "python3").chmod(0o755)
    for name, live, previous in (("sparkfleet-vllm.service", "chat", "chat"), ("sparkfleet-vllm-embed.service",
                                                                           "embed 2048", "embed 8192"),
                                 ("sparkfleet-vllm-rerank.service", "rerank", "rerank"),
                                 ("sparkfleet-vllm-extra.service", "extra", None)):
        (units / name).write_text(live)
        if previous:
            (kept / name).write_text(previous)
    restored = ["sparkfleet-vllm.service", "sparkfleet-vllm-embed.service", "sparkfleet-vllm-rerank.service"]

    def roll_back() -> list[str]:
        import os
        import subprocess

        env.write_text("A=1\n")
        (tmp_path / "systemctl.log").unlink(missing_ok=True)
        live = sorted(p.name for p in units.iterdir())
        for command in release_units_restored(restored, live, "spark-1"):
            subprocess.run(["sh", "-c", command], check=True, env={**os.environ, "PATH": f"{tmp_path}/bin:/usr/bin:/bin"})
        return [line for line in (tmp_path / "systemctl.log").read_text().splitlines() if line.startswith(
            ("restart", "disable"))]

    assert roll_back() == ["disable --now sparkfleet-vllm-extra.service", "restart sparkfleet-vllm-embed.service"]
    assert {p.name: p.read_text() for p in units.iterdir()} == {
        "sparkfleet-vllm.service": "chat", "sparkfleet-vllm-embed.service": "embed 8192",
        "sparkfleet-vllm-rerank.service": "rerank"}
    assert (kept / "sparkfleet-vllm-embed.service").read_text() == "embed 2048"  # a second rollback returns
    assert (kept / "sparkfleet-vllm-extra.service").read_text() == "extra"
    (tmp_path / "env-differs").touch()
    assert roll_back() == [f"restart {unit}" for unit in restored]


def test_a_kept_record_of_an_unknown_role_or_group_is_refused():
    from sparkfleet.tasks.rollback import ray_members, role_problem

    source = "/etc/sparkfleet/previous/release.json"
    worker = {"role": "worker", "group": {**PAIR.to_dict()}}
    assert role_problem(worker, source, "spark-2") is None
    assert role_problem({}, source, "spark-3") is None
    assert role_problem({"role": "rm -rf /"}, source, "spark-2").line("spark-2") == (
        "spark-2: /etc/sparkfleet/previous/release.json: role 'rm -rf /' is not one of single, head, worker: fix or "
        "remove it by hand; sparkfleet changes nothing on doubt")
    assert role_problem(worker, source, "spark-9").problem == (
        "the worker's `group` is not a group of spark-9 (members, addresses, ray_port)")
    assert role_problem({"role": "head", "group": {**PAIR.to_dict(), "ray_port": "6379"}}, source, "spark-1")
    assert ray_members(worker, "spark-2") == ("192.168.100.1:6379", "192.168.100.2", {"spark-2": "192.168.100.2"})
    assert ray_members({**worker, "role": "head"}, "spark-1") == (
        "192.168.100.1:6379", "192.168.100.1", {"spark-1": "192.168.100.1", "spark-2": "192.168.100.2"})


def test_a_kept_unit_that_is_missing_stops_the_rollback(host_dirs):
    import subprocess

    from sparkfleet.host.operations import units_restored

    units, kept, _ = host_dirs
    (units / "sparkfleet-ray.service").write_text("new ray\n")
    [ray, _, *_] = units_restored("worker", "spark-2")
    done = subprocess.run(["sh", "-c", ray], capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert done.stderr == f"spark-2: {kept}/sparkfleet-ray.service is missing: nothing to roll back to; roll forward instead\n"
    assert (units / "sparkfleet-ray.service").read_text() == "new ray\n"
