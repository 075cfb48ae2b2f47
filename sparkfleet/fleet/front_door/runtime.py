"""What the controller sends a front door host over SSH and reads back: HAProxy's runtime API (through its socket)
and the records beside it (their commands: roles/front_door/records.py); `FrontDoorRuntime` drives every front door
of an inventory at once (a rollout, an upgrade and a rollback).
"""

from __future__ import annotations

import csv
import io
import shlex
import time
from dataclasses import dataclass

from sparkfleet.contract import paths
from sparkfleet.contract.monitoring import FRONT_DOOR_GROUP
from sparkfleet.contract.settings import parse_settings
from sparkfleet.roles.front_door.address import Handover, handover
from sparkfleet.roles.front_door.holds import Hold, controller_name, parse_holds, stale, this_hold
from sparkfleet.roles.front_door.records import (
    BACKEND,
    back_command,
    drained_names,
    hold_command,
    put_back_command,
    runtime_command,
)

_STAT_MARK = "@show-stat"  # between the records and HAProxy's table in one answer (states)
_HOLDS_MARK = "@holds"  # between the drain record and the holds in that answer


def states_command() -> str:
    """What `states` asks a front door: its drain record, its holds, HAProxy's `show stat`, between marks."""
    return (f"cat {paths.FRONT_DOOR_DRAINED} 2>/dev/null; echo {_HOLDS_MARK}; cat {paths.FRONT_DOOR_HOLDS} "
            f"2>/dev/null; echo {_STAT_MARK}; {runtime_command('show stat')}")


def door_states(answer: str) -> dict[str, dict]:
    """One front door's answer to `states_command` -> its states, each with whether the drain record holds it
    ("recorded") and its hold ("hold": a Hold or None)."""
    records, _, stat = answer.partition(f"{_STAT_MARK}\n")
    record, _, held = records.partition(f"{_HOLDS_MARK}\n")
    holds, drained = parse_holds(held), drained_names(record)
    return {name: {**row, "recorded": name in drained, "hold": holds.get(name)}
            for name, row in backend_states(stat, drained).items()}


def backend_states(show_stat: str, drained: set[str] = frozenset()) -> dict[str, dict]:
    """HAProxy's `show stat` CSV -> {server: {"state": in|out|draining|down|drained, "sessions": n}}, of BACKEND's
    servers only: drain and its record address `BACKEND/host`, so another chat model's route (chat_N) is not
    listed, and `sparkfleet drain` refuses its hosts rather than claim a drain it cannot make.

    in: taking requests; draining: set aside, requests still running; out: set
    aside and idle (or in maintenance); drained: out, and held there by
    `sparkfleet drain` (in `drained`) until undrained; down: failing its health
    check.
    """
    states = {}
    for row in _server_rows(show_stat):
        if row["pxname"] != BACKEND:
            continue
        state = _server_state(row)
        if state == "out" and row["svname"] in drained:
            state = "drained"
        states[row["svname"]] = {"state": state, "sessions": int(row["scur"] or 0), "status": row["status"]}
    return states


def _server_rows(show_stat: str):
    """The servers' rows of HAProxy's `show stat` CSV (not a proxy's own FRONTEND or BACKEND line)."""
    for row in csv.DictReader(io.StringIO(show_stat.lstrip("# "))):
        if row.get("pxname") and row.get("svname") not in ("BACKEND", "FRONTEND", None):
            yield row


def _server_state(row: dict) -> str:
    """in, draining, out or down (backend_states) of one server's row."""
    status, sessions = row["status"], int(row["scur"] or 0)
    if "MAINT" in status or "NOLB" in status:
        return "out"
    if "DRAIN" in status:
        return "draining" if sessions else "out"
    return "in" if status.startswith("UP") else "down"


def in_rotation(show_stat: str) -> dict[str, set[str]]:
    """HAProxy's `show stat` CSV -> {backend: its servers taking requests}, of every backend (the default one, each
    other chat model's, each RAG route's): what a rollout must not leave empty (fleet/rollout.py)."""
    found: dict[str, set[str]] = {}
    for row in _server_rows(show_stat):
        servers = found.setdefault(row["pxname"], set())
        if _server_state(row) == "in":
            servers.add(row["svname"])
    return found


_HELD = "@held"


def holder_command(address: str) -> str:
    """Prints _HELD where this door holds the floating `address` (an IPv4Interface's text, validated by the
    settings) on an interface now, nothing otherwise."""
    ip = shlex.quote(f"inet {address.split('/')[0]}/")
    return f"ip -o -4 addr show 2>/dev/null | grep -qF -e {ip} && echo {_HELD}; true"


def door_address_command(running: bool) -> str:
    """keepalived on this door stopped (it hands the address over: VRRP's priority 0) or started (BACKUP)."""
    return f"systemctl {'start' if running else 'stop'} -- {paths.DOOR_ADDRESS_UNIT_NAME}"


def frontend_sessions(show_stat: str) -> int:
    """The requests (sessions) HAProxy's `api` frontend holds now, from `show stat`."""
    for row in csv.DictReader(io.StringIO(show_stat.lstrip("# "))):
        if row.get("pxname") == "api" and row.get("svname") == "FRONTEND":
            return int(row.get("scur") or 0)
    return 0


_CERT_MARK = "@certificate"  # before a door's certificate in one answer (survey)
_HOLDER_MARK = "@holder"  # before whether it holds the floating address
_STATES_MARK = "@states"  # before states_command's answer, last: its exit status is the answer's


def survey_command(address: str | None, tls: bool) -> str:
    """What `survey` asks a front door, each part after its mark: its certificate (tls), whether it holds
    `address` (where there is one), then states_command (a HAProxy that does not answer fails the command)."""
    parts = []
    if tls:
        parts += [f"echo {_CERT_MARK}", f"cat -- {paths.TLS_HOST_CERT} 2>/dev/null"]
    if address:
        parts += [f"echo {_HOLDER_MARK}", holder_command(address)]
    return "; ".join([*parts, f"echo {_STATES_MARK}", states_command()])


@dataclass(frozen=True)
class DoorSurvey:
    """The doors as `status` shows them. states: {door: {backend: state}} (None: it did not answer);
    certificates: {door: when its fleet certificate ends (pki.ends; None: none or unreadable)}, {} where the hops
    are plain; holder: the door holding the floating address (None: none, or no address)."""

    states: dict[str, dict[str, dict] | None]
    certificates: dict[str, str | None]
    holder: str | None


def parse_survey(answers: dict[str, str | None], tls: bool) -> DoorSurvey:
    """Each door's answer to survey_command -> a DoorSurvey (a door that did not answer: None, no certificate)."""
    from sparkfleet.roles.pki import ends

    states, certificates, held = {}, {}, []
    for door, text in answers.items():
        head, _, answer = ("\n" + (text or "")).partition(f"\n{_STATES_MARK}\n")
        states[door] = None if text is None else door_states(answer)
        head, _, holding = head.partition(f"\n{_HOLDER_MARK}\n")
        if tls:
            certificates[door] = ends(head.partition(f"\n{_CERT_MARK}\n")[2]) if text is not None else None
        if text is not None and _HELD in holding.split():
            held.append(door)
    return DoorSurvey(states, certificates, held[0] if held else None)


class FrontDoorRuntime:
    """The front doors of an inventory, driven over SSH: set backends aside and back, read their state.

    With no `front_door` group every method does nothing: a fleet without a
    front door rolls out as before.
    """

    def __init__(self, inventory: str, doors: list[tuple[str, dict]]):
        self.inventory = inventory
        self.doors = doors  # [(host name, merged data)]
        self.settings = settings = [parse_settings(name, data) for name, data in doors]
        self.drain_timeout_s = max((s.drain_timeout_s for s in settings), default=0)
        # the floating address the doors share (None: none; the settings refuse doors that disagree)
        self.address = settings[0].front_door_address if settings else None

    @classmethod
    def of(cls, inventory: str) -> FrontDoorRuntime:
        from sparkfleet.controller.inventory import group_hosts

        return cls(inventory, group_hosts(inventory, FRONT_DOOR_GROUP))

    def _run(self, *commands: str) -> dict[str, str | None]:
        """Send runtime commands to every front door; its answer, or None where it did not answer."""
        return self._shell(runtime_command(*commands))

    def _shell(self, command: str) -> dict[str, str | None]:
        """Run a shell command on every front door; its output, or None where it failed or did not answer."""
        if not self.doors:
            return {}
        from sparkfleet.fleet.converge import connected
        from sparkfleet.host.run import as_the_host_runs

        out: dict[str, str | None] = {}
        with connected(self.inventory, [name for name, _ in self.doors]) as (state, hosts):
            for host in hosts:
                if host in state.failed_hosts:
                    out[host.name] = None
                    continue
                ok, output = as_the_host_runs(host, command)
                out[host.name] = output.stdout if ok else None
        return out

    def _shell_on(self, names: list[str], command: str) -> dict[str, str | None]:
        """`_shell` on some of the doors only."""
        keep = [(n, d) for n, d in self.doors if n in names]
        if not keep:
            return {}
        return type(self)(self.inventory, keep)._shell(command) if len(keep) < len(self.doors) \
            else self._shell(command)

    def holder(self) -> str | None:
        """The door that holds the floating address now (None: none, or no floating address)."""
        if not self.address:
            return None
        held = [n for n, text in self._shell(holder_command(self.address)).items() if text and _HELD in text]
        return held[0] if held else None

    def hand_over(self, hosts: list[str], log=print, timeout_s: float = 15) -> Handover:
        """A planned change of `hosts` (a batch, an upgrade's step, a reboot): the address moves first, as
        `address.handover` says: their keepalived stopped, a door outside the change holding it, the door that held
        it drained (its own requests finished, up to drain_timeout_s). What `rejoin` undoes afterwards."""
        if not self.address or not any(n in hosts for n, _ in self.doors):
            return Handover()
        step = handover(hosts, [n for n, _ in self.doors], self.holder())
        if step.problem:
            log(f"front door address: {step.problem}")
            return step
        self._shell_on(list(step.release), door_address_command(running=False))
        log(f"front door address: keepalived stopped on {', '.join(step.release)}")
        if step.wait_for:
            deadline, holder = time.monotonic() + timeout_s, None
            while time.monotonic() < deadline:
                holder = self.holder()
                if holder in step.wait_for:
                    break
                time.sleep(0.5)
            log(f"front door address: {self.address} held by {holder}" if holder in step.wait_for else
                f"front door address: no other door took {self.address} within {timeout_s:g} s: going on")
        if step.drain:
            deadline = time.monotonic() + self.drain_timeout_s
            while time.monotonic() < deadline:
                answers = self._shell_on(list(step.drain), runtime_command("show stat"))
                if not any(text and frontend_sessions(text) for text in answers.values()):
                    break
                time.sleep(0.5)
            log(f"front door address: {', '.join(step.drain)} drained")
        return step

    def rejoin(self, step: Handover, log=print) -> None:
        """After the change: keepalived started again on the doors `hand_over` stopped (they stay BACKUP under
        nopreempt)."""
        if step.rejoin:
            self._shell_on(list(step.rejoin), door_address_command(running=True))
            log(f"front door address: keepalived back on {', '.join(step.rejoin)}")

    def survey(self) -> DoorSurvey:
        """What `status` shows of the doors, in one SSH round trip to each: their states (with the drain record),
        when each one's fleet TLS certificate ends (where the hops are TLS) and which holds the floating address."""
        tls = any(s.fleet_ca_cert and not s.backend_key_in_clear for s in self.settings)
        return parse_survey(self._shell(survey_command(self.address, tls)), tls)

    def states(self) -> dict[str, dict[str, dict] | None]:
        """{front door: {backend: state}} (None: that front door did not answer), its drain record read with it."""
        return {door: None if text is None else door_states(text)
                for door, text in self._shell(states_command()).items()}

    def rotation(self) -> dict[str, dict[str, set[str]] | None]:
        """{front door: {backend: its servers in rotation}} of every backend (None: that front door did not
        answer)."""
        return {door: None if text is None else in_rotation(text) for door, text in self._run("show stat").items()}

    def drain(self, hosts: list[str], log=print, operation: str | None = None) -> None:
        """Send no new requests to `hosts`, wait (up to drain_timeout_s) for theirs to finish, then take them out.
        For an `operation` (a rollout's), each is held first, by this process (this_hold), in the same command."""
        if not self.doors or not hosts:
            return
        timeout_s = self.drain_timeout_s
        drain = runtime_command(*(f"set server {BACKEND}/{h} state drain" for h in hosts))
        self._shell(f"{hold_command([this_hold(h, operation) for h in hosts])} && {drain}" if operation else drain)
        deadline = time.monotonic() + timeout_s
        while True:
            busy = {h for states in self.states().values() if states for h in hosts
                    if states.get(h, {}).get("sessions")}
            if not busy or time.monotonic() >= deadline:
                break
            time.sleep(0.5)
        if busy:
            log(f"front door: {', '.join(sorted(busy))} still had requests after drain_timeout_s={timeout_s:g}")
        self._run(*(f"set server {BACKEND}/{h} state maint" for h in hosts))
        log(f"front door: {', '.join(hosts)} out")

    def ready(self, hosts: list[str], log=print) -> None:
        """Put `hosts` back, their holds dropped; each takes requests once its health checks pass. A host
        `sparkfleet drain` set aside stays out (each front door's own record decides, in the same command)."""
        if not self.doors or not hosts:
            return
        self._put_back(back_command(hosts), hosts, log)

    def put_back_stale(self, log=print) -> list[str]:
        """Put back every backend held by an operation that is gone (stale), on each front door that still holds
        it so; the names put back (a rollout's first step)."""
        if not self.doors:
            return []
        now, controller = time.time(), controller_name()
        found = {row["hold"] for states in self.states().values() if states for row in states.values()
                 if row["hold"] and stale(row["hold"], controller, now)}
        names = sorted({h.backend for h in found})
        if names:
            log(f"front door: {', '.join(names)} held by an operation that is gone: putting back")
            self._put_back(put_back_command(sorted(found, key=Hold.line)), names, log)
        return names

    def _put_back(self, command: str, hosts: list[str], log) -> None:
        answers = self._shell(command)
        kept = {line[len("kept "):] for text in answers.values() if text for line in text.splitlines()
                if line.startswith("kept ")}
        if kept:
            log(f"front door: {', '.join(sorted(kept))} kept out: drained until `sparkfleet undrain`")
        back = [h for h in hosts if h not in kept]
        if back:
            log(f"front door: {', '.join(back)} back in")
