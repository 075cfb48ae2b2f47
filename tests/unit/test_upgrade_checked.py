"""An upgrade installs exactly what was checked (issue 36, item 7): the install names each package of the plan's
simulation at its checked version, and apt is asked again on the host right before: anything else offered now (the
lists refreshed between the survey and the install, after the drain and the canary's baseline) is refused, nothing
installed. Package names and versions are apt's output, untrusted: off Debian's grammar the simulation is
unreadable, and what reaches the shell is quoted."""

import shlex
from types import SimpleNamespace

import pytest
from pyinfra.api import FunctionCommand

from sparkfleet.contract.settings import parse_settings
from sparkfleet.fleet.converge import HostResult
from sparkfleet.fleet.upgrade import judge
from sparkfleet.host.facts import Unreadable
from sparkfleet.host.upgrade import (
    END,
    REFUSED_OP,
    Change,
    Simulation,
    checked_command,
    checked_upgrade,
    install_command,
    offered_problem,
    parse_simulation,
    recheck_command,
    refused_changes,
)

from .helpers import host_data

META = Change("linux-image-nvidia-hwe-24.04", "6.17.0-1007.7", "6.17.0-1008.8")
KERNEL = Change("linux-image-6.17.0-1008-nvidia", None, "6.17.0-1008.8")
DRIVER = Change("nvidia-driver-580-open", "580.95.05-1", "580.95.99-1")
CHECKED = (META, KERNEL, DRIVER)
# the lists refreshed after the survey: apt now also brings a kernel that refused_kernels names
REFUSED_KERNEL = Change("linux-image-6.17.0-1009-nvidia", None, "6.17.0-1009.9")

DPKG = "-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold"


def inst(c: Change) -> str:
    return f"Inst {c.package} " + (f"[{c.old}] " if c.old else "") + f"({c.new} Ubuntu:24.04/noble-updates [arm64])"


def test_the_install_names_each_checked_package_at_its_checked_version_and_marks_new_ones_automatic():
    assert str(install_command(CHECKED)) == (
        f"DEBIAN_FRONTEND=noninteractive apt-get -y -q {DPKG} install -- "
        "linux-image-nvidia-hwe-24.04=6.17.0-1008.8 linux-image-6.17.0-1008-nvidia=6.17.0-1008.8 "
        "nvidia-driver-580-open=580.95.99-1 && apt-mark auto -- linux-image-6.17.0-1008-nvidia >/dev/null")
    assert str(install_command((DRIVER,))).endswith("install -- nvidia-driver-580-open=580.95.99-1")


def test_the_second_look_simulates_that_very_install_without_refreshing_the_lists():
    command = str(recheck_command(CHECKED))
    assert command.startswith(f"apt-get -s {DPKG} install -- linux-image-nvidia-hwe-24.04=6.17.0-1008.8 ")
    assert "update" not in command and command.endswith(f"echo {shlex.quote(END)}")


def test_apt_offering_what_was_checked_passes():
    again = parse_simulation([inst(c) for c in (DRIVER, META, KERNEL)] + ["Conf curl (1 x)", END])
    assert offered_problem("spark-a", CHECKED, again) is None


def test_a_refused_kernel_offered_after_the_check_is_refused_with_nothing_installed():
    s = parse_settings("spark-a", host_data(refused_kernels={"6.17.0-1009*": "panics on GB10"}))
    assert refused_changes("spark-a", s, CHECKED) == []  # what the survey checked: nothing refused
    again = parse_simulation([inst(c) for c in (*CHECKED, REFUSED_KERNEL)] + [END])
    assert refused_changes("spark-a", s, again.changes)  # what apt would install now
    line = offered_problem("spark-a", CHECKED, again)
    assert line.startswith(f"{REFUSED_OP}: spark-a: apt now offers another upgrade than the one checked")
    assert "linux-image-6.17.0-1009-nvidia (new) -> 6.17.0-1009.9" in line and "nothing installed" in line


def test_a_checked_version_gone_a_removal_or_an_unreadable_answer_is_refused():
    gone = parse_simulation(["E: Version '580.95.99-1' for 'nvidia-driver-580-open' was not found", END])
    assert "was not found" in offered_problem("spark-a", CHECKED, gone) and "nothing installed" in \
        offered_problem("spark-a", CHECKED, gone)
    removes = parse_simulation([inst(c) for c in CHECKED] + ["Remv nvidia-dkms-580-open [580.95.05-1]", END])
    assert removes.removed == ("nvidia-dkms-580-open",)
    assert "would remove nvidia-dkms-580-open" in offered_problem("spark-a", CHECKED, removes)
    moved = Change(DRIVER.package, DRIVER.old, "580.95.100-1")
    assert "no longer offered: nvidia-driver-580-open" in offered_problem(
        "spark-a", CHECKED, parse_simulation([inst(c) for c in (META, KERNEL, moved)] + [END]))
    assert offered_problem("spark-a", CHECKED, parse_simulation([])).startswith(f"{REFUSED_OP}: spark-a: ")


@pytest.mark.parametrize("line", [
    "Inst curl;touch${IFS}/tmp/pwned [1] (2 x [arm64])",
    "Inst -oAPT::Get::Trivial-Only=0 [1] (2 x [arm64])",
    "Inst curl [1] ($(touch${IFS}/tmp/pwned) x [arm64])",
    "Inst curl [1] (2`id` x [arm64])",
    "Inst curl [1;id] (2 x [arm64])",
    "Remv curl'$(id)' [1]",
])
def test_a_package_or_version_off_debians_grammar_makes_the_simulation_unreadable(line):
    found = parse_simulation([line, END])
    assert isinstance(found, Unreadable) and "Debian's grammar" in found.problem


def test_what_reaches_the_shell_is_quoted_even_past_the_parser():
    hostile = Change("curl;touch /tmp/pwned", "1", "2 $(id)")
    words = shlex.split(str(install_command((hostile,))))
    assert words[words.index("--") + 1] == "curl;touch /tmp/pwned=2 $(id)"
    words = shlex.split(str(recheck_command((hostile,))))
    assert words[words.index("--") + 1] == "curl;touch /tmp/pwned=2 $(id)"


# apt on the host, as the one command meets it: `apt-get -s` answers the simulation in $APT_ANSWER, an install and
# `apt-mark` answer nothing; each call is logged with whether apt's lists lock ($APT_LISTS_LOCK) was free to take
# for another process then (an `apt-get update` starting would have taken it), as apt takes it (fcntl)
FAKE_APT = """#!{python}
import fcntl, json, os, sys
fd = os.open(os.environ["APT_LISTS_LOCK"], os.O_RDWR | os.O_CREAT)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    lists = "free"
except OSError:
    lists = "held"
with open(os.environ["APT_LOG"], "a") as log:
    log.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:], lists]) + "\\n")
if "-s" in sys.argv[1:]:
    print(open(os.environ["APT_ANSWER"]).read(), end="")
"""


@pytest.fixture
def host_apt(tmp_path):
    """Runs the operation's one command as the host's shell would, against the fake apt: (the simulation apt
    answers now, the lock's wait) -> (exit status, stderr, the logged apt calls)."""
    import json
    import subprocess
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("apt-get", "apt-mark"):
        (bin_dir / name).write_text(FAKE_APT.format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    lock = tmp_path / "lists.lock"

    def run(answer: list[str], wait_s: float = 5, command=None) -> tuple[int, str, list[list[str]]]:
        (tmp_path / "answer").write_text("".join(f"{line}\n" for line in answer))
        (tmp_path / "log").write_text("")
        command = command or checked_command("spark-a", CHECKED, lock=str(lock), wait_s=wait_s)
        proc = subprocess.run(["sh", "-c", str(command)], capture_output=True, text=True, timeout=60, env={
            "PATH": f"{bin_dir}:/usr/bin:/bin", "APT_LISTS_LOCK": str(lock), "APT_LOG": str(tmp_path / "log"),
            "APT_ANSWER": str(tmp_path / "answer")})
        calls = [json.loads(line) for line in (tmp_path / "log").read_text().splitlines()]
        return proc.returncode, proc.stderr, calls

    run.lock = lock
    return run


def test_the_operation_is_one_command_on_the_host_no_second_look_of_its_own(monkeypatch):
    """Issue 50: the second look and the install were two SSH commands, and a list refresh could come between
    them; now the operation yields one command, the check and the install inside it."""
    from sparkfleet.host import upgrade

    monkeypatch.setattr(upgrade, "host", SimpleNamespace(name="spark-a"))
    commands = list(checked_upgrade._inner(CHECKED))
    assert not any(isinstance(c, FunctionCommand) for c in commands)
    assert [str(c) for c in commands] == [str(checked_command("spark-a", CHECKED))]
    assert str(commands[0]).startswith("python3 -c ")


def test_the_operation_installs_the_checked_list_after_apt_offered_it_again(host_apt):
    rc, err, calls = host_apt([inst(c) for c in CHECKED] + [END])
    assert (rc, err) == (0, ""), err
    checked, install, auto = calls
    assert checked[:-1] == ["apt-get", "-s", *DPKG.split(), "install", "--", *(f"{c.package}={c.new}" for c in CHECKED)]
    assert install[:-1] == ["apt-get", "-y", "-q", *DPKG.split(), "install", "--",
                            *(f"{c.package}={c.new}" for c in CHECKED)]
    assert auto[:-1] == ["apt-mark", "auto", "--", KERNEL.package]


def test_no_list_refresh_can_come_between_the_second_look_and_the_install(host_apt):
    """apt's lists lock (an fcntl lock, as `apt-get update` takes it) is held by the command from before apt is
    asked again until the install has ended: a refresh tried at either moment would find it taken."""
    rc, err, calls = host_apt([inst(c) for c in CHECKED] + [END])
    assert rc == 0 and [call[-1] for call in calls] == ["held", "held", "held"], calls


def test_a_refresh_running_is_waited_for_and_one_that_does_not_end_refuses_with_nothing_installed(host_apt):
    """An `apt-get update` holding the lists lock: the command waits for it (then checks the lists as they are
    after it), and past its wait refuses in one line, apt not even asked."""
    import fcntl
    import os
    import threading

    fd = os.open(host_apt.lock, os.O_RDWR | os.O_CREAT)
    fcntl.lockf(fd, fcntl.LOCK_EX)
    try:
        rc, err, calls = host_apt([inst(c) for c in CHECKED] + [END], wait_s=0)
    finally:
        timer = threading.Timer(0.5, lambda: os.close(fd))
        timer.start()
    assert (rc, calls) == (1, [])
    assert err.strip() == (f"{REFUSED_OP}: spark-a: apt's lists ({host_apt.lock}) stayed locked by another process "
                           "(a list refresh) for 0 s; nothing installed: run `sparkfleet upgrade` again once it ends")
    timer.join()
    rc, err, calls = host_apt([inst(c) for c in CHECKED] + [END], wait_s=30)  # released within its wait
    assert rc == 0 and len(calls) == 3, err


def test_the_operation_refuses_what_apt_offers_beyond_the_check_and_installs_nothing(host_apt):
    rc, err, calls = host_apt([inst(c) for c in (*CHECKED, REFUSED_KERNEL)] + [END])
    assert rc == 1 and [call[1] for call in calls] == ["-s"]  # asked again, nothing installed
    [line] = err.splitlines()
    assert line.startswith(f"{REFUSED_OP}: spark-a: apt now offers another upgrade than the one checked")
    assert "linux-image-6.17.0-1009-nvidia" in line and line == offered_problem(
        "spark-a", CHECKED, parse_simulation([inst(c) for c in (*CHECKED, REFUSED_KERNEL)] + [END]))


def test_a_hostile_host_name_or_package_reaches_the_host_as_one_argument_each(host_apt):
    """The host's name and apt's values are each one quoted argument of the one command: none becomes shell."""
    hostile = Change("curl;touch /tmp/pwned", "1", "2 $(id)")
    command = checked_command("spark-a'; id; '", (hostile,), lock=str(host_apt.lock))
    rc, err, calls = host_apt(["Inst curl;touch /tmp/pwned [1] (2 x [arm64])", END], command=command)
    assert rc == 1 and [call[1] for call in calls] == ["-s"]
    assert calls[0][-2] == "curl;touch /tmp/pwned=2 $(id)"
    assert err.startswith(f"{REFUSED_OP}: spark-a'; id; ': apt, asked again right before installing: ")


def test_a_refusal_at_the_second_look_is_reported_as_refused():
    line = offered_problem("spark-a", CHECKED, parse_simulation([inst(c) for c in (*CHECKED, REFUSED_KERNEL)] + [END]))
    step = HostResult("spark-a", failed=["Platform upgrade | Packages upgraded"], said=[line])
    result, detail = judge(step, None, None)
    assert result == "refused" and detail.startswith("spark-a: apt now offers another upgrade")
    assert detail.endswith("; left drained on its old versions")
