"""Roll a release across a fleet batch by batch; undo it where it fails its health gate.

Two phases. Staging first: every host that will change gets its new release ready beside the running one while it
serves (`stage.py`: model files verified, engine image checked, preflight), all at once; a staging failure on any
host halts before anything is drained. Then the switch, batch by batch: drain, converge, gate, undrain, so a host is
out of rotation for its restart and gate, not its download.

Never more than one batch is changing at a time; more than `max_fail` failed hosts halt the rollout, and the hosts
not yet reached keep their release.
A tensor-parallel group is one cohort: its members share a batch, and a failed
gate on any of them rolls every member back (one model runs on them all). The batches run through the loop rollout,
upgrade and rollback share (fleet/batches.py `run_batches`: the drain, the address hand-over, the last-backend rule,
the timing); this module says what a rollout does to a batch and how it judges it, and what a
rollback does (`rollback`: every host it selects in one batch).

The speed gate (fleet/speed.py, unless `--no-speed-gate`): the canary, the first cohort the rollout changes, is
measured after its health gate while still drained (its head); decode or TTFT worse than its previous release's
kept figure by more than `rollout_max_regression` rolls it back and halts the rollout. Without a kept figure the
running release is measured right after the drain, before the switch; where that fails too, the new release's
figure becomes the baseline. Only the canary is measured.

The quality gate (fleet/quality.py QualityGate, unless `--no-quality-gate`; docs/quality.md, "The gate in a rollout
and an upgrade"): after the health and speed gates, still drained, the canary's head is asked the probe suite on its
new release and judged against the baseline of the release it replaces (the host's quality record; where none is
kept, the running release is evaluated right after the drain, before the switch, and kept as its baseline). A probe
that passed and fails now, a score below the baseline by more than `quality_margin`, or a model the new release
serves that could not be evaluated (down, 5xx, out of reach: the health gate passed, so that is no pass) rolls the
canary back and halts the rollout, in one line naming the host, the model, the probe, both answers and the
override. The new release's evaluation is kept as its baseline only when it passed.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from sparkfleet.fleet.batches import Batch, Change, Cohort, batches, cohort_name, cohorts, group_of, run_batches
from sparkfleet.fleet.converge import HostResult, read_hosts, run_deploy
from sparkfleet.fleet.front_door.runtime import FrontDoorRuntime
from sparkfleet.fleet.speed import ReachError, SpeedCheck, SpeedError

def members_of(plans) -> dict[str, Cohort]:
    """{member: its group's members, head first} from the plans (single hosts are not in it)."""
    return {p.name: tuple(p.group.members) for p in plans if p.group}


def members_in_data(hosts: list[tuple[str, dict]]) -> dict[str, Cohort]:
    """The same map read from the inventory's raw data, before any plan (to pick a --limit's whole group);
    the plan validates these lists afterwards."""
    return {name: tuple(data["tensor_parallel_hosts"]) for name, data in hosts if data.get("tensor_parallel_hosts")}


def whole_groups(selected: list[str], inventory: list[str], groups: dict[str, Cohort]) -> list[str]:
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
    groups: dict[str, Cohort]  # members_of(plans)
    installed: dict[str, dict | None] = field(default_factory=dict)  # each Spark's release record, as read back
    speed: Any = None  # the speed gate (fleet/speed.py SpeedGate); None: measure nothing
    quality: Any = None  # the quality gate (fleet/quality.py QualityGate); None: evaluate nothing
    # the chat model each engine Spark a `limit` left out serves, by its settings (`served_names`): the peers that
    # keep a model in rotation while the selection's batches are out
    peers: dict[str, str] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.plans]


def planned(inventory: str, limit: str | None, data: list[str], *, service_hosts: bool = True) -> Before:
    """The inventory (a `limit` widened to whole groups) planned from the project's lock with `--data` over it;
    `service_hosts` False: the Sparks only (a platform upgrade is theirs). SettingsError for a group only partly
    planned, before any host is read."""
    from sparkfleet.controller.inventory import load_hosts, locked_plans, spark_hosts, with_data

    hosts = with_data(load_whole_groups(inventory, limit), data)
    plans = locked_plans(hosts if service_hosts else spark_hosts(hosts))
    chosen = {name for name, _ in hosts}
    left_out = [(n, d) for n, d in with_data(spark_hosts(load_hosts(inventory)), data) if n not in chosen] \
        if limit else []
    before = Before([p for p in plans if not p.is_service], dict(hosts), [p.name for p in plans if p.is_service],
                    members_of(plans), peers=served_names(left_out))
    cohorts(before.names, before.groups)  # a group only partly selected is refused here, before any host is read
    return before


def read_before(inventory: str, before: Before, speed_gate: bool = True, quality_gate: bool = False,
                probes: str | None = None) -> Before:
    """Each Spark's installed release record, (`speed_gate`) its kept speed figures and (`quality_gate`) its quality
    record, in one read; the gates built from them, the canary step's baselines. `probes`: a suite file over each
    host's `quality_probes`; every host's suite is read here, so a file that does not parse is refused before any
    host is touched."""
    from sparkfleet.contract.paths import QUALITY_FILE, RELEASE_FILE, SPEED_FILE
    from sparkfleet.fleet.speed import SpeedGate
    from sparkfleet.host.facts import read_json_object

    found = read_hosts(inventory, before.names, lambda h: {
        "release": read_json_object(h, RELEASE_FILE).value or {},
        "speed": read_json_object(h, SPEED_FILE).value if speed_gate else None,
        "quality": read_json_object(h, QUALITY_FILE).value if quality_gate else None})
    installed = {name: (read or {}).get("release") for name, read in found.items()}
    hosts = {p.name: (p.settings, before.data[p.name]) for p in before.plans}
    speed = SpeedGate(inventory, hosts, {name: (read or {}).get("speed") for name, read in found.items()},
                      installed) if speed_gate else None
    quality = None
    if quality_gate:
        from sparkfleet.controller.inventory import load_hosts
        from sparkfleet.fleet.quality import QualityGate
        from sparkfleet.roles.pki import hosts_ca

        ca = hosts_ca([(name, before.data.get(name, data)) for name, data in load_hosts(inventory)])
        quality = QualityGate(inventory, hosts, {name: (read or {}).get("quality") for name, read in found.items()},
                              installed, ca=ca, probes=probes)
        for name in hosts:
            quality.suite(name)
    return replace(before, installed=installed, speed=speed, quality=quality)


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
    quality: dict | None = None  # the canary's quality gate (QualityCheck.to_dict); None: not evaluated here

    @property
    def ok(self) -> bool:
        return self.result in ("converged", "unchanged")


def judge(result: HostResult) -> str:
    if not result.connected:
        return "unreachable"
    if result.failed:
        return "failed"
    return "converged" if result.changed else "unchanged"


def cohort_reports(cohort: Cohort, results: dict[str, HostResult],
                   releases: dict[str, tuple[str | None, str | None]], seconds: float,
                   batch: int | None = None) -> list[HostReport]:
    """Each member's report from its deploy result (a single host: one report)."""
    return [HostReport(h, releases[h][0], releases[h][1], judge(results[h]), seconds,
                       "; ".join(results[h].failed), group_of(cohort), batch) for h in cohort]


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


def needs_rollback(cohort: Cohort, results: dict[str, HostResult]) -> list[str]:
    """The members whose new release failed its health gate: any one rolls the whole cohort back."""
    return [h for h in cohort if judge(results[h]) == "failed" and results[h].health_gate == "failed"]


def rolled_back(reports: list[HostReport], gate_failed: list[str], back: dict[str, HostResult],
                releases: dict[str, tuple[str | None, str | None]], reason: str | None = None) -> None:
    """Mark a cohort's reports after its rollback: every member restored, or where it could not be. `reason`: why,
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
             groups: dict[str, Cohort] | None = None, prepared: frozenset[str] | set[str] = frozenset()) -> list[str]:
    """The hosts a rollout stages, in `hosts` order: every member of a cohort where any member's planned release is
    not its installed one (a group changes whole) and not every member holds it already (`prepared`, see
    `holds_what_it_needs`); a host that keeps its release has nothing to prepare."""
    return [h for cohort in cohorts(hosts, groups or {})
            if any(releases[m][0] != releases[m][1] for m in cohort) and not all(m in prepared for m in cohort)
            for h in cohort]


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


def not_reached(cohort: Cohort, releases: dict[str, tuple[str | None, str | None]], number: int | None,
                detail: str) -> list[HostReport]:
    """The reports of a cohort the rollout halted before (it keeps its release): in batch `number`, or in none when
    the staging halted it."""
    return [HostReport(h, releases[h][0], releases[h][1], "not reached", detail=detail, group=group_of(cohort),
                       batch=number) for h in cohort]


def staging_halted(order: list[Cohort], results: dict[str, HostResult],
                   releases: dict[str, tuple[str | None, str | None]], seconds: float) -> list[HostReport]:
    """Every host's report when staging failed somewhere: the failed ones name their failed steps, the rest were
    not reached; no host went into a batch, none was drained or switched."""
    failed = [h for h, r in results.items() if not r.ok]
    why = f"halted: staging failed on {', '.join(failed)}; no host was drained"
    reports = [r for cohort in order for r in not_reached(cohort, releases, None, why)]
    for r in reports:
        r.staged_s = seconds if r.host in results else None
        if r.host in failed:
            r.result = judge(results[r.host])
            why = results[r.host].said or results[r.host].failed
            r.detail = f"staging failed: {'; '.join(why)}; its release is unchanged"
    return reports


def canary_of(plan: list[list[Cohort]], releases: dict[str, tuple[str | None, str | None]]) -> Cohort | None:
    """The cohort the speed gate judges: the first one, in batch order, whose release changes."""
    return next((cohort for batch_cohorts in plan for cohort in batch_cohorts
                 if any(releases[m][0] != releases[m][1] for m in cohort)), None)


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


@dataclass
class QualityCheck:
    """The quality gate's outcome on one host (a canary's head), as the report gives it."""

    host: str
    release: str | None  # the evaluated (new) release
    baseline_release: str | None  # the release it replaces (an upgrade: the same release, on the old platform)
    verdict: str = "not evaluated"  # passed | regressed | baseline | not evaluated
    baseline: dict | None = None  # {model: Evaluation} of the baseline release; None: none kept nor measured
    baseline_measured_now: bool = False  # none was kept: the running release evaluated before the switch
    measured: dict | None = None  # {model: Evaluation} of the new release
    seconds: float = 0.0  # the evaluations' time (what the gate added to the canary)
    line: str = ""
    kept: bool | None = None  # the new release's evaluation written to the host's record; None: not kept

    def to_dict(self) -> dict:
        def models(found: dict | None) -> dict | None:
            return None if found is None else {m: {"evaluated": e.evaluated, "score": e.score, "failed": e.failed()}
                                               for m, e in found.items()}

        return {"host": self.host, "verdict": self.verdict, "release": self.release, "measured": models(self.measured),
                "baseline": None if self.baseline is None else {
                    "release": self.baseline_release, "models": models(self.baseline),
                    "source": "measured now" if self.baseline_measured_now else "quality record"},
                "seconds": round(self.seconds, 1), "kept": self.kept, "line": self.line}


def _not_evaluated(evaluation) -> str:
    return next((r.why for r in evaluation.results if r.verdict == "not_evaluated" and r.why), "no probe answered")


def quality_baseline_now(quality, check: QualityCheck, log) -> None:
    """The canary's running release has no kept baseline: evaluate it now (drained, before its switch); where no
    model of it answers, the new release is judged on its own (its absolute probes; its evaluation the baseline)."""
    started = time.monotonic()
    found = quality.measure(check.host, running=True)
    check.seconds += time.monotonic() - started
    if any(e.evaluated for e in found.values()):
        check.baseline, check.baseline_measured_now = found, True
        scores = ", ".join(f"{m} {e.score:.2f}" for m, e in found.items() if e.evaluated and e.score is not None)
        log(f"quality gate: {check.host}: no baseline kept for {check.baseline_release}: evaluated it now, before the "
            f"switch: {scores} ({check.seconds:.1f} s)")
    else:
        why = "; ".join(f"{m}: {_not_evaluated(e)}" for m, e in found.items()) or "it serves no model"
        log(f"quality gate: {check.host}: the running release could not be evaluated ({why}): the new release's "
            "evaluation becomes the baseline")


def quality_gate(quality, check: QualityCheck, log, then: str = "rolled back; halted") -> str | None:
    """Evaluate the canary's new release, judge it against the release it replaces, keep what may be kept; the halt
    line when it regressed or a model it serves could not be evaluated, None when it passed. `then`: what the
    command does about a halt (a rollout rolls the canary back; an upgrade cannot, and leaves it drained).

    Kept on the host: a baseline measured now (the replaced release's, whatever the verdict), and the new release's
    evaluation only when the gate passed (a failing one must never become its release's baseline)."""
    from sparkfleet.fleet.quality import OVERRIDE  # loaded already: `quality` is its QualityGate

    started = time.monotonic()
    check.measured = found = quality.measure(check.host, baseline=check.baseline)
    check.seconds += time.monotonic() - started
    halt = quality.judge(check.host, check.baseline, found, then)
    lost = [m for m, e in found.items() if not e.evaluated and m not in quality.on_demand(check.host)]
    if halt:
        check.verdict, check.line = "regressed", halt
    elif lost:
        check.verdict = "not evaluated"
        halt = check.line = (f"{check.host}: {lost[0]}: not evaluated on the new release after its health gate passed "
                             f"({_not_evaluated(found[lost[0]])}); {then}; {OVERRIDE}")
    else:
        judged = [m for m, e in found.items() if e.evaluated and (check.baseline or {}).get(m) is not None
                  and check.baseline[m].evaluated]
        scores = ", ".join(f"{m} {e.score:.2f}" + (f" vs {check.baseline[m].score:.2f} before" if m in judged else "")
                           for m, e in found.items() if e.evaluated and e.score is not None)
        check.verdict = "passed" if judged else "baseline"
        check.line = (f"{check.host}: {scores or 'no model evaluated'}: "
                      + ("no probe that passed before fails, within quality_margin" if judged else
                         "no baseline to judge against, this evaluation is the baseline")
                      + (" (baseline evaluated now)" if check.baseline_measured_now else ""))
    if check.baseline_measured_now and check.baseline_release and not quality.keep(
            check.host, check.baseline_release, check.baseline):
        log(f"quality gate: {check.host}: its quality record could not be written: the next rollout evaluates again")
    if check.verdict in ("passed", "baseline") and check.release and any(e.evaluated for e in found.values()):
        check.kept = quality.keep(check.host, check.release, found)
        if not check.kept:
            log(f"quality gate: {check.host}: its quality record could not be written: {check.release} has no "
                "baseline kept")
    log(f"quality gate: {check.line} ({check.seconds:.1f} s)")
    return halt


def rollout(inventory: str, hosts: list[str], releases: dict[str, tuple[str | None, str | None]], *,
            batch: str = "1", canary: bool = False, max_fail: int = 0, data: dict | None = None,
            groups: dict[str, Cohort] | None = None, prepared: frozenset[str] | set[str] = frozenset(),
            speed=None, quality=None, serves: dict[str, str] | None = None, log=print) -> list[HostReport]:
    """Drive deploy.py over `hosts` in batches (fleet/batches.py `run_batches`); roll back cohorts whose new release
    fails its health gate.

    `releases` maps each host to (its installed release id, the planned one); `groups` each member of a
    tensor-parallel group to its members (see `members_of`). Batches count cohorts, and so does `max_fail`
    (a failed group is one failure). The front door drains each cohort's first host: a worker is no backend.
    Before the first batch, the hosts `to_stage` names are staged in one run (those in `prepared` hold what their
    new release needs already); any failure there halts the rollout. `speed`: the speed gate (fleet/speed.py
    SpeedGate), None to skip it; `quality`: the quality gate (fleet/quality.py QualityGate), after the speed gate,
    None to skip it. `serves` (host -> the chat model it serves before and after, `chat_models`): a
    batch that would drain the last backend in rotation of a model other hosts serve is refused before any host is
    touched (Refused), or, found at its turn, halts the rollout; None: not checked.
    """
    plan = batches(cohorts(hosts, groups or {}), batch, canary)
    judged = canary_of(plan, releases) if speed or quality else None
    staged, staged_s = to_stage(hosts, releases, groups, prepared), []

    def stage() -> list[HostReport] | None:
        """The staging phase, all at once before the first drain; the reports that end the rollout where it failed."""
        if not staged:
            return None
        log(f"stage: {', '.join(staged)}: the new release prepared beside the running one, still serving")
        started = time.monotonic()
        results = run_deploy(inventory, staged, data, deploy_file="stage.py")
        staged_s.append(round(time.monotonic() - started, 1))
        if not all(r.ok for r in results.values()):
            log(f"stage: failed on {', '.join(h for h, r in results.items() if not r.ok)} after {staged_s[0]:g} s: "
                "halted, no host drained")
            for h, r in results.items():
                for line in [] if r.ok else r.said or r.failed:
                    log(f"stage: {line if line.startswith(f'{h}: ') else f'{h}: {line}'}")
            return staging_halted([c for batch_cohorts in plan for c in batch_cohorts], results, releases, staged_s[0])
        log(f"stage: {len(staged)} hosts ready in {staged_s[0]:g} s")
        return None

    def switch(batch: Batch, drain) -> dict[Cohort, list[HostReport]]:
        """One batch: deploy.py, a cohort whose health gate failed rolled back, the canary measured and evaluated."""
        check = answers = None
        if judged in batch.cohorts:
            head = judged[0]
            if speed:
                check = SpeedCheck(head, releases[head][1], releases[head][0])
                check.baseline = speed.baseline(head, check.baseline_release)
            if quality:
                answers = QualityCheck(head, releases[head][1], releases[head][0])
                answers.baseline = quality.baseline(head, answers.baseline_release)

        def before_ops():
            drain()
            if check and check.baseline is None and check.baseline_release:
                baseline_now(speed, check, log)
            if answers and answers.baseline is None and answers.baseline_release:
                quality_baseline_now(quality, answers, log)

        results = run_deploy(inventory, batch.hosts, data, before_ops=before_ops)
        seconds = batch.seconds()
        found = {}
        for cohort in batch.cohorts:
            reports = cohort_reports(cohort, results, releases, seconds, batch.number)
            gate_failed = needs_rollback(cohort, results)
            if gate_failed:
                rolled_back(reports, gate_failed, run_deploy(inventory, list(cohort), data, deploy_file="rollback.py"),
                            releases)
            elif cohort == judged and all(r.ok for r in reports):
                gate, halt = "speed", speed_gate(speed, check, log) if check else None
                if not halt and answers:
                    gate, halt = "quality", quality_gate(quality, answers, log)
                if halt:
                    rolled_back(reports, [], run_deploy(inventory, list(cohort), data, deploy_file="rollback.py"),
                                releases, reason=halt)
                    batch.halt = f"halted: the {gate} gate stopped the canary {cohort_name(cohort)}"
            if check and cohort == judged:
                check.line = check.line or f"{check.host}: not measured: {reports[0].result} ({reports[0].detail})"
                reports[0].speed = check.to_dict()
            if answers and cohort == judged:
                answers.line = answers.line or (f"{answers.host}: not evaluated: {reports[0].result} "
                                                f"({reports[0].detail})")
                reports[0].quality = answers.to_dict()
            found[cohort] = reports
        return found

    change = Change("rollout", "roll out", switch,
                    lambda cohort, number, why: not_reached(cohort, releases, number, why),
                    back_in=lambda reports: all(r.ok or r.result == "rolled back" for r in reports),  # failed: out
                    prepare=stage)
    reports = run_batches(FrontDoorRuntime.of(inventory), inventory, plan, change, max_fail=max_fail, serves=serves,
                          log=log)
    for r in reports:
        r.staged_s = staged_s[0] if staged_s and r.host in staged else None
    return reports


def chat_models(before: Before) -> dict[str, str]:
    """The chat model each engine host serves before and after a rollout or an upgrade (the planned one, where its
    installed release serves that name too), and each one a `limit` left out (`Before.peers`): the front door must
    keep one backend in rotation for each."""
    return {**before.peers, **{p.name: p.settings.served_model_name for p in before.plans if p.runs_engine and
                               (before.installed.get(p.name) or {}).get("served_model_name")
                               == p.settings.served_model_name}}


def served_names(hosts: list[tuple[str, dict]]) -> dict[str, str]:
    """The chat model each engine host of `hosts` (the inventory's Sparks: no plan, no lock) serves by its settings,
    for a rollback's last-backend rule; a host whose settings are refused is left out (neither judged nor a peer):
    a rollback must run against an inventory being fixed."""
    from sparkfleet.contract.settings import SettingsError, parse_settings

    groups, out = members_in_data(hosts), {}
    for name, data in hosts:
        if groups.get(name, (name,))[0] != name:
            continue  # a group's worker: its head is the backend
        try:
            out[name] = parse_settings(name, data).served_model_name
        except SettingsError:
            continue
    return out


def rollback(inventory: str, hosts: list[str], groups: dict[str, Cohort], serves: dict[str, str] | None = None,
             log=print) -> list[HostReport]:
    """Switch `hosts` back to their previous release (`rollback.py`: no download), all of them in one batch of the
    batch loop: drained (held by the rollback), the address handed over, put back where every member of the cohort
    came back. `serves`: as `rollout`'s, the last-backend rule; a rollback whose batch would drain a model's last
    backend is refused before any host is touched."""
    blank: dict[str, tuple[str | None, str | None]] = {h: (None, None) for h in hosts}

    def switch_back(batch: Batch, drain) -> dict[Cohort, list[HostReport]]:
        results = run_deploy(inventory, batch.hosts, deploy_file="rollback.py", before_ops=drain)
        seconds = batch.seconds()
        return {cohort: [HostReport(h, None, None, "rolled back" if results[h].ok else "failed", seconds,
                                    "; ".join(results[h].failed), group_of(cohort)) for h in cohort]
                for cohort in batch.cohorts}

    change = Change("rollback", "roll back", switch_back,
                    lambda cohort, number, why: not_reached(cohort, blank, None, why),
                    back_in=lambda reports: all(r.result == "rolled back" for r in reports))
    plan = [cohorts(hosts, groups)] if hosts else []
    return run_batches(FrontDoorRuntime.of(inventory), inventory, plan, change, serves=serves, log=log)


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


def quality_summary(reports, skipped: bool = False) -> dict:
    """The quality gate's outcome: skipped (`--no-quality-gate`), or each evaluated canary's check."""
    return {"skipped": skipped, "checks": [] if skipped else [r.quality for r in reports if r.quality]}


def quality_lines(reports, skipped: bool) -> list[str]:
    """The quality gate's lines after a rollout's or an upgrade's table."""
    gate = quality_summary(reports, skipped)
    return ["quality gate: skipped (--no-quality-gate)"] if gate["skipped"] else \
        [f"quality gate: {c['verdict']}: {c['line']}" for c in gate["checks"]] or \
        ["quality gate: nothing evaluated (no host changed)"]


def report_json(reports: list[HostReport], speed_skipped: bool = False, quality_skipped: bool | None = None) -> dict:
    """The report as JSON; `quality_skipped` None: no quality gate to report (a rollback's)."""
    found = {"hosts": [asdict(r) for r in reports], "phases": phases(reports),
             "speed_gate": speed_summary(reports, speed_skipped)}
    if quality_skipped is not None:
        found["quality_gate"] = quality_summary(reports, quality_skipped)
    return {**found, "ok": all(r.ok for r in reports)}
