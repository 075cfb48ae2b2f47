"""A checked upgrade's last step on the host, in one command: apt asked again and the checked list installed, both
while this process holds apt's lists lock, so no list refresh (`apt-get update`: apt-daily, unattended-upgrades,
a person) can come between what was checked and what is installed.

apt's locks are fcntl (POSIX) record locks: `apt-get update` takes `/var/lib/apt/lists/lock` (and nothing of
dpkg's); an install takes dpkg's `lock-frontend` and `lock` and the archives' lock, never the lists'. So this
process takes the lists lock the way apt does (`fcntl.lockf`; `flock(1)` would not do: flock(2) locks and fcntl
locks do not see each other on Linux), waits for a running update to end (at most `wait_s`, else a refusal), runs
the simulation of that very install (`recheck`), compares it with what was checked (`offered_problem`, one rule
for host and controller), and only then the install (`install`), its own child, which takes dpkg's locks as ever.
A refresh tried meanwhile fails at once ("Could not get lock /var/lib/apt/lists/lock") and is apt's to retry.

Stdlib only and nothing of sparkfleet: `sparkfleet/host/upgrade.py` (`checked_command`) sends this file's own
source to the host's `python3 -c`, so the host needs no sparkfleet code of any version for it, and the controller
imports the same parser and rule (`parse_simulation`, `offered_problem` there).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass

# `apt-get -s upgrade`: "Inst nvidia-driver-580-open [580.95.05-1] (580.95.99-1 DGX:stable [arm64])"; no [old]: new
INST = re.compile(r"Inst (?P<package>\S+) (?:\[(?P<old>[^\]]+)\] )?\((?P<new>\S+)")
REMV = re.compile(r"Remv (?P<package>\S+)")  # what an install would remove (an upgrade never does)
# Debian policy 5.6.1 (a name, apt's ":arch" for a foreign one) and 5.6.12 (a version): what may reach apt's command
PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]+(?::[a-z0-9][a-z0-9-]*)?")
VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+~:-]*")
SIMULATED = "^(Inst|Remv|E:) "  # the lines a simulation's answer keeps (grep -E)
END = "end of the simulation"  # its last line: an answer cut short is not an empty upgrade
REFUSED_OP = "Upgrade refused"  # an operation's name, or the start of the line a refused install prints
LISTS_LOCK = "/var/lib/apt/lists/lock"  # apt's Dir::State::Lists lock: `apt-get update` holds it while it refreshes
LOCK_WAIT_S = 300  # a running list refresh is waited for this long (an update over a slow mirror), then refused


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


def _off_grammar(line: str) -> bool:
    """An `Inst` or `Remv` line whose package or version is not Debian's (or not apt's usual line at all)."""
    found = INST.match(line) if line.startswith("Inst ") else REMV.match(line)
    if found is None:
        return True
    fields = found.groupdict()
    return not PACKAGE.fullmatch(fields["package"]) or any(
        fields.get(k) is not None and not VERSION.fullmatch(fields[k]) for k in ("old", "new"))


def read_simulation(lines: list[str]) -> Simulation | str:
    """The simulation's lines (`Inst`, `Remv`, `reboot-required`, END) as a Simulation, or why they are unreadable:
    an apt error line, no END, or a name or version off Debian's grammar (nothing is installed on a guess)."""
    errors = [line for line in lines if line.startswith("E:")]
    if errors or END not in lines:
        return errors[0][:200] if errors else "its answer was cut short"
    odd = [line for line in lines if line.startswith(("Inst ", "Remv ")) and _off_grammar(line)]
    if odd:
        return f"{odd[0][:120]!r} names a package or version off Debian's grammar"
    changes = tuple(Change(m["package"], m["old"], m["new"]) for m in map(INST.match, lines) if m)
    removed = tuple(m["package"] for m in map(REMV.match, lines) if m)
    return Simulation(changes, "reboot-required" in lines, removed)


def _few(items: list[str], most: int = 2) -> str:
    return ", ".join(items[:most]) + (f" (+{len(items) - most} more)" if len(items) > most else "")


def offered_problem(name: str, checked, offered) -> str | None:
    """None when apt, asked again right before installing, would make exactly the `checked` changes; else the
    refusal's one line (what it offers beyond the check, what it no longer offers, what it would remove). `offered`:
    a Simulation, or why it is unreadable (a line, or anything with a `problem`: the controller's Unreadable)."""
    head = f"{REFUSED_OP}: {name}: "
    if not isinstance(offered, Simulation):
        problem = offered if isinstance(offered, str) else offered.problem
        return (f"{head}apt, asked again right before installing: {problem}; nothing installed: run "
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


def hold_lock(path: str, wait_s: float) -> int | None:
    """apt's lock at `path` taken as apt takes it (an fcntl write lock on the whole file), waiting while another
    process (a list refresh) holds it, at most `wait_s`; its descriptor (held until this process ends), or None."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(1)


def main(argv: list[str]) -> int:
    """NAME LOCK WAIT_S CHECKED_JSON RECHECK INSTALL: under LOCK, run RECHECK (a shell command printing the
    simulation's lines), and INSTALL (a shell command) only where it offers exactly CHECKED ([[package, old, new],
    ...]); else the refusal's line on stderr and exit 1, nothing installed."""
    name, lock, wait_s, checked_json, recheck, install = argv
    checked = tuple(Change(str(p), None if o is None else str(o), str(n)) for p, o, n in json.loads(checked_json))
    if hold_lock(lock, float(wait_s)) is None:
        print(f"{REFUSED_OP}: {name}: apt's lists ({lock}) stayed locked by another process (a list refresh) for "
              f"{float(wait_s):g} s; nothing installed: run `sparkfleet upgrade` again once it ends", file=sys.stderr)
        return 1
    answer = subprocess.run(["sh", "-c", recheck], capture_output=True, text=True, check=False).stdout
    problem = offered_problem(name, checked, read_simulation(answer.splitlines()))
    if problem:
        print(problem, file=sys.stderr)
        return 1
    sys.stdout.flush()
    return subprocess.run(["sh", "-c", install], check=False).returncode  # the lock still held: no refresh between


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
