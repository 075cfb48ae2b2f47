"""`sparkfleet rollback INVENTORY`: switch hosts back to their previous release (no download), drained on the
front door while they switch."""

from __future__ import annotations

from sparkfleet.commands import common

NAME = "rollback"
HELP = "switch hosts to their previous release (no download)"


def arguments(parser) -> None:
    parser.add_argument("inventory")
    common.limit(parser)
    common.as_json(parser, "print the report as JSON")


def run(args) -> int:
    from sparkfleet.fleet.converge import run_deploy
    from sparkfleet.fleet.front_door.runtime import FrontDoorRuntime
    from sparkfleet.controller.inventory import spark_hosts
    from sparkfleet.fleet.rollout import HostReport, load_whole_groups, members_in_data, units

    with common.refusing(ValueError):
        hosts = spark_hosts(load_whole_groups(args.inventory, args.limit))  # a group rolls back whole
        names = [name for name, _ in hosts]
        found = units(names, members_in_data(hosts))
    door = FrontDoorRuntime.of(args.inventory)  # none: no drain; a group's backend is its head
    door.drain([unit[0] for unit in found], log=common.log, operation="rollback")
    results = run_deploy(args.inventory, names, deploy_file="rollback.py")
    door.ready([unit[0] for unit in found if all(results[h].ok for h in unit)], log=common.log)
    reports = [HostReport(n, None, None, "rolled back" if r.ok else "failed", detail="; ".join(r.failed))
               for n, r in results.items()]
    common.print_reports(reports, args.json)
    return 0 if all(r.ok for r in results.values()) else 1
