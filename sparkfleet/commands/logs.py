"""`sparkfleet logs INVENTORY HOST`: a unit's journal on one host, over SSH, each line the host printed through the
terminal sanitizer (fleet/logs.py `run_shown`)."""

from __future__ import annotations

import shutil
import sys

from sparkfleet.commands import common
from sparkfleet.fleet.logs import DEFAULT_LINES, UNITS
from sparkfleet.refused import Refused

NAME = "logs"
HELP = "a unit's journal on one host, over SSH"


def arguments(parser) -> None:
    parser.add_argument("inventory")
    parser.add_argument("host", help="the inventory's name of the host")
    parser.add_argument("--unit", default="engine", metavar="|".join([*UNITS, "SERVICE"]),
                        help="which unit: the engine (default), watchdog, front-door, ray, guard, share, "
                             "or a RAG service's name")
    parser.add_argument("-f", "--follow", action="store_true", help="keep printing new lines (Ctrl-C ends)")
    parser.add_argument("-n", "--lines", type=int, default=DEFAULT_LINES,
                        help=f"how many of the last lines (default {DEFAULT_LINES})")
    common.as_json(parser, "journal entries as JSON, one per line (journalctl --output json)")


def run(args) -> int:
    from sparkfleet.contract.settings import parse_settings
    from sparkfleet.controller.inventory import load_hosts
    from sparkfleet.fleet.logs import logs_argv, pick_host, run_shown

    data = pick_host(load_hosts(args.inventory), args.host)
    services = [] if args.unit in UNITS else sorted(parse_settings(args.host, data).services)
    argv = logs_argv(args.host, data, args.unit, services, lines=args.lines, follow=args.follow,
                     as_json=args.json)
    if not shutil.which(argv[0]):
        raise Refused("no `ssh` on this machine: install OpenSSH's client")
    sys.stdout.flush()
    return run_shown(argv, sys.stdout, sys.stderr, as_json=args.json)  # Ctrl-C ends --follow
