"""A platform upgrade on one host, as plain logic: what `apt-get upgrade` would change (its simulation), which of
the new kernel or driver versions a refused_* setting refuses (preflight's matching), and whether the host then
needs a reboot. The fact reads the simulation; `sparkfleet upgrade` acts on it (`tasks/upgrade.py`).

What is installed is exactly what was checked: the lists may refresh between the simulation (planned) and the
install (after the drain and the canary's baseline), so the install names each simulated package at its simulated
version (`install_command`), and apt is asked again on the host right before (`checked_upgrade`): anything else it
offers then is refused (`offered_problem`), nothing installed. Names and versions are apt's output, untrusted: off
Debian's grammar the simulation is unreadable, and each one reaches the shell quoted.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass

from pyinfra.api import FactBase, FunctionCommand, QuoteString, StringCommand, operation

from sparkfleet.contract import paths
from sparkfleet.contract.settings import Settings
from sparkfleet.host.facts import Unreadable
from sparkfleet.host.preflight import refused_by, refused_lists

# `apt-get -s upgrade`: "Inst nvidia-driver-580-open [580.95.05-1] (580.95.99-1 DGX:stable [arm64])"; no [old]: new
INST = re.compile(r"Inst (?P<package>\S+) (?:\[(?P<old>[^\]]+)\] )?\((?P<new>\S+)")
REMV = re.compile(r"Remv (?P<package>\S+)")  # what an install would remove (an upgrade never does)
# Debian policy 5.6.1 (a name, apt's ":arch" for a foreign one) and 5.6.12 (a version): what may reach apt's command
PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]+(?::[a-z0-9][a-z0-9-]*)?")
VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+~:-]*")
SIMULATED = "^(Inst|Remv|E:) "  # the lines a simulation's answer keeps (grep -E)
KERNEL = re.compile(r"linux-image-(?P<release>\d\S*)")  # the version `uname -r` reports once booted on it
DRIVER = re.compile(r"nvidia-driver-\d+(?:-server)?(?:-open)?")  # DGX OS's driver package, its version the driver's
# what a reboot loads: the kernel, its modules, the driver's kernel modules (a user-space library alone is not)
REBOOT = re.compile(r"linux-(?:image|modules|modules-extra)-\d\S*|nvidia-driver-\d\S*|nvidia-dkms-\S+|"
                    r"linux-modules-nvidia-\S+|nvidia-kernel-\S+")
DPKG_FLAGS = "-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold"
UPGRADE_FLAGS = f"{DPKG_FLAGS} --with-new-pkgs"


@dataclass(frozen=True)
class Change:
    package: str
    old: str | None  # None: a new package (a new kernel's)
    new: str

    def line(self) -> str:
        return f"{self.package} {self.old or '(new)'} -> {self.new}"


@dataclass(frozen=True)
class Simulation:
    """What `apt-get upgrade` would change on a host, within its apt pins, and whether it asks for a reboot now."""

    changes: tuple[Change, ...]
    reboot_required: bool  # /var/run/reboot-required is there already
    removed: tuple[str, ...] = ()  # packages it would remove (an install's simulation)


END = "end of the simulation"  # its last line: an answer cut short is not an empty upgrade


def _off_grammar(line: str) -> bool:
    """An `Inst` or `Remv` line whose package or version is not Debian's (or not apt's usual line at all)."""
    found = INST.match(line) if line.startswith("Inst ") else REMV.match(line)
    if found is None:
        return True
    fields = found.groupdict()
    return not PACKAGE.fullmatch(fields["package"]) or any(
        fields.get(k) is not None and not VERSION.fullmatch(fields[k]) for k in ("old", "new"))


def parse_simulation(lines: list[str]) -> Simulation | Unreadable:
    """The fact's output: `Inst` (and `Remv`) lines, `reboot-required`, END; an apt error line, no END, or a name or
    version off Debian's grammar makes it unreadable (nothing is installed on a guess)."""
    source = "apt-get (simulated)"
    errors = [line for line in lines if line.startswith("E:")]
    if errors or END not in lines:
        return Unreadable(source, errors[0][:200] if errors else "its answer was cut short")
    odd = [line for line in lines if line.startswith(("Inst ", "Remv ")) and _off_grammar(line)]
    if odd:
        return Unreadable(source, f"{odd[0][:120]!r} names a package or version off Debian's grammar")
    changes = tuple(Change(m["package"], m["old"], m["new"]) for m in map(INST.match, lines) if m)
    removed = tuple(m["package"] for m in map(REMV.match, lines) if m)
    return Simulation(changes, "reboot-required" in lines, removed)


class UpgradeSimulation(FactBase):
    """`apt-get -s upgrade` after `apt-get update`: the packages an upgrade would change (pyinfra's apt facts list
    what is installed, not what would move), with the host's apt pins but sparkfleet's own as `pins` (the
    preferences file platform_pins renders; "": none), as the upgrade step writes them before apt runs.
    Refreshing the lists is its one change to the host."""

    def command(self, pins: str = ""):
        ours = os.path.basename(paths.PLATFORM_PINS)
        return ("apt-get update -q >/dev/null 2>&1 || echo 'E: apt-get update failed (run it on the host to see "
                f"why)'; d=$(mktemp -d) && cp -a {os.path.dirname(paths.PLATFORM_PINS)}/. \"$d\"/ 2>/dev/null; "
                f"rm -f \"$d\"/{ours}; " + (f"printf %s {shlex.quote(pins)} > \"$d\"/{ours}; " if pins else "") +
                f"apt-get -s -o Dir::Etc::PreferencesParts=\"$d\" {UPGRADE_FLAGS} upgrade 2>&1 | "
                f"grep -E '{SIMULATED}'; rm -rf \"$d\"; "
                f"test -e {paths.REBOOT_REQUIRED} && echo reboot-required; echo {END!r}")

    def process(self, output):
        return parse_simulation(output)

    @staticmethod
    def default():  # no answer at all (pyinfra gives a fact's default then): unreadable too
        return parse_simulation([])


def upstream(version: str) -> str:
    """A Debian version's upstream part: "1:580.95.99-0ubuntu1" -> "580.95.99" (what nvidia-smi reports)."""
    return version.split(":", 1)[-1].rsplit("-", 1)[0]


def platform_version(change: Change) -> tuple[str, str] | None:
    """("kernel", its `uname -r`) or ("NVIDIA driver", its version) for a change that moves one; None otherwise."""
    kernel = KERNEL.fullmatch(change.package)
    if kernel:
        return "kernel", kernel["release"]
    if DRIVER.fullmatch(change.package):
        return "NVIDIA driver", upstream(change.new)
    return None


def refused_changes(name: str, s: Settings, changes: tuple[Change, ...] | list[Change],
                    in_group: bool = False) -> list[str]:
    """One line per change to a kernel or driver a refused_* setting refuses (preflight's `refused_by`): the host,
    the package, the version, why and the fix."""
    lines = []
    refused = refused_lists(s, in_group)
    for change in changes:
        found = platform_version(change)
        for entries, setting in refused.get(found[0], []) if found else []:
            match = refused_by(found[1], entries)
            if match:
                lines.append(f"{name}: {change.package} {change.new} ({found[0]} {found[1]}) is refused ({setting} "
                             f"{match[0]!r}): {match[1]}: not installed; pin {change.package} to a version that is "
                             f"not refused (platform_pins), or take {match[0]!r} out of {setting} once checked")
    return lines


def needs_reboot(sim: Simulation) -> bool:
    """A reboot after the upgrade: the host asks for one already, or a kernel or driver module changes (its
    postinst asks for one too; the flag is read again after the upgrade)."""
    return sim.reboot_required or any(REBOOT.fullmatch(c.package) for c in sim.changes)


# the upgrade stage's operations, by name: `sparkfleet upgrade` reads its hosts' results by them (fleet/upgrade.py)
UPGRADE_OP = "Packages upgraded (exactly the checked versions, once apt offers just those again)"
REBOOT_OP = "Rebooted for the new kernel or driver (or as the host asked), and back over SSH"
REFUSED_OP = "Upgrade refused"  # an operation's name, or the start of the line checked_upgrade refuses with


def _targets(changes) -> list[QuoteString]:
    return [QuoteString(f"{c.package}={c.new}") for c in changes]


def install_command(changes) -> StringCommand:
    """apt-get install of each change's package at its checked version (nothing else named; `--`: never an
    option), and the new packages (a new kernel's) marked automatic again, as `apt-get upgrade` leaves them."""
    install = StringCommand(f"DEBIAN_FRONTEND=noninteractive apt-get -y -q {DPKG_FLAGS} install --", *_targets(changes))
    new = [QuoteString(c.package) for c in changes if c.old is None]
    return StringCommand(install, "&& apt-mark auto --", *new, ">/dev/null") if new else install


def recheck_command(changes) -> StringCommand:
    """That very install, simulated on the host as its lists are now (no refresh): what apt would do."""
    return StringCommand(f"apt-get -s {DPKG_FLAGS} install --", *_targets(changes),
                         f"2>&1 | grep -E '{SIMULATED}'; echo {shlex.quote(END)}")


def _few(items: list[str], most: int = 2) -> str:
    return ", ".join(items[:most]) + (f" (+{len(items) - most} more)" if len(items) > most else "")


def offered_problem(name: str, checked, offered: Simulation | Unreadable) -> str | None:
    """None when apt, asked again right before installing, would make exactly the `checked` changes; else the
    refusal's one line (what it offers beyond the check, what it no longer offers, what it would remove)."""
    head = f"{REFUSED_OP}: {name}: "
    if isinstance(offered, Unreadable):
        return (f"{head}apt, asked again right before installing: {offered.problem}; nothing installed: run "
                f"`sparkfleet upgrade` again once apt answers")
    want, have = set(checked), set(offered.changes)
    if want == have and not offered.removed:
        return None
    found = [f"now also {_few([c.line() for c in offered.changes if c not in want])}" if have - want else "",
             f"no longer offered: {_few([c.line() for c in checked if c not in have])}" if want - have else "",
             f"would remove {_few(list(offered.removed))}" if offered.removed else ""]
    return (f"{head}apt now offers another upgrade than the one checked (its lists changed since); nothing "
            f"installed: {'; '.join(f for f in found if f)}; run `sparkfleet upgrade` again: it checks what apt "
            f"offers now")


def _second_look(state, host, changes, problem: list[str]) -> bool:
    """Ask apt again (recheck_command) and keep the refusal's line, if any, for the operation's next command."""
    _, output = host.run_shell_command(recheck_command(changes))
    found = offered_problem(host.name, changes, parse_simulation(output.stdout_lines))
    if found:
        problem.append(found)
    return True


@operation(is_idempotent=False)
def checked_upgrade(changes):
    """Exactly `changes` installed (install_command), once apt, asked again on the host right before, offers just
    those; else the refusal's line on stderr and a failure, nothing installed. The second look runs when the
    operation does, never when it is planned."""
    changes, problem = tuple(changes), []
    yield FunctionCommand(_second_look, (changes, problem), {})
    if problem:
        yield StringCommand("printf '%s\\n'", QuoteString(problem[0]), ">&2; exit 1")
        return
    yield install_command(changes)
