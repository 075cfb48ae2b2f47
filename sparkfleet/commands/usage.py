"""`sparkfleet usage INVENTORY`: per user and model at the front doors (summed), kept across their restarts."""

from __future__ import annotations

import json

from sparkfleet.commands import common
from sparkfleet.refused import Refused

NAME = "usage"
HELP = "per user and model at the front door: requests, errors, bytes, in flight, tokens, refusals"


def arguments(parser) -> None:
    parser.add_argument("inventory")
    common.as_json(parser)
    parser.add_argument("--since", metavar="DURATION", help="a window of history (not read yet: refused)")


def run(args) -> int:
    if args.since:
        raise Refused("--since is not read by this sparkfleet yet: without it, usage counts from each front "
                      "door's first start (kept across restarts); for a window, ask Prometheus on the monitoring host "
                      "(sparkfleet_user_* series, docs/monitoring.md) or open the status page")
    from sparkfleet.fleet.usage import HEADERS, fleet_usage, usage_rows
    from sparkfleet.tables import console, literal, print_table

    found = fleet_usage(args.inventory)
    if args.json:
        print(json.dumps(found, indent=2))
    else:
        out = console()
        print_table("sparkfleet usage (every front door, summed; saved every few seconds)", HEADERS,
                    usage_rows(found["users"]), out=out)
        for door in found["doors"]:
            if not door["ok"]:
                out.print(f"[red]front door {literal(door['host'])} ({literal(door['url'])}): "
                          f"{literal(door['problem'])}[/]")
    return 0 if all(d["ok"] for d in found["doors"]) else 1
