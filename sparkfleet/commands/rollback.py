"""`sparkfleet rollback INVENTORY`: switch hosts back to their previous release (no download), drained on the
front door while they switch: one batch of the loop rollout and upgrade run (fleet/rollout.py `rollback`), so a
rollback that would drain the last backend a front door has for a model is refused before any host is touched."""

from __future__ import annotations

from sparkfleet.commands import common

NAME = "rollback"
HELP = "switch hosts to their previous release (no download)"


def arguments(parser) -> None:
    parser.add_argument("inventory")
    common.limit(parser)
    common.as_json(parser, "print the report as JSON")


def run(args) -> int:
    from sparkfleet.controller.inventory import load_hosts, spark_hosts
    from sparkfleet.fleet.batches import cohorts
    from sparkfleet.fleet.rollout import load_whole_groups, members_in_data, rollback, served_names

    hosts = spark_hosts(load_whole_groups(args.inventory, args.limit))  # a group rolls back whole
    sparks = spark_hosts(load_hosts(args.inventory))  # every Spark: the peers that keep a model in rotation
    names, groups = [name for name, _ in hosts], members_in_data(hosts)
    cohorts(names, groups)  # a group whose members' lists disagree is refused here
    reports = rollback(args.inventory, names, groups, served_names(sparks), log=common.log)
    common.print_reports(reports, args.json)
    return 0 if all(r.result == "rolled back" for r in reports) else 1
