"""A platform upgrade on one host, as plain logic: what `apt-get upgrade` would change (its simulation), which of
the new kernel or driver versions a refused_* setting refuses (preflight's matching), and whether the host then
needs a reboot. The fact reads the simulation; `sparkfleet upgrade` acts on it (`tasks/upgrade.py`).

What is installed is exactly what was checked: the lists may refresh between the simulation (planned) and the
install (after the drain and the canary's baseline), so the install names each simulated package at its simulated
version (`install_command`), and apt is asked again on the host right before (`checked_upgrade`): anything else it
offers then is refused (`offered_problem`), nothing installed. That second look and the install are one command on
the host, under apt's lists lock from before the one to after the other (`checked_command`, `host/apt_locked.py`),
so no refresh comes between them. Names and versions are apt's output, untrusted: off Debian's grammar the
simulation is unreadable, and each one reaches the shell quoted.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

from pyinfra import host
from pyinfra.api import FactBase, QuoteString, StringCommand, operation

from sparkfleet.contract import paths
from sparkfleet.contract.settings import Settings
from sparkfleet.host import apt_locked
from sparkfleet.host.apt_locked import (  # noqa: F401  (the parser's names, imported from here too)
    END,
    INST,
    LISTS_LOCK,
    LOCK_WAIT_S,
    PACKAGE,
    REFUSED_OP,
    REMV,
    SIMULATED,
    VERSION,
    Change,
    Simulation,
    offered_problem,
    read_simulation,
)
from sparkfleet.host.facts import Unreadable
from sparkfleet.host.preflight import refused_by, refused_lists

KERNEL = re.compile(r"linux-image-(?P<release>\d\S*)")  # the version `uname -r` reports once booted on it
DRIVER = re.compile(r"nvidia-driver-\d+(?:-server)?(?:-open)?")  # DGX OS's driver package, its version the driver's
# what a reboot loads: the kernel, its modules, the driver's kernel modules (a user-space library alone is not)
REBOOT = re.compile(r"linux-(?:image|modules|modules-extra)-\d\S*|nvidia-driver-\d\S*|nvidia-dkms-\S+|"
                    r"linux-modules-nvidia-\S+|nvidia-kernel-\S+")
DPKG_FLAGS = "-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold"
UPGRADE_FLAGS = f"{DPKG_FLAGS} --with-new-pkgs"


def parse_simulation(lines: list[str]) -> Simulation | Unreadable:
    """The fact's output: `Inst` (and `Remv`) lines, `reboot-required`, END; an apt error line, no END, or a name or
    version off Debian's grammar makes it unreadable (nothing is installed on a guess): apt_locked's one reader."""
    found = read_simulation(lines)
    return Unreadable("apt-get (simulated)", found) if isinstance(found, str) else found


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


def checked_command(name: str, changes, lock: str = LISTS_LOCK, wait_s: float = LOCK_WAIT_S) -> StringCommand:
    """One command on the host: under apt's lists lock (`lock`, waited for up to `wait_s`), apt asked again
    (recheck_command) and, only where it offers exactly `changes`, their install (install_command); else the
    refusal's line on stderr and exit 1, nothing installed. `host/apt_locked.py`'s own source runs it (`python3
    -c`), with each value one quoted argument."""
    checked = json.dumps([[c.package, c.old, c.new] for c in changes])
    return StringCommand("python3", "-c", QuoteString(Path(apt_locked.__file__).read_text()), QuoteString(name),
                         QuoteString(lock), str(float(wait_s)), QuoteString(checked),
                         QuoteString(recheck_command(changes).get_raw_value()),
                         QuoteString(install_command(changes).get_raw_value()))


@operation(is_idempotent=False)
def checked_upgrade(changes):
    """Exactly `changes` installed (install_command), once apt, asked again on the host right before, offers just
    those; else the refusal's line on stderr and a failure, nothing installed. The second look and the install are
    one command under apt's lists lock (checked_command): no list refresh between them."""
    yield checked_command(host.name, tuple(changes))
