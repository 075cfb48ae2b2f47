"""Roll a release across a fleet batch by batch; undo it where it fails its health gate.

Two phases. Staging first: every host that will change gets its new release ready beside the running one while it
serves (`stage.py`: model files verified, engine image checked, preflight), all at once; a staging failure on any
host halts before anything is drained. Then the switch, batch by batch: drain, converge, gate, undrain, so a host is
out of rotation for its restart and gate, not its download.

Never more than one batch is changing at a time; more than `max_fail` failed hosts halt the rollout, and the hosts
not yet reached keep their release.
A tensor-parallel group is one unit: its members share a batch, and a failed
gate on any of them rolls every member back (one model runs on them all).

The speed gate (fleet/speed.py, unless `--no-speed-gate`): the canary, the first unit the rollout changes, is
measured after its health gate while still drained (its head); decode or TTFT worse than its previous release's
kept figure by more than `rollout_max_regression` rolls it back and halts the rollout. Without a kept figure the
running release is measured right after the drain, before the switch; where that fails too, the new release's
figure becomes the baseline. Only the canary is measured.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from sparkfleet.fleet.batches import batch_size
from sparkfleet.fleet.converge import HostResult, read_hosts, run_deploy
from sparkfleet.fleet.front_door.runtime import FrontDoorRuntime
from sparkfleet.roles.front_door.records import chat_backend
from sparkfleet.fleet.speed import ReachError, SpeedCheck, SpeedError
from sparkfleet.refused import FAILED, Refused

Unit = tuple[str, ...]  # what changes together: one host, or a group's members head first
# How long a batch waits for the front door to take back the hosts it needs in rotation (the previous batch's pass
# their checks within seconds of their return) before the rollout halts rather than drain a model's last backend.
BACK_IN_WAIT_S = 60


def members_of(plans) -> dict[str, Unit]:
    """{member: its group's members, head first} from the plans (single hosts are not in it)."""
    return {p.name: tuple(p.group.members) for p in plans if p.group}


def members_in_data(hosts: list[tuple[str, dict]]) -> dict[str, Unit]:
    """The same map read from the inventory's raw data, before any plan (to pick a --limit's whole group);
    the plan validates these lists afterwards."""
    return {name: tuple(data["tensor_parallel_hosts"]) for name, data in hosts if data.get("tensor_parallel_hosts")}


def whole_groups(selected: list[str], inventory: list[str], groups: dict[str, Unit]) -> list[str]:
    """`selected` plus every other member of their groups, in inventory order: one member is never
    changed, rolled back or judged alone."""
    wanted = {*selected, *(m for h in selected for m in groups.get(h, ()))}
    return [h for h in inventory if h in wanted]


def load_whole_groups(inventory: str, limit: str | None = None) -> list[tuple[str, dict]]:
    """The inventory's hosts (load_hosts), a `limit` widened to the whole group of each member it names."""
    from sparkfleet.controller.inventory import load_hosts

    everyone = load_hosts(inventory)
    if not limit:
        return everyone
    chosen = whole_groups([name for name, _ in load_hosts(inventory, limit)], [name for name, _ in everyone],
                          members_in_data(everyone))
    return [(name, data) for name, data in everyone if name in chosen]


@dataclass
class Before:
    """A batched command's (rollout's, upgrade's) fleet before its first batch: planned (`planned`), then read back
    (`read_before`)."""

    plans: list  # the Sparks' plans, in inventory order
    data: dict[str, dict]  # each planned host's inventory data, `--data` applied
    services: list[str]  # the service hosts planned: a rollout converges them after its batches, never drained
    groups: dict[str, Unit]  # members_of(plans)
    installed: dict[str, dict | None] = field(default_factory=dict)  # each Spark's release record, as read back
    speed: Any = None  # the speed gate (fleet/speed.py SpeedGate); None: measure nothing

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.plans]


def planned(inventory: str, limit: str | None, data: list[str], *, service_hosts: bool = True) -> Before:
    """The inventory (a `limit` widened to whole groups) planned from the project's lock with `--data` over it;
    `service_hosts` False: the Sparks only (a platform upgrade is theirs). SettingsError for a group only partly
    planned, before any host is read."""
    from sparkfleet.contract.settings import SettingsError
    from sparkfleet.controller.inventory import locked_plans, spark_hosts, with_data

    hosts = with_data(load_whole_groups(inventory, limit), data)
    plans = locked_plans(hosts if service_hosts else spark_hosts(hosts))
    before = Before([p for p in plans if not p.is_service], dict(hosts), [p.name for p in plans if p.is_service],
                    members_of(plans))
    try:
        units(before.names, before.groups)
    except ValueError as exc:
        raise SettingsError([str(exc)]) from None
    return before


def read_before(inventory: str, before: Before, speed_gate: bool = True) -> Before:
    """Each Spark's installed release record and (`speed_gate`) its kept speed figures, in one read; the speed gate
    built from them, the canary step's (`speed_gate`) baseline."""
    from sparkfleet.contract.paths import RELEASE_FILE, SPEED_FILE
    from sparkfleet.fleet.speed import SpeedGate
    from sparkfleet.host.facts import read_json_object

    found = read_hosts(inventory, before.names, lambda h: {
        "release": read_json_object(h, RELEASE_FILE).value or {},
        "speed": read_json_object(h, SPEED_FILE).value if speed_gate else None})
    installed = {name: (read or {}).get("release") for name, read in found.items()}
    speed = SpeedGate(inventory, {p.name: (p.settings, before.data[p.name]) for p in before.plans},
                      {name: (read or {}).get("speed") for name, read in found.items()}, installed) \
        if speed_gate else None
    return replace(before, installed=installed, speed=speed)


def units(hosts: list[str], groups: dict[str, Unit]) -> list[Unit]:
    """The rollout's units in `hosts` order: a single host alone, a group once (head first) where its
    first member appears. Raises ValueError when a group is only partly in `hosts`."""
    found: list[Unit] = []
    for h in hosts:
        unit = groups.get(h, (h,))
        missing = [m for m in unit if m not in hosts]
        if missing:
            raise ValueError(f"{h}: its group {unit_name(unit)} is only partly selected ({', '.join(missing)} "
                             "missing): roll out the whole group")
        if unit not in found:
            found.append(unit)
    return found


def unit_name(unit: Unit) -> str:
    """A host's own name; a group's "head+worker" (the plan's TensorParallelGroup.name)."""
    return "+".join(unit)


def batches(hosts: list, batch: str = "1", canary: bool = False) -> list[list]:
    """Split hosts (or units: see `units`) into batches: `batch` is a count ("2") or a share of the fleet ("25%")."""
    size = batch_size(batch, len(hosts))
    first, rest = (hosts[:1], hosts[1:]) if canary else ([], hosts)
    return ([first] if first else []) + [rest[i:i + size] for i in range(0, len(rest), size)]


def emptied_backends(rotation: dict[str, set[str]], batch) -> dict[str, set[str]]:
    """{backend: its servers in rotation} of each front door backend that draining (and restarting) `batch` would
    leave with no server in rotation. Every backend counts, not only the drained default one: a restarting engine
    leaves each backend it is in."""
    out = set(batch)
    return {backend: servers for backend, servers in rotation.items() if servers and servers <= out}


def last_backend_problems(doors: dict[str, dict[str, set[str]] | None], batch, serves: dict[str, str],
                          inventory: str) -> list[str]:
    """One line per chat model a front door would lose while the batch is out, though another host of the
    inventory serves it: a door routing a model to fewer hosts than serve it (converged from an older inventory,
    or those hosts out of rotation) would answer 503 for it the whole batch. `serves`: host -> the chat model it
    serves before and after this rollout (a host whose name changes is no peer: its old name goes by design). A
    chat backend's servers in rotation serve its model (its health check asks that model by name), so an emptied
    one loses its servers' model unless another chat backend's remaining servers all serve it. A model only the
    batch serves is no problem here (nothing could keep it in), nor a RAG route (model_N). A door that did not
    answer (None) is not judged."""
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
                                 f"--limit {door}), or bring them back in rotation, then roll out")
    return lines


def door_keeps_every_model(door, batch_hosts: list[str], serves: dict[str, str], inventory: str) -> str | None:
    """None once draining the batch leaves every model another host serves a backend in rotation on every front
    door, waiting up to BACK_IN_WAIT_S (the previous batch's hosts pass their checks); else the halt line."""
    deadline = time.monotonic() + BACK_IN_WAIT_S
    while True:
        problems = last_backend_problems(door.rotation(), batch_hosts, serves, inventory)
        if not problems:
            return None
        if time.monotonic() >= deadline:
            return f"halted: {problems[0]}"
        time.sleep(2)


@dataclass
class HostReport:
    host: str
    old_release: str | None
    new_release: str | None
    result: str  # converged | unchanged | rolled back | failed | unreachable | not reached
    seconds: float = 0.0  # its batch's deploy run (connect, plan, the drain, the operations)
    detail: str = ""
    group: str | None = None  # the tensor-parallel group's name ("spark-1+spark-2") for its members
    batch: int | None = None  # the batch it went in (1-based), None for a rollback run on its own
    staged_s: float | None = None  # the staging phase's time, for a host it prepared; None: nothing to stage
    out_of_rotation_s: float | None = None  # a front door's backend: from its drain to its return; None: not back
    speed: dict | None = None  # the canary's speed gate (SpeedCheck.to_dict); None: not measured here

    @property
    def ok(self) -> bool:
        return self.result in ("converged", "unchanged")


def judge(result: HostResult) -> str:
    if not result.connected:
        return "unreachable"
    if result.failed:
        return "failed"
    return "converged" if result.changed else "unchanged"


def unit_reports(unit: Unit, results: dict[str, HostResult], releases: dict[str, tuple[str | None, str | None]],
                 seconds: float, batch: int | None = None) -> list[HostReport]:
    """Each member's report from its deploy result (a single host: one report)."""
    group = unit_name(unit) if len(unit) > 1 else None
    return [HostReport(h, releases[h][0], releases[h][1], judge(results[h]), seconds,
                       "; ".join(results[h].failed), group, batch) for h in unit]


def service_steps(hosts: list[str], shared_doors: set[str]) -> list[list[str]]:
    """The service hosts' converges in order: the doors that share a floating address one at a time (a change that
    restarts a door's HAProxy never has them all down at once: keepalived moves the address off the one that is),
    then the others together."""
    rest = [h for h in hosts if h not in shared_doors]
    return [[h] for h in hosts if h in shared_doors] + ([rest] if rest else [])


def service_hosts_last(inventory: str, hosts: list[str], data: dict | None = None, log=print) -> list[HostReport]:
    """The service hosts (front doors, monitoring: no release of their own) converged once after every batch:
    their config (users, backends) follows the fleet's. Nothing of theirs is drained or gated."""
    if not hosts:
        return []
    log(f"service hosts: {', '.join(hosts)}")
    door = FrontDoorRuntime.of(inventory)
    shared = {name for name, _ in door.doors} if door.address else set()
    reports = []
    for step in service_steps(hosts, shared):
        started = time.monotonic()
        results = run_deploy(inventory, step, data)
        seconds = round(time.monotonic() - started, 1)
        reports += [HostReport(h, None, None, judge(r), seconds, "; ".join(r.failed)) for h, r in results.items()]
    return reports


def needs_rollback(unit: Unit, results: dict[str, HostResult]) -> list[str]:
    """The members whose new release failed its health gate: any one rolls the whole unit back."""
    return [h for h in unit if judge(results[h]) == "failed" and results[h].health_gate == "failed"]


def rolled_back(reports: list[HostReport], gate_failed: list[str], back: dict[str, HostResult],
                releases: dict[str, tuple[str | None, str | None]], reason: str | None = None) -> None:
    """Mark a unit's reports after its rollback: every member restored, or where it could not be. `reason`: why,
    when it was not a failed health gate (the speed gate's line)."""
    why = reason or f"health gate failed ({', '.join(gate_failed)})"
    for report in reports:
        result = back[report.host]
        if not result.ok:
            report.result = "failed"
            report.detail = f"{why} and rollback failed too: {result.failed}"
            continue
        report.result, report.new_release = "rolled back", releases[report.host][0]
        if reason:
            report.detail = f"{reason}; previous release restored on {'every member' if report.group else 'it'}"
        elif report.host in gate_failed:
            report.detail = "new release failed its health gate; previous release restored and healthy"
        else:
            report.detail = (f"{', '.join(gate_failed)} failed the health gate of the group {report.group}; "
                             "previous release restored on every member")


def to_stage(hosts: list[str], releases: dict[str, tuple[str | None, str | None]],
             groups: dict[str, Unit] | None = None, prepared: frozenset[str] | set[str] = frozenset()) -> list[str]:
    """The hosts a rollout stages, in `hosts` order: every member of a unit where any member's planned release is
    not its installed one (a group changes whole) and not every member holds it already (`prepared`, see
    `holds_what_it_needs`); a host that keeps its release has nothing to prepare."""
    return [h for unit in units(hosts, groups or {})
            if any(releases[m][0] != releases[m][1] for m in unit) and not all(m in prepared for m in unit)
            for h in unit]


def holds_what_it_needs(plan, installed: dict) -> bool:
    """Whether a host's installed release (its record, as the host tells it) already runs every model directory
    and the engine image the planned release needs: a release that changes only arguments or settings has nothing
    to fetch or pull, so staging it would cost a run and prepare nothing. A record that says otherwise (or none)
    is staged; one that lies only moves the fetch into the batch (longer out of rotation, never a wrong file:
    the converge verifies what it serves)."""
    services = installed.get("services") if isinstance(installed.get("services"), dict) else {}
    have = {installed.get("model_dir"), *(svc.get("model_dir") for svc in services.values() if isinstance(svc, dict))}
    want = {plan.model_dir, *(svc.model_dir for svc in plan.services)}
    images = {installed.get("image"), *(svc.get("image") for svc in services.values() if isinstance(svc, dict))}
    wanted = {plan.engine_ref, *(svc.engine_ref for svc in plan.services if svc.image)}  # a service's own too
    return bool(installed) and want <= have and wanted <= images


def not_reached(unit: Unit, releases: dict[str, tuple[str | None, str | None]], number: int | None,
                detail: str) -> list[HostReport]:
    """The reports of a unit the rollout halted before (it keeps its release): in batch `number`, or in none when
    the staging halted it."""
    group = unit_name(unit) if len(unit) > 1 else None
    return [HostReport(h, releases[h][0], releases[h][1], "not reached", detail=detail, group=group, batch=number)
            for h in unit]


def staging_halted(order: list[Unit], results: dict[str, HostResult],
                   releases: dict[str, tuple[str | None, str | None]], seconds: float) -> list[HostReport]:
    """Every host's report when staging failed somewhere: the failed ones name their failed steps, the rest were
    not reached; no host went into a batch, none was drained or switched."""
    failed = [h for h, r in results.items() if not r.ok]
    why = f"halted: staging failed on {', '.join(failed)}; no host was drained"
    reports = [r for unit in order for r in not_reached(unit, releases, None, why)]
    for r in reports:
        r.staged_s = seconds if r.host in results else None
        if r.host in failed:
            r.result = judge(results[r.host])
            why = results[r.host].said or results[r.host].failed
            r.detail = f"staging failed: {'; '.join(why)}; its release is unchanged"
    return reports


def canary_of(plan: list[list[Unit]], releases: dict[str, tuple[str | None, str | None]]) -> Unit | None:
    """The unit the speed gate judges: the first one, in batch order, whose release changes."""
    return next((unit for batch_units in plan for unit in batch_units
                 if any(releases[m][0] != releases[m][1] for m in unit)), None)


def baseline_now(speed, check: SpeedCheck, log) -> None:
    """The canary's running release has no kept figure: measure it now (drained, before its switch)."""
    started = time.monotonic()
    try:
        check.baseline, check.baseline_measured_now = speed.measure(check.host, running=True), True
        log(f"speed gate: {check.host}: no figure kept for {check.baseline_release}: measured it now, before the "
            f"switch: decode {check.baseline.decode_tokens_per_s:.1f} tok/s, TTFT {check.baseline.ttft_ms:.0f} ms")
    except SpeedError as exc:
        log(f"speed gate: {check.host}: the running release could not be measured ({exc}): the new release's "
            "figure becomes the baseline")
    check.seconds += time.monotonic() - started


def speed_gate(speed, check: SpeedCheck, log, then: str = "rolled back; halted") -> str | None:
    """Measure the canary's new release, judge it, keep the figures on the host; the halt line when it regressed
    (or could not be measured), None when it passes or the controller could not reach it. `then`: what the
    command does about it (a rollout rolls the canary back; an upgrade cannot, and leaves it drained)."""
    started = time.monotonic()
    try:
        check.measured = speed.measure(check.host)
        check.judge(speed.max_regression(check.host))
    except ReachError as exc:  # the controller's way to it failed, not the engine: nothing to judge
        check.line = f"{check.host}: not measured: {exc} (give it a controller_api_url, or --no-speed-gate)"
    except SpeedError as exc:
        check.verdict, check.line = "failed", f"{check.host}: the new release could not be measured: {exc}"
    check.seconds += time.monotonic() - started
    kept = {**({check.baseline_release: check.baseline} if check.baseline_measured_now else {}),
            **({check.release: check.measured} if check.measured else {})}
    if kept and not speed.keep(check.host, kept):
        log(f"speed gate: {check.host}: its speed record could not be written: the next rollout measures again")
    halt = f"{check.line}: {then}" if check.verdict in ("regressed", "failed") else None
    log(f"speed gate: {halt or check.line} ({check.seconds:.1f} s)")
    return halt


def rollout(inventory: str, hosts: list[str], releases: dict[str, tuple[str | None, str | None]], *,
            batch: str = "1", canary: bool = False, max_fail: int = 0, data: dict | None = None,
            groups: dict[str, Unit] | None = None, prepared: frozenset[str] | set[str] = frozenset(),
            speed=None, serves: dict[str, str] | None = None, log=print) -> list[HostReport]:
    """Drive deploy.py over `hosts` in batches; roll back units whose new release fails its health gate.

    `releases` maps each host to (its installed release id, the planned one); `groups` each member of a
    tensor-parallel group to its members (see `members_of`). Batches count units, and so does `max_fail`
    (a failed group is one failure). The front door drains each unit's first host: a worker is no backend.
    Before the first batch, the hosts `to_stage` names are staged in one run (those in `prepared` hold what their
    new release needs already); any failure there halts the rollout. `speed`: the speed gate (fleet/speed.py
    SpeedGate), None to skip it. `serves` (host -> the chat model it serves before and after): a batch that would
    drain the last backend in rotation of a model other hosts serve is refused before any host is touched (Refused),
    or, found at its turn, halts the rollout (`last_backend_problems`); None: not checked.
    """
    reports: list[HostReport] = []
    failures, halted = 0, None
    plan = batches(units(hosts, groups or {}), batch, canary)
    judged = canary_of(plan, releases) if speed else None
    door = FrontDoorRuntime.of(inventory)  # none: no drain
    door.put_back_stale(log)  # what an interrupted change left out; its hosts' batches bring their releases in line
    keep_models = bool(serves and door.doors)
    if keep_models:
        rotation = door.rotation()
        problems = [line for batch_units in plan
                    for line in last_backend_problems(rotation, [h for unit in batch_units for h in unit], serves,
                                                      inventory)]
        if problems:
            raise Refused(problems[0], FAILED)
    staged, staged_s = to_stage(hosts, releases, groups, prepared), None
    if staged:
        log(f"stage: {', '.join(staged)}: the new release prepared beside the running one, still serving")
        started = time.monotonic()
        results = run_deploy(inventory, staged, data, deploy_file="stage.py")
        staged_s = round(time.monotonic() - started, 1)
        if not all(r.ok for r in results.values()):
            log(f"stage: failed on {', '.join(h for h, r in results.items() if not r.ok)} after {staged_s:g} s: "
                "halted, no host drained")
            for h, r in results.items():
                for line in [] if r.ok else r.said or r.failed:
                    log(f"stage: {line if line.startswith(f'{h}: ') else f'{h}: {line}'}")
            return staging_halted([unit for batch_units in plan for unit in batch_units], results, releases, staged_s)
        log(f"stage: {len(staged)} hosts ready in {staged_s:g} s")
    for number, batch_units in enumerate(plan, 1):
        batch_hosts = [h for unit in batch_units for h in unit]
        if failures > max_fail or halted:
            why = halted or f"halted: {failures} failed > --max-fail {max_fail}"
            reports += [r for unit in batch_units for r in not_reached(unit, releases, number, why)]
            continue
        halted = door_keeps_every_model(door, batch_hosts, serves, inventory) if keep_models else None
        if halted:
            log(halted)
            reports += [r for unit in batch_units for r in not_reached(unit, releases, number, halted)]
            continue
        log(f"batch {number}/{len(plan)}: {', '.join(unit_name(unit) for unit in batch_units)}")
        started, drained, handed = time.monotonic(), [], []
        check = None
        if judged in batch_units:
            head = judged[0]
            check = SpeedCheck(head, releases[head][1], releases[head][0])
            check.baseline = speed.baseline(head, check.baseline_release)

        def drain():  # once the batch's deploy is planned, right before its operations run
            drained.append(time.monotonic())
            handed.append(door.hand_over(batch_hosts, log))  # a door among them: the floating address moves first
            door.drain([unit[0] for unit in batch_units], log, operation="rollout")
            if check and check.baseline is None and check.baseline_release:
                baseline_now(speed, check, log)

        results = run_deploy(inventory, batch_hosts, data, before_ops=drain)
        seconds = round(time.monotonic() - started, 1)
        back_in = []
        for unit in batch_units:
            found = unit_reports(unit, results, releases, seconds, number)
            gate_failed = needs_rollback(unit, results)
            if gate_failed:
                rolled_back(found, gate_failed, run_deploy(inventory, list(unit), data, deploy_file="rollback.py"),
                            releases)
            elif unit == judged and all(r.ok for r in found):
                halt = speed_gate(speed, check, log)
                if halt:
                    rolled_back(found, [], run_deploy(inventory, list(unit), data, deploy_file="rollback.py"),
                                releases, reason=halt)
                    halted = f"halted: the speed gate stopped the canary {unit_name(unit)}"
            if check and unit == judged:
                check.line = check.line or f"{check.host}: not measured: {found[0].result} ({found[0].detail})"
                found[0].speed = check.to_dict()
            if all(r.ok or r.result == "rolled back" for r in found):
                back_in.append(unit[0])  # failed: stays out
            failures += not all(r.ok for r in found)
            reports += found
        door.ready(back_in, log)
        for step in handed:
            door.rejoin(step, log)
        for r in reports[-len(batch_hosts):]:
            if door.doors and drained and r.host in back_in:
                r.out_of_rotation_s = round(time.monotonic() - drained[0], 1)
    for r in reports:
        r.staged_s = staged_s if r.host in staged else None
    return reports


def phases(reports: list[HostReport]) -> dict:
    """The rollout's two phases: staging (the hosts it prepared, all at once, and how long it took) and the switch
    (the batches it ran, one after the other, and their deploys' time)."""
    staged = [r for r in reports if r.staged_s is not None]
    switched = {r.batch: r.seconds for r in reports if r.batch is not None and r.result != "not reached"}
    return {"stage": {"hosts": [r.host for r in staged], "seconds": max((r.staged_s for r in staged), default=0.0)},
            "switch": {"batches": len(switched), "seconds": round(sum(switched.values()), 1)}}


def speed_summary(reports: list[HostReport], skipped: bool = False) -> dict:
    """The speed gate's outcome: skipped (`--no-speed-gate`), or each measured host's check (none: nothing the
    rollout changed was reached with a passing health gate)."""
    return {"skipped": skipped, "checks": [] if skipped else [r.speed for r in reports if r.speed]}


def report_json(reports: list[HostReport], speed_skipped: bool = False) -> dict:
    return {"hosts": [asdict(r) for r in reports], "phases": phases(reports),
            "speed_gate": speed_summary(reports, speed_skipped), "ok": all(r.ok for r in reports)}
