"""`sparkfleet upgrade INVENTORY`: the Sparks' platform packages within the apt pins, batch by batch
(fleet/upgrade.py), rebooting where needed; `--dry` only surveys."""

from __future__ import annotations

import json
import sys

from sparkfleet.commands import common

NAME = "upgrade"
HELP = ("upgrade the hosts' platform packages within the apt pins batch by batch, rebooting where needed; halt on "
        "the first failure")


def arguments(parser) -> None:
    common.batched(parser)
    common.no_quality_gate(parser)
    parser.add_argument("--dry", action="store_true",
                        help="touch nothing: per host, the packages that would change and whether it would reboot")


def run(args) -> int:
    from sparkfleet.controller.inventory import parse_data
    from sparkfleet.fleet.rollout import chat_models, planned, quality_lines, read_before
    from sparkfleet.fleet.upgrade import report_json, survey, survey_json, upgrade
    from sparkfleet.host.pins import render_pins
    from sparkfleet.host.upgrade import refused_changes
    from sparkfleet.tables import clean, literal, print_table

    before = planned(args.inventory, args.limit, args.data, service_hosts=False)  # DGX OS updates: the Sparks'
    plans = before.plans
    refusals = {p.name: (lambda sim, p=p: refused_changes(p.name, p.settings, sim.changes, p.group is not None))
                for p in plans}
    found = survey(args.inventory, before.names, {p.name: render_pins(p.settings.platform_pins) for p in plans},
                   refusals)
    if args.dry:
        if args.json:
            print(json.dumps(survey_json(found), indent=2))
        else:
            rows = [(s.host, "\n".join(map(literal, s.changes)) or "-", "yes" if s.reboot else "no",
                     "\n".join(map(literal, ([s.problem] if s.problem else []) + s.refused))) for s in found]
            print_table("sparkfleet upgrade --dry", ("host", "would change", "would reboot", "problem"), rows,
                        stderr=True)
        return 0 if survey_json(found)["ok"] else 1
    # each release record (what the speed gate keeps figures under, what each host serves: the front door keeps one
    # backend in rotation for each model), the kept figures unless --no-speed-gate, the kept answers unless
    # --no-quality-gate
    before = read_before(args.inventory, before, speed_gate=not args.no_speed_gate,
                         quality_gate=not args.no_quality_gate)
    releases = {name: (r or {}).get("release_id") for name, r in before.installed.items()}
    reports = upgrade(args.inventory, found, batch=args.batch, canary=args.canary, max_fail=args.max_fail,
                      data=parse_data(args.data), groups=before.groups, speed=before.speed, quality=before.quality,
                      releases=releases, serves=chat_models(before), log=common.log)
    if args.json:
        print(json.dumps(report_json(reports, args.no_speed_gate, args.no_quality_gate), indent=2))
    else:
        rows = [(r.host, f"[{'green' if r.ok else 'red'}]{literal(r.result)}[/]",
                 "\n".join(map(literal, r.changes)) or "-", "yes" if r.rebooted else "no", f"{r.seconds:g}",
                 "-" if r.out_of_rotation_s is None else f"{r.out_of_rotation_s:g}", literal(r.detail))
                for r in reports]
        print_table("sparkfleet upgrade", ("host", "result", "changed", "rebooted", "seconds", "out of rotation s",
                                           "detail"), rows, stderr=True)
        common.print_speed(reports, args.no_speed_gate)
        for line in quality_lines(reports, args.no_quality_gate):
            print(clean(line), file=sys.stderr)
    return 0 if report_json(reports)["ok"] else 1
