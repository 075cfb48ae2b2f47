"""What several commands share: their common options, the argument types the parser checks, `refusing` (a class a
command names turned into `Refused`), and the rollout's (and rollback's, upgrade's) report lines. Light at import."""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sparkfleet.refused import INVALID, Refusal, Refused


def batch(value: str) -> str:
    """`--batch`, checked by the parser before any plan: fleet/batches.py's rule, which `batches` splits by."""
    from sparkfleet.fleet.batches import batch_size

    try:
        batch_size(value, 1)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--batch ")) from None
    return value


def count(value: str) -> int:
    """A limit on the command line: a whole number >= 0 (0: back to the fleet-wide default)."""
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number >= 0")
    return int(value)


def data_item(value: str) -> str:
    """`--data KEY=VALUE`, as pyinfra's --data takes it."""
    if "=" not in value or not value.partition("=")[0].strip():
        raise argparse.ArgumentTypeError(f"{value!r}: give KEY=VALUE (e.g. max_model_len=32768)")
    return value


def limit(parser: argparse.ArgumentParser) -> None:
    """`--limit` (pyinfra's word) for a host subset; `--host`, its old name, still accepted."""
    parser.add_argument("--limit", help="one host (or group) of the inventory")
    parser.add_argument("--host", dest="limit", help=argparse.SUPPRESS)


def as_json(parser: argparse.ArgumentParser, help: str = "print JSON instead of the table") -> None:
    parser.add_argument("--json", action="store_true", help=help)


def data(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", action="append", default=[], type=data_item, metavar="KEY=VALUE",
                        help="override a setting")


def batched(parser: argparse.ArgumentParser) -> None:
    """A command that changes the fleet batch by batch (rollout, upgrade): the same batches, canary and halt rule."""
    parser.add_argument("inventory")
    parser.add_argument("--batch", default="1", type=batch,
                        help="hosts per batch: a number or a percentage (default 1)")
    parser.add_argument("--canary", action="store_true", help="the first host alone first")
    parser.add_argument("--max-fail", type=int, default=0, help="halt once more than K hosts failed (default 0)")
    parser.add_argument("--no-speed-gate", action="store_true",
                        help="measure nothing: the canary is not held to its previous decode rate and TTFT")
    limit(parser)
    data(parser)
    as_json(parser, "print the report as JSON")


def no_quality_gate(parser: argparse.ArgumentParser) -> None:
    """rollout's and upgrade's --no-quality-gate, beside `batched`'s --no-speed-gate (a rollback evaluates nothing)."""
    parser.add_argument("--no-quality-gate", action="store_true",
                        help="evaluate nothing: the canary's answers are not held to its previous release's "
                             "(the probe suite, docs/quality.md)")


@dataclass(frozen=True)
class PlannedSparks:
    ca: Any  # the fleet CA the guards' TLS client trusts (roles/pki.py hosts_ca), None where the hops are plain
    hosts: dict[str, dict]  # name -> inventory data
    settings: dict[str, Any]  # name -> Settings
    groups: dict[str, Any]  # name -> its tensor-parallel group (release/group.py)


def planned_sparks(inventory: str, limit: str | None) -> PlannedSparks:
    """The Sparks a fleet command asks (a `--limit`'s whole tensor-parallel groups), with their settings, their
    groups and the fleet CA the guards' TLS client trusts; a group's problem refused before any host is asked."""
    from sparkfleet.contract.settings import SettingsError, parse_settings
    from sparkfleet.controller.inventory import load_hosts, spark_hosts
    from sparkfleet.fleet.rollout import load_whole_groups
    from sparkfleet.release.group import plan_groups
    from sparkfleet.roles.pki import hosts_ca

    ca = hosts_ca(load_hosts(inventory))  # the guards serve TLS: ask them with the fleet's certificate
    hosts = dict(spark_hosts(load_whole_groups(inventory, limit)))
    settings = {name: parse_settings(name, data) for name, data in hosts.items()}
    groups, problems = plan_groups(settings)
    if problems:
        raise SettingsError(problems)
    return PlannedSparks(ca, hosts, settings, groups)


@contextmanager
def refusing(*also: type[Exception], code: int = INVALID):
    """Inside: an exception of `also` (a class the command names, of a library or the standard library) leaves as
    `Refused` with `code`; anything else leaves as it is. The project's refusals (sparkfleet/refused.py `Refusal`:
    settings, inventory, lock, secrets, ...) need no wrapping: `cli.main` prints them in one line, and any other
    exception as the bug it is (traceback, exit 3). Without `also` it changes nothing."""
    try:
        yield
    except Refusal:
        raise
    except also as exc:
        raise Refused(str(exc), code) from exc


def log(message: str) -> None:
    """A long command's progress: on stderr, so that stdout keeps only its report; clean, as it may quote a host."""
    from sparkfleet.tables import TEXT_MAX, clean_lines

    print(clean_lines(message, 10 * TEXT_MAX), file=sys.stderr)


def print_reports(reports, as_json: bool, speed_skipped: bool | None = None) -> None:
    """The rollout's (or rollback's) table and phases; for a rollout (`speed_skipped` not None) its speed gate."""
    from sparkfleet.fleet.rollout import phases, report_json
    from sparkfleet.tables import literal, print_table

    if as_json:
        found = report_json(reports, bool(speed_skipped))
        if speed_skipped is None:
            del found["speed_gate"]
        print(json.dumps(found, indent=2))
        return
    rows = []
    for r in reports:
        color = {"converged": "green", "unchanged": "green", "rolled back": "yellow"}.get(r.result, "red")
        out = "-" if r.out_of_rotation_s is None else f"{r.out_of_rotation_s:g}"
        rows.append((r.host, literal(r.old_release or "-"), literal(r.new_release or "-"),
                     f"[{color}]{literal(r.result)}[/]", f"{r.seconds:g}", out, literal(r.detail)))
    print_table("sparkfleet rollout", ("host", "old release", "new release", "result", "seconds",
                                       "out of rotation s", "detail"), rows, stderr=True)
    found = phases(reports)
    stage, switch = found["stage"], found["switch"]
    if stage["hosts"] or switch["batches"]:
        print(f"phases: stage {len(stage['hosts'])} hosts in {stage['seconds']:g} s (all at once, before any drain), "
              f"switch {switch['batches']} batches in {switch['seconds']:g} s", file=sys.stderr)
    if speed_skipped is not None:
        print_speed(reports, speed_skipped)


def print_speed(reports, skipped: bool) -> None:
    """The speed gate's lines after a rollout's or an upgrade's table."""
    from sparkfleet.fleet.rollout import speed_summary
    from sparkfleet.tables import clean

    gate = speed_summary(reports, skipped)
    lines = ["skipped (--no-speed-gate)"] if gate["skipped"] else \
        [f"{c['verdict']}: {c['line']}" for c in gate["checks"]] or ["nothing measured (no host changed)"]
    for line in lines:
        print(f"speed gate: {clean(line)}", file=sys.stderr)
