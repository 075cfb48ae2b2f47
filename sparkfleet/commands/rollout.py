"""`sparkfleet rollout INVENTORY`: converge the fleet batch by batch (fleet/rollout.py), then its service hosts."""

from __future__ import annotations

import json
import sys

from sparkfleet.commands import common

NAME = "rollout"
HELP = "converge the fleet batch by batch; halt on failures, undo failed releases"


def arguments(parser) -> None:
    common.batched(parser)
    common.no_quality_gate(parser)


def run(args) -> int:
    from sparkfleet.controller.inventory import parse_data
    from sparkfleet.fleet.rollout import chat_models, holds_what_it_needs, planned, quality_lines, read_before, \
        report_json, rollout, service_hosts_last
    from sparkfleet.tables import clean

    before = planned(args.inventory, args.limit, args.data)
    before = read_before(args.inventory, before, speed_gate=not args.no_speed_gate,
                         quality_gate=not args.no_quality_gate)
    releases = {p.name: ((before.installed[p.name] or {}).get("release_id"), p.release_id) for p in before.plans}
    prepared = {p.name for p in before.plans if holds_what_it_needs(p, before.installed[p.name] or {})}
    data = parse_data(args.data)
    reports = rollout(args.inventory, before.names, releases, batch=args.batch, canary=args.canary,
                      max_fail=args.max_fail, data=data, groups=before.groups, prepared=prepared, speed=before.speed,
                      quality=before.quality, serves=chat_models(before), log=common.log)
    if report_json(reports)["ok"]:
        reports += service_hosts_last(args.inventory, before.services, data, log=common.log)
    if args.json:
        print(json.dumps(report_json(reports, args.no_speed_gate, args.no_quality_gate), indent=2))
    else:
        common.print_reports(reports, False, speed_skipped=args.no_speed_gate)
        for line in quality_lines(reports, args.no_quality_gate):
            print(clean(line), file=sys.stderr)
    return 0 if report_json(reports)["ok"] else 1
