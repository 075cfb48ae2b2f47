"""`sparkfleet drain` / `undrain`: the drain record on a front door, the shell commands that keep it (run here
against a stand-in socat, and against Debian's HAProxy on loopback), ready() leaving drained hosts out, the
commands drain and undrain send, and the refusals that touch nothing."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from sparkfleet import cli
from sparkfleet.contract import paths
from sparkfleet.fleet.front_door import commands as fd_commands, runtime as fd_runtime
from sparkfleet.roles.front_door import records as fd_records
from sparkfleet.roles.front_door import plan as fd_plan
from sparkfleet.roles import guard, haproxy

from .helpers import ROOT, wait_for
from .test_front_door import plans


@pytest.fixture
def door_dir(tmp_path, monkeypatch):
    """The front door's record, state file and socket moved under tmp_path, and a `socat` on PATH that writes
    the line it is given to socat.log (where a socket answers, `live_socat` replaces it)."""
    monkeypatch.setattr(paths, "FRONT_DOOR_DRAINED", str(tmp_path / "drained"))
    monkeypatch.setattr(paths, "FRONT_DOOR_HOLDS", str(tmp_path / "held"))
    monkeypatch.setattr(paths, "FRONT_DOOR_STATE_FILE", str(tmp_path / "servers.state"))
    monkeypatch.setattr(paths, "FRONT_DOOR_CONFIG", str(tmp_path / "haproxy.cfg"))  # where start_haproxy writes it
    monkeypatch.setattr(paths, "SERVERS_SAVE", str(ROOT / "files" / "sparkfleet-servers-save"))
    monkeypatch.setattr(paths, "FRONT_DOOR_SOCKET", str(tmp_path / "admin.sock"))
    monkeypatch.setattr(fd_records, "_SOCAT", f"socat -t 5 stdio UNIX-CONNECT:{tmp_path / 'admin.sock'}")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    socat = bin_dir / "socat"
    socat.write_text(f"#!/bin/sh\ncat >> {tmp_path}/socat.log\n")
    socat.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return tmp_path


def sh(command: str) -> str:
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=20, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def sent(tmp) -> list[str]:
    log = tmp / "socat.log"
    return log.read_text().splitlines() if log.exists() else []


def test_drained_names_are_server_names_one_a_line():
    assert fd_records.drained_names("spark-2\n\n# a note\nnot a name\n  spark-3 \n") == {"spark-2", "spark-3"}
    assert fd_records.drained_names("") == set()


def test_the_record_is_edited_whole_and_root_only(door_dir):
    record = door_dir / "drained"
    for host, drained in (("spark-2", True), ("spark-22", True), ("spark-2", True), ("spark-3", True)):
        sh(fd_records.record_command(host, drained))
    assert record.read_text() == "spark-22\nspark-2\nspark-3\n"  # a second drain does not repeat the name
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    sh(fd_records.record_command("spark-2", drained=False))
    assert record.read_text() == "spark-22\nspark-3\n"  # a whole line: spark-22 stays
    sh(fd_records.record_command("spark-9", drained=False))  # not drained: the record is unchanged
    assert fd_records.drained_names(record.read_text()) == {"spark-22", "spark-3"}
    assert not (door_dir / "drained.new").exists()


STAT = """# pxname,svname,qcur,qmax,scur,smax,status,weight
engines,spark-1,0,0,0,1,UP,1
engines,spark-2,0,0,0,1,MAINT,1
engines,spark-3,0,0,0,1,MAINT,1
engines,spark-4,0,0,3,3,DRAIN,1
engines,spark-5,0,0,0,1,UP,1
"""


def test_a_recorded_backend_out_of_rotation_is_drained_and_a_rollouts_maint_is_out():
    states = fd_runtime.door_states(f"spark-2\nspark-4\nspark-5\n{fd_runtime._STAT_MARK}\n{STAT}")
    assert {name: row["state"] for name, row in states.items()} == {
        "spark-1": "in", "spark-2": "drained", "spark-3": "out", "spark-4": "draining", "spark-5": "in"}
    assert fd_runtime.door_states(f"{fd_runtime._STAT_MARK}\n{STAT}")["spark-2"]["state"] == "out"  # no record


def test_status_shows_drained_apart_from_out_and_down():
    rows = fd_commands.status_rows({"doors": [{"host": "spark-1", "url": "http://x:8080", "up": True}],
                           "backends": [{"host": "spark-2", "state": "drained"}, {"host": "spark-3", "state": "out"}]})
    assert rows[1:] == [("  spark-2", "backend", "[cyan]drained[/]"), ("  spark-3", "backend", "[yellow]out[/]")]


class Local(fd_runtime.FrontDoorRuntime):
    """Front doors whose commands run here (one local shell stands for each door)."""

    def __init__(self, doors=("spark-1",)):
        super().__init__("inventory.py", [])
        self.doors = [(d, {}) for d in doors]
        self.commands: list[str] = []

    def _shell(self, command):
        self.commands.append(command)
        return {door: sh(command) for door, _ in self.doors}


def test_ready_leaves_a_drained_host_out(door_dir):
    (door_dir / "drained").write_text("spark-2\n")
    log = []
    Local().ready(["spark-1", "spark-2", "spark-3"], log.append)
    assert sent(door_dir) == ["set server engines/spark-1 state ready; set server engines/spark-3 state ready"]
    assert log == ["front door: spark-2 kept out: drained until `sparkfleet undrain`",
                   "front door: spark-1, spark-3 back in"]


def test_ready_sends_nothing_when_every_host_is_drained_and_everything_without_a_record(door_dir):
    (door_dir / "drained").write_text("spark-2\n")
    Local().ready(["spark-2"], lambda m: None)
    assert sent(door_dir) == []
    (door_dir / "drained").unlink()
    Local().ready(["spark-2"], lambda m: None)
    assert sent(door_dir) == ["set server engines/spark-2 state ready"]


def test_the_replay_puts_every_recorded_name_into_maintenance_in_one_line(door_dir):
    sh(fd_records.replay_command())  # no record: nothing sent
    assert sent(door_dir) == []
    (door_dir / "drained").write_text("spark-2\nspark-3\n")
    sh(fd_records.replay_command())
    assert sent(door_dir) == ["set server engines/spark-2 state maint;set server engines/spark-3 state maint"]


def test_the_front_door_unit_saves_state_before_a_reload_and_replays_the_record_after_a_start(tmp_path):
    unit = fd_plan.front_door_plan("spark-a", plans(**{"spark-a": {}})).unit()
    assert f"ExecStartPost=-/bin/sh -c '{fd_records.replay_command()}'\n" in unit
    assert f"ExecReload=-{fd_records.save_state_command()}\n" in unit
    assert f"ExecStartPre=-{fd_records.save_state_command()}\n" in unit  # a file saved before meets the config
    assert unit.index("ExecReload=/usr/sbin/haproxy -c") < unit.index(f"ExecReload=-{paths.SERVERS_SAVE}") < unit.index(
        "ExecReload=/bin/kill -USR2")  # checked, then saved, then reloaded
    if shutil.which("systemd-analyze"):  # systemd itself parses both lines, quotes and all
        (tmp_path / "sparkfleet-front-door.service").write_text(unit)
        checked = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "sparkfleet-front-door.service")],
                                 capture_output=True, text=True, timeout=60, check=False)
        lines = [n for n, line in enumerate(unit.splitlines(), 1) if line.startswith(("ExecStartPost", "ExecReload"))]
        assert not [n for n in lines if f":{n}:" in checked.stderr], checked.stderr
    guard_unit = guard.guard_plan(plans(**{"spark-a": {}})["spark-a"]).unit()
    assert "ExecStartPost" not in guard_unit and paths.SERVERS_SAVE not in guard_unit  # the guard has no drain


def test_a_unit_command_systemd_would_rewrite_is_refused():
    for line in ("echo $HOME", "echo 100%", "echo 'x'", "echo a\\b"):
        with pytest.raises(ValueError, match="systemd"):
            haproxy.unit("x", "/c", "r", fd_plan.LIMITS, replay=line)


# --- drain_host / undrain_host: what they send, and what they refuse before sending anything --------------


@pytest.fixture
def inventory(tmp_path):
    path = tmp_path / "inventory.py"
    path.write_text('sparks = [("spark-1", {"ssh_hostname": "10.0.0.1"}), ("spark-2", {"ssh_hostname": "10.0.0.2"}),'
                    ' ("spark-3", {"ssh_hostname": "10.0.0.3"})]\nfront_door = [sparks[0]]\n')
    (tmp_path / "no_door.py").write_text('sparks = [("spark-1", {"ssh_hostname": "10.0.0.1"})]\n')
    return str(path)


class Recorded:
    """A fake `_shell` for FrontDoorRuntime: every command in order; `show stat` answered with a record and
    a table where spark-2 is in maintenance once `state maint` was sent."""

    def __init__(self, answers: bool = True):
        self.commands: list[str] = []
        self.answers = answers

    def __call__(self, runtime, command):
        self.commands.append(command)
        if not self.answers:
            return {door: None for door, _ in runtime.doors}
        maint = any("spark-2 state maint" in c for c in self.commands)
        ready = any("spark-2 state ready" in c for c in self.commands)
        status = "MAINT" if maint and not ready else "UP"
        record = "spark-2\n" if maint and not ready else ""
        table = f"# pxname,svname,scur,status\nengines,spark-1,0,UP\nengines,spark-2,0,{status}\n"
        return {door: f"{record}{fd_runtime._STAT_MARK}\n{table}" if "show stat" in command else ""
                for door, _ in runtime.doors}


def test_drain_records_first_then_drains_then_saves_the_state(inventory, monkeypatch):
    shell = Recorded()
    monkeypatch.setattr(fd_runtime.FrontDoorRuntime, "_shell", lambda runtime, command: shell(runtime, command))
    log = []
    report = fd_commands.drain_host(inventory, "spark-2", log.append)
    kinds = ["states" if "show stat" in c else c for c in shell.commands]
    assert kinds == ["states", fd_records.record_command("spark-2", drained=True),
                     fd_records.runtime_command("set server engines/spark-2 state drain"), "states",
                     fd_records.runtime_command("set server engines/spark-2 state maint"), fd_records.save_state_command(), "states"]
    assert report == {"host": "spark-2", "drained": True, "front_doors": [{"host": "spark-1", "state": "drained"}]}
    assert log == ["front door: spark-2 out"]


def test_undrain_clears_the_record_and_readies_in_one_command(inventory, monkeypatch):
    shell = Recorded()
    monkeypatch.setattr(fd_runtime.FrontDoorRuntime, "_shell", lambda runtime, command: shell(runtime, command))
    report = fd_commands.undrain_host(inventory, "spark-2", lambda m: None)
    assert shell.commands[1] == fd_records.undrain_command("spark-2")
    assert fd_records.undrain_command("spark-2") == (f"{fd_records.record_command('spark-2', drained=False)} && "
                                             f"{fd_records.runtime_command('set server engines/spark-2 state ready')} && "
                                             f"{fd_records.save_state_command()}")  # record, ready, then saved
    assert report["drained"] is False and report["front_doors"] == [{"host": "spark-1", "state": "in"}]


@pytest.mark.parametrize("args, expected", [
    (["spark-9"], "sparkfleet: no host named 'spark-9' in {inv}: give one of spark-1, spark-2, spark-3\n"),
    (["spark-1", "no_door"], "sparkfleet: no `front_door` group in {inv}: drain sets a host aside on the front "
                             "door; add one (see inventory/office_front_door.py)\n"),
    (["spark-3"], "sparkfleet: spark-3 is no backend of the front door on spark-1 (a tensor-parallel worker, "
                  "or another served model): give a host that serves behind it\n"),
])
def test_bad_input_is_one_line_and_exit_2_before_anything_is_sent(inventory, monkeypatch, capsys, args, expected):
    shell = Recorded()
    monkeypatch.setattr(fd_runtime.FrontDoorRuntime, "_shell", lambda runtime, command: shell(runtime, command))
    inv = inventory.replace("inventory.py", "no_door.py") if args[1:] == ["no_door"] else inventory
    for command in ("drain", "undrain"):
        assert cli.main([command, inv, args[0]]) == 2
        assert capsys.readouterr().err == expected.format(inv=inv)
    assert all("show stat" in c for c in shell.commands)  # read, never changed


def test_a_silent_front_door_changes_nothing_and_exits_1(inventory, monkeypatch, capsys):
    shell = Recorded(answers=False)
    monkeypatch.setattr(fd_runtime.FrontDoorRuntime, "_shell", lambda runtime, command: shell(runtime, command))
    assert cli.main(["drain", inventory, "spark-2", "--json"]) == 1
    assert "spark-1 did not answer" in capsys.readouterr().err
    assert len(shell.commands) == 1


# --- Debian's HAProxy on loopback: the drain held across a restart, with and without the state file -------


LIVE_SOCAT = """#!{python}
import socket, sys
with socket.socket(socket.AF_UNIX) as s:
    s.connect(sys.argv[-1].split(":", 1)[1])
    s.sendall(sys.stdin.buffer.read())
    sys.stdout.buffer.write(b"".join(iter(lambda: s.recv(65536), b"")))
"""


@pytest.mark.haproxy
def test_haproxy_keeps_a_drained_backend_out_across_restarts(door_dir):
    from .helpers import door_files, start_haproxy

    (door_dir / "bin" / "socat").write_text(LIVE_SOCAT.format(python=sys.executable))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    door = fd_plan.front_door_plan("spark-a", plans(**{"spark-a": {}, "spark-b": {}}))
    door_files(door, door_dir)
    # the socket and the state file are door_dir's already (the fixture); the maps move there too
    moved = {paths.FRONT_DOOR_DIR: str(door_dir), f"bind :{door.settings.front_door_port}": f"bind 127.0.0.1:{port}"}
    config = door.config()

    def states() -> dict[str, str]:
        return {name: row["state"] for name, row in Local().states()["spark-1"].items()}

    def started(old=None):
        if old:
            old.terminate()
            old.wait()
        proc = start_haproxy(config, door_dir, moved)
        wait_for(lambda: "spark-a" in subprocess.run(["sh", "-c", fd_records.runtime_command("show stat")],
                                                      capture_output=True, text=True, check=False).stdout)
        return proc

    proc = started()
    try:
        sh(fd_records.record_command("spark-a", drained=True))
        sh(fd_records.runtime_command("set server engines/spark-a state maint"))
        sh(fd_records.save_state_command())
        assert states()["spark-a"] == "drained"
        proc = started(proc)  # the state file carries the maintenance
        assert states()["spark-a"] == "drained" and states()["spark-b"] != "drained"
        os.unlink(paths.FRONT_DOOR_STATE_FILE)
        proc = started(proc)  # no state file: the unit's replay puts it back
        assert states()["spark-a"] not in ("drained", "out")
        sh(fd_records.replay_command())
        assert states()["spark-a"] == "drained"
        assert sh(fd_records.ready_command(["spark-a", "spark-b"])).startswith("kept spark-a\n")  # a batch end
        assert states()["spark-a"] == "drained"
        sh(fd_records.undrain_command("spark-a"))
        assert states()["spark-a"] not in ("drained", "out")
        proc = started(proc)  # undrained stays undrained: the state file was saved by undrain
        assert states()["spark-a"] not in ("drained", "out")
    finally:
        proc.terminate()
        proc.wait()


@pytest.mark.haproxy
def test_the_saved_state_keeps_maintenance_but_never_a_servers_old_tls_or_port(door_dir):
    """HAProxy restores srv_use_ssl and srv_port from its state file over the configuration: a guard switched to
    TLS got plain HTTP (502, "SSL handshake failure" on the guard) from a door that had saved its state before.
    What files/sparkfleet-servers-save keeps is the maintenance; TLS and port are the configuration's, at a start
    (from the file an older sparkfleet saved) and at a reload (from the running HAProxy)."""
    from .helpers import start_haproxy

    (door_dir / "bin" / "socat").write_text(LIVE_SOCAT.format(python=sys.executable))
    (door_dir / "bin" / "socat").chmod(0o755)
    ports = []
    for _ in range(3):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    front, old, new = ports

    def config(server_a: str, server_b: str) -> str:
        return (f"global\n    stats socket {paths.FRONT_DOOR_SOCKET} mode 600 level admin\n"
                f"    server-state-file {paths.FRONT_DOOR_STATE_FILE}\n"
                "defaults\n    mode http\n    timeout connect 1s\n    timeout client 5s\n    timeout server 5s\n"
                "    load-server-state-from-file global\n"
                f"frontend api\n    bind 127.0.0.1:{front}\n    default_backend engines\n"
                f"backend engines\n    server spark-a {server_a}\n    server spark-b {server_b}\n")

    def shown() -> dict[str, list[str]]:  # fields: 6 srv_admin_state, 18 srv_port, 20 srv_use_ssl (from 0)
        asked = subprocess.run(["sh", "-c", fd_records.runtime_command("show servers state engines")],
                               capture_output=True, text=True, timeout=20, check=False)  # none while it starts
        rows = asked.stdout.splitlines() if asked.returncode == 0 else []
        return {row.split()[3]: row.split() for row in rows if row[:1].isdigit() and len(row.split()) > 20}

    def started(text: str):
        proc = start_haproxy(text, door_dir, {})
        wait_for(lambda: "spark-b" in shown())
        return proc

    def stopped(proc) -> None:
        proc.terminate()
        proc.wait()

    plain, changed = config(f"127.0.0.1:{old}", f"127.0.0.1:{old}"), config(f"127.0.0.1:{new}",
                                                                              f"127.0.0.1:{old} ssl verify none")
    proc = started(plain)
    try:
        sh(fd_records.runtime_command("set server engines/spark-a state maint"))
        # what an older sparkfleet saved: HAProxy's whole answer (no TLS, the old port)
        Path(paths.FRONT_DOOR_STATE_FILE).write_text(sh(fd_records.runtime_command("show servers state")))
        stopped(proc)
        # a converge writes the new configuration (spark-a's guard on another port, spark-b's over TLS), and the
        # unit's start brings the file to it before HAProxy loads it
        Path(paths.FRONT_DOOR_CONFIG).write_text(changed)
        sh(fd_records.save_state_command())
        proc = started(changed)
        rows = shown()
        assert rows["spark-a"][6] != "0" and rows["spark-a"][18] == str(new), rows["spark-a"]
        assert rows["spark-b"][6] == "0" and rows["spark-b"][20] == "1", rows["spark-b"]
        # a reload back to the plain configuration: saved from the running HAProxy, brought to it the same way
        Path(paths.FRONT_DOOR_CONFIG).write_text(plain)
        sh(fd_records.save_state_command())
        stopped(proc)
        proc = started(plain)
        rows = shown()
        assert rows["spark-a"][6] != "0" and rows["spark-a"][18] == str(old), rows["spark-a"]
        assert rows["spark-b"][20] == "0", rows["spark-b"]
    finally:
        stopped(proc)


@pytest.mark.haproxy
def test_a_restarted_door_sends_to_a_hosts_address_now_never_the_one_in_its_state_file(door_dir):
    """Seen on the demo fleet: the Sparks came back from a restart with new addresses, and door-1 kept sending to
    the old ones (one was now spark-3's, another door-1's own) because its state file named them and the servers
    took `init-addr last` first: no backend in for 15 minutes. The name's address now wins; the last one is kept
    only for a name that does not resolve at the start. The servers' init-addr is the door's template's."""
    from .helpers import start_haproxy
    import re

    init_addr = re.search(r"init-addr (\S+)", fd_plan.front_door_plan("spark-a", plans(**{"spark-a": {}})).config())
    (door_dir / "bin" / "socat").write_text(LIVE_SOCAT.format(python=sys.executable))
    (door_dir / "bin" / "socat").chmod(0o755)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        front = s.getsockname()[1]
    Path(paths.FRONT_DOOR_CONFIG).write_text(
        f"global\n    stats socket {paths.FRONT_DOOR_SOCKET} mode 600 level admin\n"
        f"    server-state-file {paths.FRONT_DOOR_STATE_FILE}\n"
        "defaults\n    mode http\n    timeout connect 1s\n    timeout client 5s\n    timeout server 5s\n"
        "    load-server-state-from-file global\n"
        f"frontend api\n    bind 127.0.0.1:{front}\n    default_backend engines\n"
        f"backend engines\n    default-server init-addr {init_addr.group(1)}\n"
        "    server spark-a localhost:8000\n    server spark-b sparkfleet-test-unresolvable.invalid:8000\n")
    # what the door saved before the restart: both hosts at addresses they no longer have, spark-a in maintenance
    Path(paths.FRONT_DOOR_STATE_FILE).write_text(
        "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight "
        "srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state "
        "srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord\n"
        "3 engines 1 spark-a 127.0.0.9 2 1 1 1 5 1 0 0 0 0 0 0 localhost 8000 -\n"
        "3 engines 2 spark-b 127.0.0.8 2 0 1 1 5 1 0 0 0 0 0 0 sparkfleet-test-unresolvable.invalid 8000 -\n")
    sh(fd_records.save_state_command())  # what the unit's start runs first
    proc = start_haproxy(Path(paths.FRONT_DOOR_CONFIG).read_text(), door_dir, {})
    try:
        def shown() -> dict[str, list[str]]:
            asked = subprocess.run(["sh", "-c", fd_records.runtime_command("show servers state engines")],
                                   capture_output=True, text=True, timeout=20, check=False)
            rows = asked.stdout.splitlines() if asked.returncode == 0 else []
            return {row.split()[3]: row.split() for row in rows if row[:1].isdigit() and len(row.split()) > 5}

        wait_for(lambda: "spark-b" in shown())
        rows = shown()
        assert rows["spark-a"][4] == "127.0.0.1" and rows["spark-a"][6] != "0", rows["spark-a"]  # still in maintenance
        assert rows["spark-b"][4] == "127.0.0.8", rows["spark-b"]  # no answer for its name: the last address
    finally:
        proc.terminate()
        proc.wait()


def test_status_asks_each_door_once_for_its_states_certificate_and_the_address(door_dir, monkeypatch):
    """survey_command in a real shell (a socat that answers `show stat`, a certificate on disk, this machine's
    own loopback address as the floating one), parsed: one round trip per door says all three."""
    from sparkfleet.roles import pki

    (door_dir / "bin" / "socat").write_text(f"#!/bin/sh\ncat > /dev/null\nprintf '%s' '{STAT}'\n")
    (door_dir / "drained").write_text("spark-2\n")
    pki.write_ca(door_dir / "ca.crt", door_dir / "ca.key")
    ca = pki.load_ca(door_dir / "ca.crt", door_dir / "ca.key")
    (door_dir / "host.crt").write_text(pki.issue(ca, "door-1", ("door-1",)))
    monkeypatch.setattr(paths, "TLS_HOST_CERT", str(door_dir / "host.crt"))
    door = Local(("door-1", "door-2"))
    door.address = "127.0.0.1/8"
    door.settings = [type("S", (), {"fleet_ca_cert": "ca.crt", "backend_key_in_clear": False})()]
    survey = door.survey()
    assert len(door.commands) == 1
    assert {n: row["state"] for n, row in survey.states["door-1"].items()} == {
        "spark-1": "in", "spark-2": "drained", "spark-3": "out", "spark-4": "draining", "spark-5": "in"}
    assert survey.certificates == {d: pki.ends((door_dir / "host.crt").read_text()) for d in ("door-1", "door-2")}
    assert survey.holder == "door-1" and survey.certificates["door-1"] is not None
    # a door that did not answer (HAProxy down: the states part fails the command): no states, no certificate
    answers = {"door-1": None, "door-2": sh(fd_runtime.survey_command(None, tls=False))}
    parsed = fd_runtime.parse_survey(answers, tls=False)
    assert parsed.states["door-1"] is None and parsed.states["door-2"]["spark-4"]["state"] == "draining"
    assert parsed.certificates == {} and parsed.holder is None
