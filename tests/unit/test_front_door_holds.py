"""Holds on a front door (issue 22): a rollout's drain carries who made it and when, its batch end drops it, and a
hold whose operation is gone is put back; the record's lines as data, the staleness rule, `status`'s exit rule.
The shell commands run here against a stand-in socat (test_drain's door_dir)."""

from __future__ import annotations

from tests.unit.helpers import NoAddress

import json
import os
import stat
import subprocess
import sys

import pytest

from sparkfleet import cli
from sparkfleet.fleet.front_door import commands as fd_commands, runtime as fd_runtime
from sparkfleet.roles.front_door import records as fd_records
from sparkfleet.roles.front_door import holds as fd_holds
from sparkfleet.fleet import rollout as rollout_module
from sparkfleet.fleet.converge import HostResult

from . import test_drain
from .test_drain import Local, sent, sh

door_dir = test_drain.door_dir  # the front door's files under tmp_path, a stand-in socat on PATH

NOW = 1_800_000_000


def hold(backend="spark-2", controller="ctl", pid=4242, started=777, since=NOW - 60, operation="rollout"):
    return fd_holds.Hold(backend, operation, controller, pid, started, since)


def test_a_hold_reads_back_and_hostile_lines_are_data_never_holds(tmp_path):
    marker = tmp_path / "ran"
    record = "\n".join([
        hold().line(),
        f"spark-3 rollout ctl 1 2 3; touch {marker}",  # more after the fields
        f"$(touch {marker}) rollout ctl 1 2 3",  # not a server name
        "spark-4 deploy ctl 1 2 3",  # not an operation that holds
        "spark-5 rollout ctl -1 2 3",  # not a pid
        "spark-6 rollout c\x1bl 1 2 3",  # a control character
        "spark-7 rollout ctl 1 2",  # a field short
        "", "# a note",
        hold("spark-8", since=NOW - 10).line(), hold("spark-8", since=NOW).line(),  # the later line counts
    ])
    holds = fd_holds.parse_holds(record)
    assert holds == {"spark-2": hold(), "spark-8": hold("spark-8", since=NOW)}
    assert not marker.exists()
    assert holds["spark-2"].holder() == {"operation": "rollout", "controller": "ctl", "pid": 4242,
                                         "since": "2027-01-15T07:59:00Z"}
    with pytest.raises(ValueError, match="not a hold"):
        hold(controller="two words").line()  # never written: it would not read back


def test_a_hold_is_stale_when_its_process_is_gone_or_another_controllers_is_too_old():
    alive = {4242: 777}.get  # pid -> start time; a pid not in it runs no more
    assert not fd_holds.stale(hold(), "ctl", NOW, alive)
    assert fd_holds.stale(hold(pid=99), "ctl", NOW, alive)  # the rollout's process is gone
    assert fd_holds.stale(hold(started=5), "ctl", NOW, alive)  # its pid now runs another process
    assert not fd_holds.stale(hold(), "ctl", NOW, lambda pid: 0)  # a start time /proc cannot tell: running counts
    assert not fd_holds.stale(hold(started=0), "ctl", NOW, alive)
    never = {}.get  # another controller's pid is never asked here
    assert not fd_holds.stale(hold(controller="other", pid=99), "ctl", NOW, never)
    old = hold(controller="other", since=NOW - fd_holds.HOLD_MAX_AGE_S - 1)
    assert fd_holds.stale(old, "ctl", NOW, never)
    assert not fd_holds.stale(hold(controller="other", since=NOW - fd_holds.HOLD_MAX_AGE_S), "ctl", NOW, never)
    record = "\n".join([hold().line(), hold("spark-3", pid=99).line(), "spark-1 rollout ctl 99 0 0; reboot"])
    assert fd_holds.stale_holds(record, "ctl", NOW, alive) == [hold("spark-3", pid=99)]
    assert fd_holds.stale_holds(None, "ctl", NOW, alive) == []


def test_this_process_holds_with_its_own_start_time_and_a_finished_one_runs_no_more():
    mine = fd_holds.this_hold("spark-2", "rollout")
    assert fd_holds.parse_holds(mine.line()) == {"spark-2": mine}
    assert mine.pid == os.getpid() and mine.controller == fd_holds.controller_name()
    assert not fd_holds.stale(mine, fd_holds.controller_name(), NOW)
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    assert fd_holds.process_start(int(done.stdout)) is None
    assert fd_holds.stale(fd_holds.Hold("spark-2", "rollout", fd_holds.controller_name(), int(done.stdout), 1, NOW), fd_holds.controller_name(),
                    NOW)


def test_a_rollouts_drain_holds_first_and_its_batch_end_drops_only_its_hosts(door_dir):
    Local().drain(["spark-2", "spark-22"], lambda m: None, operation="rollout")
    record = door_dir / "held"
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    assert set(fd_holds.parse_holds(record.read_text())) == {"spark-2", "spark-22"}
    assert sent(door_dir)[0] == "set server engines/spark-2 state drain; set server engines/spark-22 state drain"
    Local().drain(["spark-2"], lambda m: None, operation="rollout")  # held again: one line, not two
    assert [line.split()[0] for line in record.read_text().splitlines()] == ["spark-22", "spark-2"]
    log = []
    Local().ready(["spark-2"], log.append)
    assert fd_holds.parse_holds(record.read_text()).keys() == {"spark-22"}  # a whole name: spark-22 stays held
    assert sent(door_dir)[-1] == "set server engines/spark-2 state ready" and log == ["front door: spark-2 back in"]
    assert not (door_dir / "held.new").exists()


def test_a_maintenance_drain_holds_no_operation(door_dir):
    Local().drain(["spark-2"], lambda m: None)
    assert not (door_dir / "held").exists()


def test_put_back_readies_only_what_the_door_still_holds_so_and_keeps_a_maintenance_drain(door_dir):
    gone, newer, kept = hold("spark-2", pid=99), hold("spark-3", pid=4242), hold("spark-4", pid=99)
    (door_dir / "held").write_text("\n".join([gone.line(), newer.line(), kept.line()]) + "\n")
    (door_dir / "drained").write_text("spark-4\n")
    out = sh(fd_records.put_back_command([gone, hold("spark-3", pid=99), kept]))  # spark-3: a newer hold since read
    assert out == "kept spark-4\n"
    assert sent(door_dir) == ["set server engines/spark-2 state ready"]
    assert fd_holds.parse_holds((door_dir / "held").read_text()) == {"spark-3": newer}  # spark-4: the record holds it
    before = (door_dir / "held").read_text()
    sh(fd_records.put_back_command([hold("spark-9", pid=99)]))  # held nowhere: nothing sent, nothing rewritten
    assert sent(door_dir) == ["set server engines/spark-2 state ready"] and (door_dir / "held").read_text() == before


def test_put_back_stale_sends_nothing_when_every_hold_is_live(door_dir, monkeypatch):
    monkeypatch.setattr(fd_runtime, "controller_name", lambda: "ctl")
    monkeypatch.setattr(fd_holds, "process_start", {4242: 777}.get)
    table = "# pxname,svname,scur,status\nengines,spark-2,0,MAINT\nengines,spark-3,0,MAINT\n"

    class Door(Local):
        def _shell(self, command):
            if "show stat" in command:
                return {"spark-1": f"{fd_runtime._HOLDS_MARK}\n{(door_dir / 'held').read_text()}{fd_runtime._STAT_MARK}\n{table}"}
            return super()._shell(command)

    (door_dir / "held").write_text(hold("spark-2").line() + "\n")
    assert Door().put_back_stale(lambda m: None) == [] and sent(door_dir) == []
    (door_dir / "held").write_text(hold("spark-2").line() + "\n" + hold("spark-3", pid=99).line() + "\n")
    log = []
    assert Door().put_back_stale(log.append) == ["spark-3"]
    assert sent(door_dir) == ["set server engines/spark-3 state ready"]
    assert log[0] == "front door: spark-3 held by an operation that is gone: putting back"


def test_a_rollout_puts_back_what_is_stale_first_then_holds_each_batch(monkeypatch):
    calls = []

    class Door(NoAddress):
        doors = ["door"]

        def put_back_stale(self, log):
            calls.append("put back stale")

        def drain(self, hosts, log, operation=None):
            calls.append(("drain", tuple(hosts), operation))

        def ready(self, hosts, log):
            calls.append(("ready", tuple(hosts)))

    monkeypatch.setattr(rollout_module.FrontDoorRuntime, "of", classmethod(lambda cls, inv: Door()))

    def run_deploy(inventory, hosts, data=None, deploy_file="deploy.py", before_ops=None):
        calls.append((deploy_file, tuple(hosts)))
        if before_ops:
            before_ops()
        return {h: HostResult(h, changed=["unit"]) for h in hosts}

    monkeypatch.setattr(rollout_module, "run_deploy", run_deploy)
    rollout_module.rollout("inv.py", ["a", "b"], {"a": ("o", "n"), "b": ("o", "n")}, log=lambda m: None)
    assert calls == ["put back stale", ("stage.py", ("a", "b")),
                     ("deploy.py", ("a",)), ("drain", ("a",), "rollout"), ("ready", ("a",)),
                     ("deploy.py", ("b",)), ("drain", ("b",), "rollout"), ("ready", ("b",))]


STATES = {
    "spark-1": {"state": "in", "hold": None},
    "spark-2": {"state": "drained", "hold": None},
    "spark-3": {"state": "out", "hold": hold("spark-3")},
    "spark-4": {"state": "out", "hold": hold("spark-4", pid=99)},
    "spark-5": {"state": "draining", "hold": None},
    "spark-6": {"state": "draining", "recorded": True, "hold": None},  # `sparkfleet drain` on its way
}


def test_the_states_answer_carries_each_backends_record_and_hold():
    table = "# pxname,svname,scur,status\nengines,spark-2,2,DRAIN\nengines,spark-3,0,MAINT\nengines,spark-4,0,UP\n"
    answer = f"spark-2\n{fd_runtime._HOLDS_MARK}\n{hold('spark-3').line()}\nspark-4 rollout $(reboot)\n{fd_runtime._STAT_MARK}\n{table}"
    states = fd_runtime.door_states(answer)
    assert {n: (r["state"], r["recorded"], r["hold"]) for n, r in states.items()} == {
        "spark-2": ("draining", True, None), "spark-3": ("out", False, hold("spark-3")),
        "spark-4": ("in", False, None)}


def test_status_names_each_backend_out_of_rotation_with_what_holds_it():
    found = fd_holds.out_of_rotation(STATES, "ctl", NOW, {4242: 777}.get)
    assert [(b["host"], b["held"], b["reason"]) for b in found] == [
        ("spark-2", True, "maintenance drain: until `sparkfleet undrain`"),
        ("spark-3", True, "held by rollout pid 4242 on controller ctl since 2027-01-15T07:59:00Z"),
        ("spark-4", False, "held by a rollout that is gone (rollout pid 99 on controller ctl since "
                           "2027-01-15T07:59:00Z)"),
        ("spark-5", False, "out with no record: nothing holds it"),
        ("spark-6", True, "maintenance drain: until `sparkfleet undrain`")]
    assert found[1]["holder"] == hold("spark-3").holder() and found[0]["holder"] is None


def test_status_fails_for_a_backend_out_that_nothing_live_holds():
    held = fd_holds.out_of_rotation({k: STATES[k] for k in ("spark-1", "spark-2", "spark-3")}, "ctl", NOW, {4242: 777}.get)
    assert fd_holds.door_ok({"up": True, "out_of_rotation": held})
    assert not fd_holds.door_ok({"up": False, "out_of_rotation": held})
    for name in ("spark-4", "spark-5"):
        assert not fd_holds.door_ok({"up": True, "out_of_rotation": fd_holds.out_of_rotation(
            {name: STATES[name]}, "ctl", NOW, {4242: 777}.get)})


def test_the_status_command_exits_1_and_says_why_for_a_gone_rollouts_hold(monkeypatch, capsys, tmp_path):
    from .test_status import SERVING, facts, fake_fleet

    inventory = tmp_path / "office.py"
    inventory.write_text("sparks = [('spark-1', {'ssh_hostname': '10.0.0.1'})]\n")
    fake_fleet(monkeypatch, {"spark-1": facts(SERVING)})
    out = fd_holds.out_of_rotation({"spark-1": STATES["spark-4"]}, "ctl", NOW, {}.get)
    door = {"url": "http://x:8080", "up": True, "doors": [{"host": "spark-1", "url": "http://x:8080", "up": True}],
            "backends": [{"host": "spark-1", "state": "out"}], "out_of_rotation": out}
    monkeypatch.setattr(fd_commands, "front_door_status", lambda inv: door)
    assert cli.main(["status", str(inventory), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["front_door"]["out_of_rotation"][0]["reason"].startswith(
        "held by a rollout that is gone")
    rows = fd_commands.status_rows(door)
    assert rows[1] == ("  spark-1", "backend", "[yellow]out[/]: [red]held by a rollout that is gone (rollout pid 99 "
                                                "on controller ctl since 2027-01-15T07:59:00Z)[/]")
