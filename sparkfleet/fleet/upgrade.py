"""Upgrade a fleet's platform (kernel, driver, the rest of DGX OS) within its apt pins, with the rollout's batches,
canary and halt rules through the loop they share (`fleet/batches.py` `run_batches`: the drain, the address
hand-over, the last-backend rule, the timing), and the rollout's speed and quality gates on the canary.

First a survey, all hosts at once, draining none: each host's `apt-get upgrade` simulated (after `apt-get update`),
with whether it would reboot; `--dry` stops there. A host with nothing to change is not drained. An upgrade whose
batch would drain the last backend a front door has in rotation for a model another host serves is refused before
any host is touched. Then, cohort by cohort in batches (a tensor-parallel group is one cohort): drain -> the upgrade
step (`upgrade.py`: the pins, a refusal of a new kernel or driver that a refused_* setting names, `apt-get upgrade`,
a reboot where needed, SSH back) -> converge (`deploy.py`: preflight reads the new driver, the health gate) -> the
speed gate on the canary (the first cohort upgraded; `fleet/speed.py`, as the rollout's: its release measured on the
new platform against its kept figure, or against the old platform measured right after the drain where none is
kept) -> the quality gate on the canary (fleet/quality.py, as the rollout's: its release's answers on the new platform
against the release's kept baseline, or against the old platform evaluated right after the drain where none is
kept) -> undrain. A failed host, a slower canary or one that answers worse included, stays drained, held by the
upgrade, and the upgrade halts once more than `max_fail` cohorts failed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from sparkfleet.fleet.batches import Batch, Change, Cohort, batches, cohort_name, cohorts, group_of, run_batches
from sparkfleet.fleet.converge import HostResult, read_hosts, run_deploy
from sparkfleet.fleet.front_door.runtime import FrontDoorRuntime
from sparkfleet.fleet.rollout import (QualityCheck, baseline_now, quality_baseline_now, quality_gate,
                                     quality_summary, speed_gate, speed_summary)
from sparkfleet.fleet.speed import SpeedCheck
from sparkfleet.host.facts import Unreadable
from sparkfleet.host.upgrade import REBOOT_OP, REFUSED_OP, Simulation, UpgradeSimulation, needs_reboot

@dataclass
class HostSurvey:
    """What an upgrade would do on one host: the package changes ("pkg old -> new"), whether it would reboot, and
    why it would not run (unreachable, apt unreadable); `refused`: the lines of the versions a setting refuses."""

    host: str
    changes: list[str] = field(default_factory=list)
    reboot: bool = False
    problem: str | None = None
    refused: list[str] = field(default_factory=list)

    @property
    def todo(self) -> bool:
        return bool(self.changes or self.reboot or self.problem)


def survey_of(name: str, sim: Simulation | Unreadable | None, refused: Callable[[Simulation], list[str]]) -> HostSurvey:
    """A host's survey from its simulation (None: it did not answer over SSH)."""
    if sim is None:
        return HostSurvey(name, problem="unreachable over SSH")
    if isinstance(sim, Unreadable):
        return HostSurvey(name, problem=sim.line(name))
    return HostSurvey(name, [c.line() for c in sim.changes], needs_reboot(sim), refused=refused(sim))


def survey(inventory: str, hosts: list[str], pins: dict[str, str],
           refused: dict[str, Callable[[Simulation], list[str]]]) -> list[HostSurvey]:
    """Every host's survey, read at once; per host, `pins`: its platform_pins rendered (`host/pins.py`), `refused`:
    its settings' refusal of a simulation's changes."""
    sims = read_hosts(inventory, hosts, lambda h: {"sim": h.get_fact(UpgradeSimulation, pins=pins[h.name])})
    return [survey_of(h, sims[h]["sim"] if sims[h] else None, refused[h]) for h in hosts]


@dataclass
class UpgradeReport:
    host: str
    result: str  # upgraded | unchanged | refused | failed | unreachable | not reached
    changes: list[str] = field(default_factory=list)
    rebooted: bool = False
    seconds: float = 0.0  # its batch's upgrade step and converge
    detail: str = ""
    group: str | None = None
    batch: int | None = None
    out_of_rotation_s: float | None = None  # a front door's backend: from its drain to its return; None: not back
    speed: dict | None = None  # the canary's speed gate (SpeedCheck.to_dict); None: not measured here
    quality: dict | None = None  # the canary's quality gate (QualityCheck.to_dict); None: not evaluated here

    @property
    def ok(self) -> bool:
        return self.result in ("upgraded", "unchanged")


def judge(step: HostResult, converge: HostResult | None, slow: str | None,
          wrong: str | None = None) -> tuple[str, str]:
    """(result, detail) of a host from its upgrade step, its converge (None: not run), its speed gate and its
    quality gate (`wrong`: its halt line)."""
    refused = [f.partition(f"{REFUSED_OP}: ")[2] for f in step.failed if f"{REFUSED_OP}: " in f]  # "Deploy | Op"
    refused += [line.partition(f"{REFUSED_OP}: ")[2] for line in step.said  # apt's second look, as the step ran
                if line.startswith(f"{REFUSED_OP}: ")]
    if refused:
        return "refused", refused[0] + "; left drained on its old versions"
    if not step.ok:
        return ("unreachable" if not step.connected else "failed"), (
            f"upgrade step failed: {'; '.join(step.failed)}; left drained")
    if converge is None:
        return "failed", "another member of its group failed its upgrade step; left drained"
    if not converge.ok:
        return "failed", f"converge after the upgrade failed: {'; '.join(converge.failed)}; left drained"
    if slow:
        return "failed", f"speed gate: {slow}; left drained on its new versions"
    if wrong:
        return "failed", f"quality gate: {wrong}; left drained on its new versions"
    return "upgraded", ""


def cohort_reports(cohort: Cohort, surveys: dict[str, HostSurvey], step: dict[str, HostResult],
                   converged: dict[str, HostResult], slow: dict[str, str], seconds: float,
                   number: int, wrong: dict[str, str] | None = None) -> list[UpgradeReport]:
    found = []
    for h in cohort:
        result, detail = judge(step[h], converged.get(h), slow.get(h), (wrong or {}).get(h))
        rebooted = any(name.endswith(REBOOT_OP) for name in step[h].changed)  # "Platform upgrade | " first
        found.append(UpgradeReport(h, result, surveys[h].changes, rebooted, seconds, detail, group_of(cohort),
                                   number))
    return found


def front_doors_last(todo: list[Cohort], doors: list[str], log=print) -> list[Cohort]:
    """The cohorts in order, those with a front door host last (a stable sort): its reboot takes that front door
    down with it, so the other hosts are upgraded while it still serves."""
    last = [c for c in todo if any(h in doors for h in c)]
    for cohort in last:
        log(f"{cohort_name(cohort)}: runs a front door; upgraded last: its reboot stops that front door until it is "
            "back")
    return [c for c in todo if c not in last] + last


def upgrade(inventory: str, surveys: list[HostSurvey], *, batch: str = "1", canary: bool = False,
            max_fail: int = 0, data: dict | None = None, groups: dict[str, Cohort] | None = None,
            speed: Any = None, quality: Any = None, releases: dict[str, str | None] | None = None,
            serves: dict[str, str] | None = None, log=print) -> list[UpgradeReport]:
    """Upgrade the cohorts that have something to do (`survey`), batch by batch (fleet/batches.py `run_batches`);
    the rest are reported unchanged. The front door drains each cohort's first host; a failed cohort stays drained,
    and more than `max_fail` failed cohorts halt the upgrade (the cohorts not reached keep their versions). `speed`:
    the speed gate (fleet/speed.py SpeedGate), None to skip it; `quality`: the quality gate (fleet/quality.py
    QualityGate), after it, None to skip it; `releases`: each host's installed release id, what its figures and
    answers are kept under. `serves` (host -> the chat model it serves, fleet/rollout.py `chat_models`): a batch
    that would drain the last backend in rotation of a model other hosts serve is refused before any host is touched
    (Refused), or, found at its turn, halts the upgrade; None: not checked."""
    by_host = {s.host: s for s in surveys}
    todo = [c for c in cohorts([s.host for s in surveys], groups or {}) if any(by_host[h].todo for h in c)]
    reports = [UpgradeReport(s.host, "unchanged") for s in surveys
               if not any(s.host in c for c in todo)]
    door = FrontDoorRuntime.of(inventory)
    todo = front_doors_last(todo, [name for name, _ in door.doors], log)
    plan = batches(todo, batch, canary) if todo else []
    judged = plan[0][0] if (speed or quality) and plan else None  # the canary: the first cohort upgraded

    def step_and_converge(batch: Batch, drain) -> dict[Cohort, list[UpgradeReport]]:
        """One batch: upgrade.py (drained once the step is planned: the simulation read again), deploy.py on the
        cohorts whose every member passed it, the speed and quality gates on the canary."""
        check = answers = None
        if judged in batch.cohorts:
            release = (releases or {}).get(judged[0])
            if speed:
                check = SpeedCheck(judged[0], release, release)
                check.baseline = speed.baseline(judged[0], release)
            if quality:
                answers = QualityCheck(judged[0], release, release)
                answers.baseline = quality.baseline(judged[0], release)

        def before_ops():
            drain()
            if check and check.baseline is None and check.release:
                baseline_now(speed, check, log)  # the old platform's figure, before anything is installed
            if answers and answers.baseline is None and answers.release:
                quality_baseline_now(quality, answers, log)  # the old platform's answers, the same

        step = run_deploy(inventory, batch.hosts, data, deploy_file="upgrade.py", before_ops=before_ops)
        ready = [h for cohort in batch.cohorts if all(step[m].ok for m in cohort) for h in cohort]
        converged = run_deploy(inventory, ready, data) if ready else {}
        passed = [h for h in ready if converged[h].ok]
        slow, wrong = {}, {}
        if check and check.host in passed:
            halt = speed_gate(speed, check, log, then="halted")
            if halt:
                slow[check.host] = halt
        if answers and answers.host in passed and answers.host not in slow:
            halt = quality_gate(quality, answers, log, then="halted")
            if halt:
                wrong[answers.host] = halt
        seconds = batch.seconds()
        found = {}
        for cohort in batch.cohorts:
            found[cohort] = cohort_reports(cohort, by_host, step, converged, slow, seconds, batch.number, wrong)
            first = found[cohort][0]
            if check and cohort == judged:
                check.line = check.line or f"{check.host}: not measured: {first.result} ({first.detail})"
                first.speed = check.to_dict()
            if answers and cohort == judged:
                answers.line = answers.line or f"{answers.host}: not evaluated: {first.result} ({first.detail})"
                first.quality = answers.to_dict()
            for r in found[cohort]:
                if not r.ok:  # a refusal's line names the host, the package, the version and why
                    log(r.detail if r.result == "refused" else f"{r.host}: {r.result}: {r.detail}")
        return found

    def not_reached(cohort: Cohort, number: int, why: str) -> list[UpgradeReport]:
        return [UpgradeReport(h, "not reached", by_host[h].changes, detail=f"{why}; its versions are unchanged",
                              batch=number, group=group_of(cohort)) for h in cohort]

    reports += run_batches(door, inventory, plan, Change("upgrade", "upgrade", step_and_converge, not_reached),
                           max_fail=max_fail, serves=serves, log=log)
    order = {s.host: i for i, s in enumerate(surveys)}
    return sorted(reports, key=lambda r: order[r.host])


def report_json(reports: list[UpgradeReport], speed_skipped: bool = False, quality_skipped: bool = False) -> dict:
    return {"hosts": [asdict(r) for r in reports], "speed_gate": speed_summary(reports, speed_skipped),
            "quality_gate": quality_summary(reports, quality_skipped), "ok": all(r.ok for r in reports)}


def survey_json(surveys: list[HostSurvey]) -> dict:
    return {"hosts": [asdict(s) for s in surveys], "ok": not any(s.problem or s.refused for s in surveys)}
