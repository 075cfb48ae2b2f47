"""Roll a release across a fleet batch by batch; undo it where it fails its health gate.

Never more than one batch is changing at a time; more than `max_fail` failed
hosts halt the rollout, and the hosts not yet reached keep their release.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import asdict, dataclass

from sparkfleet.fleet.converge import HostResult, run_deploy
from sparkfleet.fleet.front_door import FrontDoorRuntime


def batches(hosts: list[str], batch: str = "1", canary: bool = False) -> list[list[str]]:
    """Split hosts into batches: `batch` is a count ("2") or a share of the fleet ("25%")."""
    match = re.fullmatch(r"(\d+)(%?)", batch.strip())
    if not match or int(match[1]) == 0:
        raise ValueError(f"--batch {batch!r}: give a number of hosts (e.g. 2) or a percentage (e.g. 25%)")
    size = max(1, math.floor(len(hosts) * int(match[1]) / 100)) if match[2] else int(match[1])
    first, rest = (hosts[:1], hosts[1:]) if canary else ([], hosts)
    return ([first] if first else []) + [rest[i:i + size] for i in range(0, len(rest), size)]


@dataclass
class HostReport:
    host: str
    old_release: str | None
    new_release: str | None
    result: str  # converged | unchanged | rolled back | failed | unreachable | not reached
    seconds: float = 0.0
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.result in ("converged", "unchanged")


def judge(result: HostResult) -> str:
    if not result.connected:
        return "unreachable"
    if result.failed:
        return "failed"
    return "converged" if result.changed else "unchanged"


def rollout(inventory: str, hosts: list[str], releases: dict[str, tuple[str | None, str | None]], *,
            batch: str = "1", canary: bool = False, max_fail: int = 0, data: dict | None = None,
            log=print) -> list[HostReport]:
    """Drive deploy.py over `hosts` in batches; roll back hosts whose new release fails its health gate.

    `releases` maps each host to (its installed release id, the planned one).
    """
    reports: list[HostReport] = []
    failures = 0
    plan = batches(hosts, batch, canary)
    door = FrontDoorRuntime.of(inventory)  # none: no drain
    for number, group in enumerate(plan, 1):
        if failures > max_fail:
            reports += [HostReport(h, releases[h][0], releases[h][1], "not reached",
                                   detail=f"halted: {failures} failed > --max-fail {max_fail}") for h in group]
            continue
        log(f"batch {number}/{len(plan)}: {', '.join(group)}")
        started = time.monotonic()
        door.drain(group, log)
        results = run_deploy(inventory, group, data)
        seconds = round(time.monotonic() - started, 1)
        for host in group:
            result = results[host]
            outcome = judge(result)
            report = HostReport(host, releases[host][0], releases[host][1], outcome, seconds,
                                "; ".join(result.failed))
            if outcome == "failed" and result.health_gate == "failed":
                back = run_deploy(inventory, [host], data, deploy_file="rollback.py")[host]
                report.result = "rolled back" if back.ok else "failed"
                report.new_release = releases[host][0] if back.ok else report.new_release
                report.detail = ("new release failed its health gate; previous release restored and healthy"
                                 if back.ok else f"health gate failed and rollback failed too: {back.failed}")
            if not report.ok:
                failures += 1
            reports.append(report)
        door.ready([r.host for r in reports[-len(group):] if r.ok or r.result == "rolled back"], log)  # failed: out
    return reports


def report_json(reports: list[HostReport]) -> dict:
    return {"hosts": [asdict(r) for r in reports],
            "ok": all(r.ok for r in reports)}
