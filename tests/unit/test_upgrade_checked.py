"""An upgrade installs exactly what was checked (issue 36, item 7): the install names each package of the plan's
simulation at its checked version, and apt is asked again on the host right before: anything else offered now (the
lists refreshed between the survey and the install, after the drain and the canary's baseline) is refused, nothing
installed. Package names and versions are apt's output, untrusted: off Debian's grammar the simulation is
unreadable, and what reaches the shell is quoted."""

import shlex
from types import SimpleNamespace

import pytest
from pyinfra.api import FunctionCommand
from pyinfra.connectors.util import CommandOutput, OutputLine

from sparkfleet.contract.settings import parse_settings
from sparkfleet.fleet.converge import HostResult
from sparkfleet.fleet.upgrade import judge
from sparkfleet.host.facts import Unreadable
from sparkfleet.host.upgrade import (
    END,
    REFUSED_OP,
    Change,
    Simulation,
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


class Host:
    """The host as the operation sees it when it runs: apt's answer to the second look."""

    def __init__(self, answer: list[str]):
        self.name, self.answer, self.asked = "spark-a", answer, []

    def run_shell_command(self, command, **kwargs):
        self.asked.append(str(command))
        return True, CommandOutput([OutputLine("stdout", line) for line in self.answer])


def run_op(answer: list[str]) -> tuple[list[str], Host]:
    """The operation's commands as pyinfra runs them: a Python step is run before the next command is asked for."""
    target, commands = Host(answer), []
    for command in checked_upgrade._inner(CHECKED):
        if isinstance(command, FunctionCommand):
            assert command.function(SimpleNamespace(), target, *command.args, **command.kwargs) is True
            commands.append("<second look>")
        else:
            commands.append(str(command))
    return commands, target


def test_the_operation_installs_the_checked_list_after_apt_offered_it_again():
    commands, target = run_op([inst(c) for c in CHECKED] + [END])
    assert commands == ["<second look>", str(install_command(CHECKED))]
    assert target.asked == [str(recheck_command(CHECKED))]


def test_the_operation_refuses_what_apt_offers_beyond_the_check_and_installs_nothing():
    commands, _ = run_op([inst(c) for c in (*CHECKED, REFUSED_KERNEL)] + [END])
    assert commands[0] == "<second look>" and len(commands) == 2
    assert "apt-get" not in commands[1] and commands[1].endswith(">&2; exit 1")
    assert "linux-image-6.17.0-1009-nvidia" in shlex.split(commands[1])[2]


def test_a_refusal_at_the_second_look_is_reported_as_refused():
    line = offered_problem("spark-a", CHECKED, parse_simulation([inst(c) for c in (*CHECKED, REFUSED_KERNEL)] + [END]))
    step = HostResult("spark-a", failed=["Platform upgrade | Packages upgraded"], said=[line])
    result, detail = judge(step, None, None)
    assert result == "refused" and detail.startswith("spark-a: apt now offers another upgrade")
    assert detail.endswith("; left drained on its old versions")
