"""`sparkfleet drain INVENTORY HOST`: set a host aside on every front door and keep it out until `undrain`
(fleet/front_door.py `drain_host`); `undrain.py` runs the same with `drained` False."""

from __future__ import annotations

import json

from sparkfleet.commands import common

NAME = "drain"
HELP = "set HOST aside on every front door (its requests finish first) and keep it out until undrained"


def arguments(parser) -> None:
    parser.add_argument("inventory")
    parser.add_argument("host", help="a host of the inventory that serves behind the front door")
    common.as_json(parser)


def run(args) -> int:
    return door(args, drained=True)


def door(args, drained: bool) -> int:
    """drain / undrain: a thin wrapper over fleet/front_door.py's drain_host and undrain_host (their refusals:
    DrainRefused, exit 2; DoorUnreachable, exit 1)."""
    from sparkfleet.fleet.front_door.commands import drain_host, undrain_host

    act = drain_host if drained else undrain_host
    report = act(args.inventory, args.host, log=common.log)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        doors = ", ".join(f"{d['host']} ({d['state']})" for d in report["front_doors"])
        kept = (f"kept out across reloads, converges and rollouts until `sparkfleet undrain {args.inventory} "
                f"{args.host}`" if drained else "it takes requests once its health checks pass")
        print(f"{args.host}: {'drained' if drained else 'undrained'} on front door {doors}; {kept}")
    return 0
