"""`sparkfleet users add|list|rotate|remove|limit INVENTORY [NAME]`: the front door's users, in the secrets file."""

from __future__ import annotations

import json
import sys

from sparkfleet.commands import common

NAME = "users"
HELP = "the front door's users: add, list, rotate or remove a key, set limits"
ACTIONS = (("add", "a new user: prints their key once"),
           ("list", "the users' names (never their keys)"),
           ("rotate", "a new key for a user: prints it once"),
           ("remove", "take a user's key away"),
           ("limit", "a user's own fair share at the front door (429 past it)"))


def arguments(parser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    for action, text in ACTIONS:
        one = actions.add_parser(action, help=text)
        one.add_argument("inventory")
        if action != "list":
            one.add_argument("name")
        if action == "limit":
            one.add_argument("--requests-per-minute", type=common.count, metavar="N",
                             help="requests a minute before 429 (0: the fleet's front_door_requests_per_minute)")
            one.add_argument("--max-concurrent", type=common.count, metavar="M",
                             help="requests at once before 429 (0: the fleet's front_door_max_concurrent)")
        common.as_json(one, "print JSON")


def run(args) -> int:
    from sparkfleet.fleet import users

    path = users.secrets_path_of(args.inventory)
    if args.action == "list":
        names = users.names(users.read_secrets(path))
        print(json.dumps({"users": names}) if args.json else "\n".join(names), end="\n" if names or args.json else "")
        return 0
    if args.action == "limit":
        return limit(args, users, path)
    if args.action == "remove":
        key = users.edit(path, lambda doc: (users.remove(doc, args.name), None))
    else:
        key = users.edit(path, lambda doc: getattr(users, args.action)(doc, args.name))
    converge = f"the next converge (sparkfleet rollout {args.inventory}, or pyinfra {args.inventory} deploy.py)"
    if args.json:
        print(json.dumps({"user": args.name, "action": args.action, **({"key": key} if key else {})}))
    elif key:
        print(key)
    if key:
        old = "; the old key works until then" if args.action == "rotate" else ""
        print(f"{args.name}'s key is shown once (above): give it to {args.name}; {converge} puts it on the front "
              f"door{old}", file=sys.stderr)
    else:
        print(f"removed {args.name} from {path}: their key answers 401 after {converge}", file=sys.stderr)
    backed_up(args)
    return 0


def backed_up(args) -> None:
    """After a change of the secrets file: the controller's state backed up where the inventory has a backup target
    (best effort: one line when it fails; the change stands)."""
    from sparkfleet.commands import common
    from sparkfleet.fleet.backup import after_change

    after_change(args.inventory, common.log)


def limit(args, users, path) -> int:
    """`users limit`: a user's own limits in the secrets file (an option left out keeps its value; 0: the
    fleet-wide default)."""
    name = users.check_name(args.name)
    given = {"requests_per_minute": args.requests_per_minute, "max_concurrent": args.max_concurrent}

    def change(doc: dict) -> tuple[dict, dict]:
        now = users.limits_of(doc).get(name, {})
        wanted = {k: now.get(k) if v is None else (v or None) for k, v in given.items()}
        return users.limit(doc, name, **wanted), wanted

    wanted = users.edit(path, change)
    if args.json:
        print(json.dumps({"user": name, "action": "limit", **wanted}))
    else:
        shown = {k: "the fleet default" if v is None else str(v) for k, v in wanted.items()}
        print(f"{name}: requests a minute {shown['requests_per_minute']}, at once {shown['max_concurrent']}; "
              f"the next converge (sparkfleet rollout {args.inventory}) puts it on the front door", file=sys.stderr)
    backed_up(args)
    return 0
