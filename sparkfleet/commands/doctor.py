"""`sparkfleet doctor INVENTORY`: is each host ready for sparkfleet? SSH reach, host key, root or sudo, Docker,
disk, clock, GPU and driver, the guard and the door, certificates' days left: one table, read-only, every step under
a timeout; exit 1 with one line per problem (the host, what, the fix)."""

from __future__ import annotations

import json

from sparkfleet.commands import common

NAME = "doctor"
HELP = "check each host is ready (SSH, sudo, Docker, disk, clock, GPU, guard, door, certificates); read-only"


def arguments(parser) -> None:
    parser.add_argument("inventory")
    common.limit(parser)
    common.as_json(parser)


def run(args) -> int:
    from sparkfleet.contract import monitoring
    from sparkfleet.contract.reach import api_reachable
    from sparkfleet.contract.settings import GROUPS_KEY, SettingsError, parse_settings
    from sparkfleet.controller.inventory import load_hosts
    from sparkfleet.fleet.doctor import COLUMNS, doctor, problems, row_json, table_cells
    from sparkfleet.fleet.tls import guard_client
    from sparkfleet.release.group import plan_groups
    from sparkfleet.roles.pki import hosts_ca
    from sparkfleet.tables import console, literal, print_table

    everyone = load_hosts(args.inventory)
    hosts = load_hosts(args.inventory, args.limit)
    settings = {name: parse_settings(name, data) for name, data in hosts}
    spark = {name: not monitoring.is_service_host(data.get(GROUPS_KEY, ())) for name, data in hosts}
    doors = {name for name, data in hosts if monitoring.FRONT_DOOR_GROUP in data.get(GROUPS_KEY, ())}
    groups, refused = plan_groups({name: settings[name] for name in settings if spark[name]})
    if refused:
        raise SettingsError(refused)
    # the guard is asked where the controller reaches the API and an engine answers there (not a group's worker)
    guard_asked = {name: spark[name] and api_reachable(settings[name])
                   and (groups.get(name) is None or groups[name].head == name) for name in settings}
    with guard_client(hosts_ca(everyone)) as client:
        rows = doctor(hosts, settings, spark, doors, client, guard_asked)
    found = problems(rows)
    if args.json:
        print(json.dumps({"hosts": [row_json(row) for row in rows], "problems": found}, indent=2))
    else:
        out = console()
        print_table("sparkfleet doctor", ("host", *COLUMNS.values()), table_cells(rows), out=out)
        for line in found:
            out.print(f"[red]{literal(line)}[/]")
        if not found:
            out.print(f"doctor: no problem found on {len(rows)} host{'s' * (len(rows) != 1)}")
    return 1 if found else 0
