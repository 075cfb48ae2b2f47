"""Holds on a front door's backends: who set a backend aside for a change, and whether that operation still runs.

A rollout's drain is held, by who made it and when (`Hold`, one line per backend in paths.FRONT_DOOR_HOLDS), and
its batch end drops the line. A hold whose operation is gone (`stale`) is put back by the next converge's front
door stage or rollout: HAProxy routes to it only once its checks pass, and that host's own converge brings its
release to the planned one and gates it. `status` names every backend out of rotation with what holds it
(`out_of_rotation`) and fails on one that nothing live holds (`door_ok`). Plain data here; the commands that
write and read the record on a front door are `runtime`'s.
"""

from __future__ import annotations

import os
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from sparkfleet.roles.haproxy import SERVER_NAME


OPERATIONS = ("rollout", "rollback", "upgrade")  # the operations that hold a backend out while they change its host
# Another controller's process cannot be asked: its hold counts as gone once older than this. A batch's drain,
# deploy (its model download included) and gate take far less; a hold this old is a controller that died.
HOLD_MAX_AGE_S = 6 * 3600
_HOLD_LINE = re.compile(f"(?P<backend>{SERVER_NAME.pattern}) (?P<operation>" + "|".join(OPERATIONS)
                        + r") (?P<controller>[A-Za-z0-9][A-Za-z0-9_.-]{0,252}) (?P<pid>[0-9]{1,10}) "
                        r"(?P<started>[0-9]{1,20}) (?P<since>[0-9]{1,12})")


@dataclass(frozen=True)
class Hold:
    """A backend set aside by an operation: which, on which controller, by which process (its pid and its start
    time, which tell a reused pid apart), since when (epoch seconds)."""

    backend: str
    operation: str
    controller: str
    pid: int
    started: int  # the process's start time in clock ticks after boot (/proc/PID/stat), 0 where unknown
    since: int

    def line(self) -> str:
        """Its line on the hold record (parse_holds reads it back)."""
        line = f"{self.backend} {self.operation} {self.controller} {self.pid} {self.started} {self.since}"
        if not _HOLD_LINE.fullmatch(line):
            raise ValueError(f"not a hold: {line!r}")
        return line

    def holder(self) -> dict:
        """Who holds it, for status: the operation, controller, pid and since (UTC)."""
        return {"operation": self.operation, "controller": self.controller, "pid": self.pid,
                "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.since))}


def parse_holds(record: str) -> dict[str, Hold]:
    """{backend: its hold} from a hold record read back from a front door: a line that is not a hold is skipped
    (data, never run); of two lines for one backend the later counts, as hold_command writes it."""
    holds = {}
    for line in record.splitlines():
        found = _HOLD_LINE.fullmatch(line.strip())
        if found:
            f = found.groupdict()
            holds[f["backend"]] = Hold(f["backend"], f["operation"], f["controller"], int(f["pid"]), int(f["started"]),
                                       int(f["since"]))
    return holds


def controller_name() -> str:
    """This controller's host name as a hold names it (anything outside its grammar becomes `_`)."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())[:253] or "controller"
    return name if name[0].isalnum() else f"c{name[:252]}"


def process_start(pid: int) -> int | None:
    """A process's start time (clock ticks after boot, field 22 of /proc/PID/stat); None when no such process
    runs, 0 where /proc cannot tell (not Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return 0
    except OSError:
        return 0
    fields = stat.rpartition(")")[2].split()
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else 0


def this_hold(backend: str, operation: str) -> Hold:
    """The hold this process makes on `backend` now."""
    pid = os.getpid()
    return Hold(backend, operation, controller_name(), pid, process_start(pid) or 0, int(time.time()))


def stale(hold: Hold, controller: str, now: float, start_of=None, max_age_s: float = HOLD_MAX_AGE_S) -> bool:
    """Whether the operation that made `hold` is gone: on this controller, its pid runs no more as the same
    process (another start time, asked of `start_of`, process_start by default; where the start time is unknown,
    a running pid counts as the same); on another, the hold is older than `max_age_s` (HOLD_MAX_AGE_S)."""
    if hold.controller != controller:
        return now - hold.since > max_age_s
    start = (start_of or process_start)(hold.pid)
    return start is None or bool(start and hold.started and start != hold.started)


def stale_holds(record: str | None, controller: str, now: float, start_of=None) -> list[Hold]:
    """The holds of a hold record (None: none) whose operation is gone, by backend name."""
    holds = parse_holds(record or "")
    return [h for _, h in sorted(holds.items()) if stale(h, controller, now, start_of)]


def out_of_rotation(states: dict[str, dict], controller: str, now: float, start_of=None) -> list[dict]:
    """Every backend out of rotation (set aside, draining, drained) in a front door's `states` (door_states),
    with why and whether something live holds it: a maintenance drain holds it; so does a live operation's hold;
    a gone operation's hold, or no record at all, does not."""
    found = []
    for name, row in sorted(states.items()):
        if row["state"] not in ("out", "draining", "drained"):
            continue
        hold = row.get("hold")
        if row["state"] == "drained" or row.get("recorded"):  # drained, or on its way out (draining)
            why, held = "maintenance drain: until `sparkfleet undrain`", True
        elif hold is None:
            why, held = "out with no record: nothing holds it", False
        else:
            who = hold.holder()
            held = not stale(hold, controller, now, start_of)
            by = f"{hold.operation} pid {hold.pid} on controller {hold.controller} since {who['since']}"
            why = f"held by {by}" if held else f"held by a {hold.operation} that is gone ({by})"
        found.append({"host": name, "state": row["state"], "reason": why, "held": held,
                      "holder": hold.holder() if hold else None})
    return found


def door_ok(door: dict) -> bool:
    """`status`'s rule for a front door: every front door answers, and nothing is out of rotation that nothing
    live holds (a maintenance drain and a running rollout's hold are held; a gone one's, or none, is not)."""
    return door["up"] and all(b["held"] for b in door.get("out_of_rotation", ()))
