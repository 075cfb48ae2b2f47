"""Changing a fleet batch by batch, written once for `rollout`, `upgrade` and `rollback` (`run_batches`): each
command supplies only what it does to a batch and how it judges it (a `Change`); the loop owns the rest.

Before the first batch, every backend an interrupted change left held is put back, and a batch that would drain the
last backend a front door has in rotation for a model another host serves is refused before any host is touched
(`last_backend_problems`). Then, batch by batch: found at its turn, that rule waits for hosts to come back, else
halts; once the batch's change is planned, right before its operations run, the floating door address moves off
the batch and its cohorts' heads are drained, held by the command; after the change, the cohorts that passed are put
back, the address's doors rejoin, and each head put back gets its time out of rotation. More than `max_fail`
failed cohorts, or a halt the change decided, leave the rest not reached.

A cohort is what changes together: one host, or a tensor-parallel group's members head first (its head is the
group's front door backend; the word is not a systemd unit's).

`--batch`: a count of hosts ("2") or a share of the fleet ("25%"), never 0 (`batch_size`); the command line checks it
before any plan (sparkfleet/commands/common.py `batch`), so this module stays light at import.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sparkfleet.contract.settings import SettingsError
from sparkfleet.refused import FAILED, Refused

Cohort = tuple[str, ...]  # what changes together: one host, or a group's members head first
# How long a batch waits for the front door to take back the hosts it needs in rotation (the previous batch's pass
# their checks within seconds of their return) before the command halts rather than drain a model's last backend.
BACK_IN_WAIT_S = 60


def batch_size(batch: str, hosts: int) -> int:
    """Hosts (or cohorts) per batch out of `hosts`; ValueError naming the fix for anything but N or N%."""
    match = re.fullmatch(r"(\d+)(%?)", batch.strip())
    if not match or int(match[1]) == 0:
        raise ValueError(f"--batch {batch!r}: give a number of hosts (e.g. 2) or a percentage (e.g. 25%)")
    return max(1, math.floor(hosts * int(match[1]) / 100)) if match[2] else int(match[1])


def batches(hosts: list, batch: str = "1", canary: bool = False) -> list[list]:
    """Split hosts (or cohorts: see `cohorts`) into batches: `batch` is a count ("2") or a share of the fleet
    ("25%"); `canary`: the first one alone first."""
    size = batch_size(batch, len(hosts))
    first, rest = (hosts[:1], hosts[1:]) if canary else ([], hosts)
    return ([first] if first else []) + [rest[i:i + size] for i in range(0, len(rest), size)]


def cohorts(hosts: list[str], groups: dict[str, Cohort]) -> list[Cohort]:
    """The cohorts of `hosts`, in their order: a single host alone, a group once (head first) where its first
    member appears. A group only partly in `hosts` is refused (SettingsError: the selection, not a bug)."""
    found: list[Cohort] = []
    for h in hosts:
        cohort = groups.get(h, (h,))
        missing = [m for m in cohort if m not in hosts]
        if missing:
            raise SettingsError([f"{h}: its group {cohort_name(cohort)} is only partly selected "
                                 f"({', '.join(missing)} missing): roll out the whole group"])
        if cohort not in found:
            found.append(cohort)
    return found


def cohort_name(cohort: Cohort) -> str:
    """A host's own name; a group's "head+worker" (the plan's TensorParallelGroup.name)."""
    return "+".join(cohort)


def group_of(cohort: Cohort) -> str | None:
    """The group's name for its members' reports; None for a single host."""
    return cohort_name(cohort) if len(cohort) > 1 else None


# --- the last backend of a model: never drained while another host serves it ----------------------------------------


def emptied_backends(rotation: dict[str, set[str]], batch) -> dict[str, set[str]]:
    """{backend: its servers in rotation} of each front door backend that draining (and restarting) `batch` would
    leave with no server in rotation. Every backend counts, not only the drained default one: a restarting engine
    leaves each backend it is in."""
    out = set(batch)
    return {backend: servers for backend, servers in rotation.items() if servers and servers <= out}


def last_backend_problems(doors: dict[str, dict[str, set[str]] | None], batch, serves: dict[str, str],
                          inventory: str, then: str = "roll out") -> list[str]:
    """One line per chat model a front door would lose while the batch is out, though another host of the
    inventory serves it: a door routing a model to fewer hosts than serve it (converged from an older inventory,
    or those hosts out of rotation) would answer 503 for it the whole batch. `serves`: host -> the chat model it
    serves before and after this change (a host whose name changes is no peer: its old name goes by design). A
    chat backend's servers in rotation serve its model (its health check asks that model by name), so an emptied
    one loses its servers' model unless another chat backend's remaining servers all serve it. A model only the
    batch serves is no problem here (nothing could keep it in), nor a RAG route (model_N). A door that did not
    answer (None) is not judged. `then`: the command, in the fix ("roll out", "upgrade", "roll back")."""
    from sparkfleet.roles.front_door.records import chat_backend

    out, lines = set(batch), []
    for door, rotation in doors.items():
        chat = {backend: servers for backend, servers in (rotation or {}).items() if chat_backend(backend)}
        left = [servers - out for servers in chat.values()]
        for backend, servers in emptied_backends(chat, batch).items():
            for model in sorted({serves[h] for h in servers if h in serves}):
                if any(kept and all(serves.get(h) == model for h in kept) for kept in left):
                    continue  # another backend still carries it
                peers = [h for h, served in serves.items() if served == model and h not in out]
                if peers:
                    lines.append(f"front door {door}: draining {', '.join(sorted(servers))} leaves its backend "
                                 f"{backend} ({model}) with no server in rotation, though {', '.join(peers)} serve "
                                 f"{model} too: converge the front door first (pyinfra -y {inventory} deploy.py "
                                 f"--limit {door}), or bring them back in rotation, then {then}")
    return lines


def door_keeps_every_model(door, batch_hosts: list[str], serves: dict[str, str], inventory: str,
                           then: str = "roll out") -> str | None:
    """None once draining the batch leaves every model another host serves a backend in rotation on every front
    door, waiting up to BACK_IN_WAIT_S (the previous batch's hosts pass their checks); else the halt line."""
    deadline = time.monotonic() + BACK_IN_WAIT_S
    while True:
        problems = last_backend_problems(door.rotation(), batch_hosts, serves, inventory, then)
        if not problems:
            return None
        if time.monotonic() >= deadline:
            return f"halted: {problems[0]}"
        time.sleep(2)


# --- the one loop ----------------------------------------------------------------------------------------------------


@dataclass
class Batch:
    """One batch as the loop hands it to a command's change: its number (1-based) of `of`, its cohorts, when it
    started; `halt`: set by the change to stop the command after this batch (the rollout's speed gate)."""

    number: int
    of: int
    cohorts: list[Cohort]
    started: float  # time.monotonic() at its start
    halt: str | None = None

    @property
    def hosts(self) -> list[str]:
        return [h for cohort in self.cohorts for h in cohort]

    @property
    def heads(self) -> list[str]:
        """The front door's backends: each cohort's first host (a worker is no backend)."""
        return [cohort[0] for cohort in self.cohorts]

    def seconds(self) -> float:
        """Since the batch started (its connect and plan, the drain, what the change ran so far)."""
        return round(time.monotonic() - self.started, 1)


@dataclass
class Change:
    """What a command does to its batches, and how it judges them: all the loop asks of it. Its reports need `host`,
    `ok` and `out_of_rotation_s`.

    `run(batch, drain)` changes the batch, calling `drain()` once, right before its operations run (pyinfra's
    `before_ops`: the hosts connected, the change planned), and returns each cohort's reports; `not_reached(cohort,
    number, why)` the reports of a cohort the command halted before; `back_in(reports)` whether a cohort goes back
    into rotation (default: every report ok; a failed cohort stays drained, held). A cohort with a report not ok
    counts as one failure. `prepare()`, before the first batch (the rollout's staging): reports that end the
    command there, or None to go on."""

    operation: str  # the hold's name on each drained backend: rollout | upgrade | rollback
    then: str  # the command as a refusal's fix names it: "roll out", "upgrade", "roll back"
    run: Callable[[Batch, Callable[[], None]], dict[Cohort, list]]
    not_reached: Callable[[Cohort, int, str], list]
    back_in: Callable[[list], bool] = lambda reports: all(r.ok for r in reports)
    prepare: Callable[[], list | None] | None = None


def refuse_last_backends(door, plan: list[list[Cohort]], serves: dict[str, str], inventory: str,
                         then: str) -> None:
    """Refused (exit 1), before any host is touched, where a batch of `plan` would drain the last backend a front
    door has in rotation for a model another host serves: one line naming the door, the hosts, the model, the fix."""
    rotation = door.rotation()
    problems = [line for batch in plan
                for line in last_backend_problems(rotation, [h for cohort in batch for h in cohort], serves,
                                                  inventory, then)]
    if problems:
        raise Refused(problems[0], FAILED)


def run_batches(door, inventory: str, plan: list[list[Cohort]], change: Change, *, max_fail: int = 0,
                serves: dict[str, str] | None = None, log=print) -> list[Any]:
    """Run `change` over `plan` (batches of cohorts) behind `door` (fleet/front_door/runtime.py FrontDoorRuntime;
    none: nothing drained), one batch at a time; every report, in batch order. `serves` (host -> the chat model it
    serves before and after): the last-backend rule (`refuse_last_backends`, `door_keeps_every_model`); None: not
    checked. Refused before any host is touched, as the module says."""
    door.put_back_stale(log)  # what an interrupted change left out; its hosts' changes bring them in line
    keep_models = bool(serves and door.doors)
    if keep_models:
        refuse_last_backends(door, plan, serves, inventory, change.then)
    ended = change.prepare() if change.prepare else None
    if ended is not None:
        return ended
    reports: list = []
    failures, halted = 0, None
    for number, batch_cohorts in enumerate(plan, 1):
        if failures > max_fail or halted:
            why = halted or f"halted: {failures} failed > --max-fail {max_fail}"
            reports += [r for cohort in batch_cohorts for r in change.not_reached(cohort, number, why)]
            continue
        hosts = [h for cohort in batch_cohorts for h in cohort]
        halted = door_keeps_every_model(door, hosts, serves, inventory, change.then) if keep_models else None
        if halted:
            log(halted)
            reports += [r for cohort in batch_cohorts for r in change.not_reached(cohort, number, halted)]
            continue
        log(f"batch {number}/{len(plan)}: {', '.join(cohort_name(cohort) for cohort in batch_cohorts)}")
        batch, drained, handed = Batch(number, len(plan), batch_cohorts, time.monotonic()), [], []

        def drain(batch=batch, drained=drained, handed=handed):
            drained.append(time.monotonic())
            handed.append(door.hand_over(batch.hosts, log))  # a door among them: the floating address moves first
            door.drain(batch.heads, log, operation=change.operation)

        found = change.run(batch, drain)
        back_in = [cohort[0] for cohort in batch_cohorts if change.back_in(found[cohort])]
        failures += sum(not all(r.ok for r in found[cohort]) for cohort in batch_cohorts)
        halted = batch.halt
        door.ready(back_in, log)
        for step in handed:
            door.rejoin(step, log)
        for cohort in batch_cohorts:
            for r in found[cohort]:
                if door.doors and drained and r.host in back_in:
                    r.out_of_rotation_s = round(time.monotonic() - drained[0], 1)
            reports += found[cohort]
    return reports
