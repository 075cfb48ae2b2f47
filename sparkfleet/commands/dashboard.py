"""`sparkfleet dashboard`: the office's Grafana dashboard (JSON), its engine panels built from the engines'
descriptors (sparkfleet/roles/dashboard.py)."""

from __future__ import annotations

import json

from sparkfleet.commands import common

NAME = "dashboard"
HELP = "print the Grafana dashboard (JSON) of the office's Prometheus: engines, GB10, memory, front door, users"


def arguments(parser) -> None:
    parser.add_argument("--output", "-o", metavar="FILE", help="write it to FILE instead of printing it")
    common.as_json(parser, "the dashboard is JSON; with --output, print what was written as JSON")


def run(args) -> int:
    from sparkfleet.roles.dashboard import dashboard_json

    text = dashboard_json()
    if not args.output:
        print(text, end="")
        return 0
    with common.refusing(OSError):
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    print(json.dumps({"written": args.output}) if args.json
          else f"wrote {args.output}: import it in Grafana and pick your Prometheus as its datasource")
    return 0
