"""A platform upgrade on one host, as plain logic: what `apt-get upgrade` would change (its simulation), which of
the new kernel or driver versions a refused_* setting refuses (preflight's matching), and whether the host then
needs a reboot. The fact reads the simulation; `sparkfleet upgrade` acts on it (`tasks/upgrade.py`)."""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass

from pyinfra.api import FactBase

from sparkfleet.contract import paths
from sparkfleet.contract.settings import Settings
from sparkfleet.host.facts import Unreadable
from sparkfleet.host.preflight import refused_by, refused_lists

# `apt-get -s upgrade`: "Inst nvidia-driver-580-open [580.95.05-1] (580.95.99-1 DGX:stable [arm64])"; no [old]: new
INST = re.compile(r"Inst (?P<package>\S+) (?:\[(?P<old>[^\]]+)\] )?\((?P<new>\S+)")
KERNEL = re.compile(r"linux-image-(?P<release>\d\S*)")  # the version `uname -r` reports once booted on it
DRIVER = re.compile(r"nvidia-driver-\d+(?:-server)?(?:-open)?")  # DGX OS's driver package, its version the driver's
# what a reboot loads: the kernel, its modules, the driver's kernel modules (a user-space library alone is not)
REBOOT = re.compile(r"linux-(?:image|modules|modules-extra)-\d\S*|nvidia-driver-\d\S*|nvidia-dkms-\S+|"
                    r"linux-modules-nvidia-\S+|nvidia-kernel-\S+")
UPGRADE_FLAGS = "-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold --with-new-pkgs"


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


END = "end of the simulation"  # its last line: an answer cut short is not an empty upgrade


def parse_simulation(lines: list[str]) -> Simulation | Unreadable:
    """The fact's output: `Inst` lines, `reboot-required`, END; an apt error line, or no END, makes it unreadable
    (nothing is installed on a guess)."""
    errors = [line for line in lines if line.startswith("E:")]
    if errors or END not in lines:
        return Unreadable("apt-get upgrade (simulated)", errors[0][:200] if errors else "its answer was cut short")
    changes = tuple(Change(m["package"], m["old"], m["new"]) for m in map(INST.match, lines) if m)
    return Simulation(changes, "reboot-required" in lines)


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
                f"grep -E '^(Inst|E:) '; rm -rf \"$d\"; "
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
UPGRADE_OP = "Packages upgraded (apt-get upgrade, within the apt pins)"
REBOOT_OP = "Rebooted for the new kernel or driver (or as the host asked), and back over SSH"
REFUSED_OP = "Upgrade refused"
