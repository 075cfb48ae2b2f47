"""`sparkfleet rekey INVENTORY HOST...`: a new fleet TLS key for these hosts alone. Each host's key is derived from
the fleet CA's key, its name and its key generation (roles/pki.py); this bumps the generations, kept beside the CA
key, and the hosts' next converge installs the new key and a certificate for it. No other host's key changes."""

from __future__ import annotations

import json

from sparkfleet.commands import common
from sparkfleet.refused import Refused

NAME = "rekey"
HELP = "a new fleet TLS key for these hosts alone, installed by their next converge"


def arguments(parser) -> None:
    parser.add_argument("inventory")
    parser.add_argument("hosts", nargs="+", metavar="HOST", help="a host of the inventory whose key to rotate")
    common.as_json(parser, "print the new generations as JSON")


def run(args) -> int:
    from sparkfleet.contract.monitoring import FRONT_DOOR_GROUP
    from sparkfleet.contract.settings import GROUPS_KEY, parse_settings
    from sparkfleet.controller.inventory import load_hosts
    from sparkfleet.roles import pki

    hosts = load_hosts(args.inventory)
    known = dict(hosts)
    unknown = [h for h in args.hosts if h not in known]
    if unknown:
        raise Refused(f"{unknown[0]} is no host of {args.inventory}: name the inventory's hosts (a host that left "
                      "it keeps no key the fleet trusts once its certificate ends; its door peers refuse it now)")
    if pki.hosts_ca(hosts) is None:  # the CA checked (readable, private, a CA) before anything is written
        raise Refused(f"{args.inventory}: the hops to the guards are plain http (no front door or monitoring host, "
                      "or backend_key_in_clear): no host holds a fleet TLS key")
    first = parse_settings(*hosts[0])
    with common.refusing(pki.PkiError):
        bumped = pki.bump_generations(first.fleet_ca_key, args.hosts)
    doors = [h for h in bumped if FRONT_DOOR_GROUP in known[h].get(GROUPS_KEY, ())]
    if args.json:
        print(json.dumps({"generations": bumped, "converge": sorted(bumped), "doors": doors}, indent=2))
        return 0
    for host, generation in bumped.items():
        print(f"{host}: key generation {generation}")
    print(f"next: sparkfleet rollout {args.inventory} --limit HOST for each of them: its converge installs the new "
          "key and a certificate for it (until then it keeps serving with the old one)")
    if doors:
        print(f"{', '.join(doors)}: a front door: converge every door (--limit {FRONT_DOOR_GROUP}): each one's "
              "peers link trusts exactly the doors' current certificates")
    return 0
