"""`sparkfleet status INVENTORY`: each host's health, served model and load, the front door's backends and the
alerts firing; exit 1 when anything is down."""

from __future__ import annotations

import json

from sparkfleet.commands import common

NAME = "status"
HELP = "each host's health, served model and load; non-zero if any is down"


def arguments(parser) -> None:
    parser.add_argument("inventory")
    common.limit(parser)
    common.as_json(parser)
    parser.add_argument("--chat", action="store_true", help="also ask each host one chat completion")


def run(args) -> int:
    from sparkfleet.fleet.alerts import alerts_ok, fleet_alerts
    from sparkfleet.fleet.converge import read_hosts
    from sparkfleet.fleet.front_door.commands import front_door_status, status_rows
    from sparkfleet.roles.front_door.holds import door_ok
    from sparkfleet.fleet.tls import guard_client
    from sparkfleet.fleet.backup import backup_status
    from sparkfleet.fleet.status import fleet_rows, host_row, quiet_connections, ssh_facts, status_table
    from sparkfleet.fleet.status import BACKUP_COLUMNS, backup_rows
    from sparkfleet.tables import LOG_WIDTH, console, literal, narrow, print_table

    sparks = common.planned_sparks(args.inventory, args.limit)
    ca, hosts, settings, groups = sparks.ca, sparks.hosts, sparks.settings, sparks.groups
    quiet_connections()  # no SSH library's traceback on the terminal: the table says "unreachable over SSH"
    facts = read_hosts(args.inventory, list(hosts),
                       lambda h: ssh_facts(h, groups.get(h.name), settings[h.name]))
    with guard_client(ca) as client:
        rows = fleet_rows(list(hosts), groups, facts, lambda name: host_row(name, settings[name], hosts[name],
                                                                           facts[name], chat=args.chat, client=client))
    door = front_door_status(args.inventory)  # None: the inventory has no front door
    alerts = fleet_alerts(args.inventory)  # None: the inventory has no monitoring host
    backups = None if args.limit else backup_status(args.inventory)  # None: no backup target (or a --limit)
    if args.json:
        print(json.dumps({"hosts": rows, **({"front_door": door} if door else {}),
                          **({"alerts": alerts} if alerts else {}),
                          **({"backups": backups} if backups is not None else {})}, indent=2))
    else:
        out = console(log_width=LOG_WIDTH)  # a log gets the narrow table: readable in a 120-column window
        columns, cells = status_table(rows, wide=not narrow(out))
        print_table("sparkfleet status", columns, cells, out=out)
        for row in rows:
            if row.get("chat"):
                out.print(f"[bold]{literal(row['host'])}[/] answers: {literal(row['chat'])}")
        if door:
            print_table("front door", ("front door / backend", "url", "state"), status_rows(door), out=out)
        if alerts:
            for problem in alerts["problems"]:
                out.print(f"[red]{literal(problem)}[/]")
            if alerts["firing"]:
                firing = [(literal(a["alert"]), literal(a["host"]), literal(a["summary"])) for a in alerts["firing"]]
                print_table("alerts firing", ("alert", "host", "summary"), firing, out=out)
            elif not alerts["problems"]:
                out.print("alerts: none firing")
        if backups:
            print_table("backups", BACKUP_COLUMNS, backup_rows(backups), out=out)
    healthy = all(row["healthy"] for row in rows) and (door is None or door_ok(door))
    return 0 if healthy and alerts_ok(alerts) else 1
