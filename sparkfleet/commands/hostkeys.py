"""`sparkfleet hostkeys INVENTORY`: add the SSH host keys the inventory's known_hosts lacks; print them."""

from __future__ import annotations

import json

from sparkfleet.commands import common
from sparkfleet.refused import Refused

NAME = "hostkeys"
HELP = "add the SSH host keys the inventory's known_hosts lacks; print them"


def arguments(parser) -> None:
    parser.add_argument("inventory")
    common.limit(parser)
    common.as_json(parser)


def run(args) -> int:
    from sparkfleet.controller.inventory import load_hosts
    from sparkfleet.fleet.project import collect_host_keys, host_key_lines, host_key_targets

    targets, unchecked = host_key_targets(load_hosts(args.inventory, args.limit))
    if unchecked:
        raise Refused(f"{', '.join(unchecked)}: no ssh_known_hosts_file in {args.inventory}: set it (with "
                      "ssh_strict_host_key_checking = \"yes\"), so that a host's key has one place to go")
    results = {path: collect_host_keys(path, sparks) for path, sparks in targets.items()}
    if args.json:
        print(json.dumps({"known_hosts": {str(p): [r.to_dict() for r in rs] for p, rs in results.items()}},
                         indent=2))
    else:
        for path, found in results.items():
            print(f"SSH host keys ({path}):")
            print("\n".join(host_key_lines(found)))
    return 0 if all(r.state != "no answer" for rs in results.values() for r in rs) else 1
