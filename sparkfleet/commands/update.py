"""`sparkfleet update INVENTORY`: re-resolve the lock's models and images, show what moves and write it
(fleet/update.py `update`)."""

from __future__ import annotations

import json

from sparkfleet.refused import FAILED, Refused

NAME = "update"
HELP = "re-resolve the lock's models and images: show what moves, write it"


def arguments(parser) -> None:
    parser.add_argument("inventory")
    parser.add_argument("--limit", help="re-resolve only this host's (or group's) models and images")
    parser.add_argument("--json", action="store_true", help="print the changes as JSON")


def run(args) -> int:
    """0: the lock is up to date or was updated; 1: a hub or registry did not answer; 2: bad input."""
    from sparkfleet.fleet.update import UpdateError, change_lines, update
    from sparkfleet.tables import clean, literal, print_table

    try:
        report = update(args.inventory, args.limit)
    except UpdateError as exc:
        raise Refused(f"cannot update the lock, nothing was written: {exc}", FAILED) from exc
    if report.written:  # the lock is part of the controller's state: backed up where the inventory has a target
        from sparkfleet.commands.common import log
        from sparkfleet.fleet.backup import after_change

        after_change(args.inventory, log)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
        return 0
    if not report.changes:
        print(clean(f"up to date: {report.lock}" + (f" (added {', '.join(report.added)})" if report.added else "")))
        return 0
    print("\n".join(clean(line) for c in report.changes for line in change_lines(c)))  # a hub named the files
    if report.restart:
        print_table("hosts that restart on the rollout", ("host", "release now", "new release"),
                    [(literal(h), literal(old or "-"), literal(new or "-"))
                     for h, (old, new) in report.restart.items()])
    else:
        print("no host's release changes: nothing restarts")
    print(f"wrote {report.lock}: apply it with `sparkfleet rollout {args.inventory} --batch 1`")
    return 0
