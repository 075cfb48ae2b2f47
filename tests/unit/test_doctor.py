"""`sparkfleet doctor` (issue 51, item 5): the judging without hosts (clock skew, certificates' days left, disk,
sudo, Docker, GPU, what ssh said), one host read through a canned script's output, and the command against hostile
loopback ports: it ends within its timeouts, with words, never a traceback."""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
import time

import pytest

from sparkfleet import cli
from sparkfleet.contract.settings import parse_settings
from sparkfleet.fleet import doctor
from sparkfleet.host.nvidia_smi import GpuReport
from sparkfleet.roles import pki

from .helpers import host_data
from .hostile_ports import closed_port, garbage_port, silent_port

GIB = 1024**3
TODAY = dt.date(2026, 1, 10)
SETTINGS = parse_settings("spark-1", host_data())


# --- the judges ----------------------------------------------------------------------------------------------------


def test_clock_skew_counts_only_what_lies_outside_the_ssh_runs_window():
    assert doctor.clock_skew(105.0, 100.0, 110.0) == 0.0  # the run's own 10 s are no skew
    assert doctor.clock_skew(113.5, 100.0, 110.0) == pytest.approx(3.5)
    assert doctor.clock_skew(90.0, 100.0, 110.0) == pytest.approx(-10.0)
    assert doctor.judge_clock(111.0, 100.0, 110.0).problem is None
    ahead = doctor.judge_clock(113.5, 100.0, 110.0)
    assert ahead.cell == "+3.5 s" and "3.5 s ahead of the controller's" in ahead.problem and "set-ntp" in ahead.fix
    assert "behind" in doctor.judge_clock(90.0, 100.0, 110.0).problem
    assert doctor.judge_clock(None, 100.0, 110.0).problem  # a clock that was not read is said, not guessed


def test_days_left_and_the_certificates_judged():
    assert doctor.days_left("2026-01-20", TODAY) == 10 and doctor.days_left(None, TODAY) is None
    assert doctor.judge_days("host", 200, "converge", True) == ("host 200 d", None)
    cell, problem = doctor.judge_days("host", 10, "converge the host", True)
    assert cell == "host 10 d" and problem == "host certificate ends in 10 days: converge the host"
    assert doctor.judge_days("host", -3, "converge", True)[1].startswith("host certificate expired 3 days ago")
    assert doctor.judge_days("host", None, "converge", False) == ("host none", None)  # not converged yet
    assert doctor.judge_days("host", None, "converge", True)[1] == "host certificate missing: converge"
    both = doctor.judge_certificates([("host 300 d", None), ("door 5 d", "door certificate ends in 5 days: renew")])
    assert both.cell == "host 300 d, door 5 d" and both.problem == "door certificate ends in 5 days: renew"


def test_the_days_left_of_a_real_certificate(tmp_path):
    """The host's certificate read as the host sends it (roles/pki.py `ends`), to the day."""
    pki.write_ca(tmp_path / "ca.crt", tmp_path / "ca.key")
    end = pki.ends((tmp_path / "ca.crt").read_text())
    assert end and doctor.days_left(end, dt.date.fromisoformat(end) - dt.timedelta(days=7)) == 7


def test_disk_below_its_minimum_is_a_problem_naming_the_path():
    enough = doctor.judge_disk(100 * GIB, "/srv/models", doctor.SPARK_DISK_MIN)
    assert enough == doctor.Check("100.0 GiB")
    low = doctor.judge_disk(3 * GIB, "/srv/models", doctor.SPARK_DISK_MIN)
    assert low.problem == "only 3.0 GiB free at /srv/models (under 20.0 GiB)" and "model_root" in low.fix
    from sparkfleet.host.facts import Unreadable

    assert doctor.judge_disk(Unreadable("df", "x"), "/", doctor.SERVICE_DISK_MIN).problem


def test_root_or_sudo_without_a_password():
    assert doctor.judge_user("root", "0", "root", {}) == doctor.Check("root")
    assert "no `_sudo`" in doctor.judge_user("nvidia", "1000", "sudo", {}).problem
    assert doctor.judge_user("nvidia", "1000", "sudo", {"_sudo": True}) == doctor.Check("nvidia (sudo)")
    asks = doctor.judge_user("nvidia", "1000", "none", {"_sudo": True})
    assert asks.problem == "sudo asks nvidia for a password" and "sudoers.d" in asks.fix
    assert doctor.judge_user("nvidia", "1000", "none", {"_sudo": True, "_sudo_password": "x"}).problem is None


def test_docker_and_the_gpu():
    assert doctor.judge_docker(["installed=no", "active="], "").cell == "not installed"
    assert doctor.judge_docker(["installed=yes", "active=inactive"], "").problem == "docker.service is not active"
    assert doctor.judge_docker(["installed=yes", "active=active"], "permission denied").cell == "no answer"
    assert doctor.judge_docker(["installed=yes", "active=active"], "28.1.1") == doctor.Check("28.1")
    assert doctor.judge_gpu(GpuReport(None, None, None, "nvidia-smi: not found"), SETTINGS).cell == "not seen"
    old = doctor.judge_gpu(GpuReport("NVIDIA GB10", "500.1", "12.0"), SETTINGS)
    assert old.problem and "min_driver_version" in old.problem
    good = doctor.judge_gpu(GpuReport("NVIDIA GB10", "999.1", "13.0"), SETTINGS)
    assert good == doctor.Check("NVIDIA GB10, driver 999.1")


@pytest.mark.parametrize("stderr,code,cell,column", [
    ("ssh: connect to host 10.0.0.1 port 22: Connection refused", 255, "connection refused", "ssh"),
    ("Connection timed out during banner exchange\nConnection to 10.0.0.1 port 22 timed out", 255, "no SSH banner",
     "ssh"),
    ("kex_exchange_identification: Connection closed by remote host", 255, "not SSH", "ssh"),
    ("ssh: Could not resolve hostname spark-9: Name or service not known", 255, "name not resolved", "ssh"),
    ("ssh: connect to host 10.0.0.1 port 22: Connection timed out", 255, "timed out", "ssh"),
    ("admin@10.0.0.1: Permission denied (publickey).", 255, "login refused", "ssh"),
    ("No ED25519 host key is known for 10.0.0.1 and you have requested strict checking.\n"
     "Host key verification failed.", 255, "not known", "host_key"),
    ("@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @\nHost key verification failed.", 255, "CHANGED",
     "host_key"),
    ("", None, "no answer", "ssh"),
    ("something new \x1b[2J", 255, "failed", "ssh"),
])
def test_what_ssh_said_in_words_with_a_fix(stderr, code, cell, column):
    checks = doctor.ssh_failure(stderr, code, "10.0.0.1", 22)
    check = checks[column]
    assert check.cell == cell and check.problem and check.fix
    assert "\x1b" not in check.problem  # what ssh quoted of the host is shown clean


# --- one host, through a canned script output ------------------------------------------------------------------------

def canned(tmp_path, uid="0", privilege="root", free=200 * GIB, skew=0.0, docker="28.1.1", converged="yes"):
    """A `run` that answers as the host's script would, without a host; records the argv."""
    pki.write_ca(tmp_path / "ca.crt", tmp_path / "ca.key")
    pem = (tmp_path / "ca.crt").read_text()  # a certificate as the host sends its own (the CA's: ten years)
    seen = []

    def run(argv):
        seen.append(argv)
        out = "\n".join([
            "@@user", "root" if uid == "0" else "nvidia", uid, privilege, "@@time", f"{time.time() + skew:.3f}",
            "@@disk", str(free), "@@converged", converged, "@@cert", *pem.splitlines(), "@@docker",
            "installed=yes", "active=active", "@@docker_version", docker, "@@gpu",
            GB10_SMI, "@@end", ""])
        return 0, out, ""
    return run, seen, pem


GB10_SMI = """+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 580.95.05              Driver Version: 580.95.05      CUDA Version: 13.0     |
+-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
|=========================================+========================+======================|
|   0  NVIDIA GB10                    On  |   0000000F:01:00.0 Off |                  N/A |
+-----------------------------------------+------------------------+----------------------+"""


def test_a_ready_host_has_no_problem_and_ssh_is_strict_and_read_only(tmp_path):
    run, seen, ca = canned(tmp_path)
    data = host_data(ssh_hostname="10.0.0.1", ssh_strict_host_key_checking="yes", ssh_known_hosts_file="/k")
    found = doctor.host_checks("spark-1", data, parse_settings("spark-1", data), True, TODAY, run)
    assert {c: k.problem for c, k in found["checks"].items() if k.problem} == {}
    assert found["converged"] is True and found["certificate"][1] is None
    assert found["checks"]["gpu"].cell == "NVIDIA GB10, driver 580.95.05"
    argv = seen[0]
    assert argv[:9] == ["ssh", "-o", f"ConnectTimeout={doctor.CONNECT_S}", "-o", "BatchMode=yes",
                        "-o", "StrictHostKeyChecking=yes", "-o", "UpdateHostKeys=no"]  # first: OpenSSH keeps them
    remote = argv[-1]
    writes = r"\b(rm|mv|tee|cp|chmod|mkdir|kill)\b|systemctl (start|stop|restart|enable)|>\s*/(?!dev/null)"
    assert not re.search(writes, remote), remote


def test_a_host_with_problems_says_each_in_one_line(tmp_path):
    run, _, _ = canned(tmp_path, uid="1000", privilege="none", free=2 * GIB, skew=30, docker="Cannot connect")
    data = host_data(ssh_hostname="10.0.0.1", _sudo=True)
    found = doctor.host_checks("spark-1", data, parse_settings("spark-1", data), True, TODAY, run)
    row = {"host": "spark-1", "checks": {c: found["checks"].get(c, doctor.NOT_CHECKED) for c in doctor.COLUMNS}}
    lines = doctor.problems([row])
    assert all(line.startswith("spark-1: ") and line.count(": ") >= 3 and "\n" not in line for line in lines)
    assert {line.split(": ")[1] for line in lines} == {"host key", "user", "Docker", "disk free", "clock"}


def test_the_script_reads_a_service_host_without_gpu_or_docker():
    assert "nvidia-smi" in doctor.script("/srv/models") and "docker" in doctor.script("/srv/models")
    service = doctor.script(None)
    assert "nvidia-smi" not in service and "docker" not in service and "@@disk" in service


def test_sections_ignore_what_comes_before_the_first():
    assert doctor.sections("motd\n@@user\nroot\n0\n@@end\n") == {"user": ["root", "0"], "end": []}


def test_guard_and_door_answers_judged_after_the_first_converge_only():
    assert doctor.judge_http("guard", None, "connection refused", False, "tls").problem is None
    down = doctor.judge_http("guard", None, "connection refused", True, "tls fix")
    assert down.problem == "the guard does not answer: connection refused" and "sparkfleet logs" in down.fix
    assert doctor.judge_http("front-door", None, "TLS: certificate not trusted", True, "tls fix").fix == "tls fix"
    assert doctor.judge_http("guard", 503, None, True, "").problem.startswith("the guard answers HTTP 503")
    assert doctor.judge_http("guard", 200, None, True, "") == doctor.Check("answers")


# --- the command against hostile loopback ports -----------------------------------------------------------------


def inventory(tmp_path, port: int) -> str:
    path = tmp_path / "office.py"
    path.write_text(f"sparks = [('spark-1', {{'ssh_hostname': '127.0.0.1', 'ssh_port': {port}, "
                    f"'ssh_strict_host_key_checking': 'yes', 'ssh_known_hosts_file': '{tmp_path}/known_hosts'}})]\n")
    return str(path)


@pytest.mark.ssh
@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs OpenSSH's client")
@pytest.mark.parametrize("kind,said", [("silent", "no SSH banner"), ("garbage", "not SSH"),
                                       ("closed", "connection refused")])
def test_the_command_ends_within_its_timeout_with_a_word(tmp_path, capsys, kind, said):
    """A port that accepts and never speaks, one that answers garbage, one closed: exit 1 within the connect
    timeout, the table and one line naming the fix; no traceback."""
    ports = {"silent": silent_port, "garbage": garbage_port}
    started = time.monotonic()
    if kind in ports:
        with ports[kind]() as port:
            code = cli.main(["doctor", inventory(tmp_path, port)])
    else:
        code = cli.main(["doctor", inventory(tmp_path, closed_port())])
    took = time.monotonic() - started
    out, err = capsys.readouterr()
    assert code == 1 and took < doctor.CONNECT_S + 10, (took, out, err)
    assert "Traceback" not in out + err and said in out
    problem = [line for line in out.splitlines() if line.startswith("spark-1: SSH: ")]
    assert len(problem) == 1 and problem[0].count(": ") >= 3, out  # the host, what, the problem, the fix


@pytest.mark.ssh
@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs OpenSSH's client")
def test_json_names_each_check_and_the_problems(tmp_path, capsys):
    with silent_port() as port:
        assert cli.main(["doctor", inventory(tmp_path, port), "--json"]) == 1
    found = json.loads(capsys.readouterr().out)
    assert set(found["hosts"][0]["checks"]) == set(doctor.COLUMNS)
    assert found["hosts"][0]["checks"]["ssh"]["problem"] == "accepts TCP but sends no SSH banner"
    assert found["problems"] == [line for line in found["problems"] if line.startswith("spark-1: SSH: ")] != []
