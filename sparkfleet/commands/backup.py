"""`sparkfleet backup INVENTORY`: a backup now of the controller's state and of every data host (the chat UI's, each
front door's usage snapshot), to the inventory's backup target (fleet/backup.py); `--list`: each source's snapshots.

Exit status: 0 when every source made a snapshot; 1 when one did not (one line each: the problem and the fix; a
failed backup forgets nothing, the older snapshots stay); 2 on bad input (no backup target, no password file)."""

from __future__ import annotations

import json
import sys

from sparkfleet.commands import common

NAME = "backup"
HELP = "back up the controller's state and every data host now; non-zero if one failed"


def arguments(parser) -> None:
    parser.add_argument("inventory")
    parser.add_argument("--list", action="store_true", help="list each source's snapshots instead (nothing backed up)")
    common.as_json(parser)


def size(n) -> str:
    """Bytes for a person (restic's own figures)."""
    if not isinstance(n, int):
        return "-"
    value, units = float(n), ["B", "KiB", "MiB", "GiB"]
    while value >= 1024 and len(units) > 1:
        value, units = value / 1024, units[1:]
    return f"{n} B" if units[0] == "B" else f"{value:.1f} {units[0]}"


def run(args) -> int:
    from sparkfleet.fleet.backup import back_up_all, list_snapshots, office_of
    from sparkfleet.fleet.status import quiet_connections
    from sparkfleet.tables import clean, literal, print_table

    office = office_of(args.inventory)
    if args.list:
        found = list_snapshots(office)
        if args.json:
            print(json.dumps({"snapshots": found}, indent=2))
        else:
            print_table("sparkfleet backup --list", ("source", "snapshot", "time", "host"),
                        [(literal(source), literal(s.get("short_id", "?")), literal(s.get("time", "?")[:19]),
                          literal(s.get("hostname", "?"))) for source, snaps in found.items() for s in snaps])
        return 0
    quiet_connections()  # a data host that does not answer is a row of the table, not a paramiko traceback
    results = back_up_all(args.inventory, office)
    if args.json:
        print(json.dumps({"backups": [r.to_dict() for r in results]}, indent=2))
    else:
        rows = [(literal(r.source), literal(r.host), literal(r.snapshot or "-"),
                 size(r.bytes_added) if r.ok else "-", "-" if r.seconds is None else f"{r.seconds:g}",
                 "[green]ok[/]" if r.ok else "[red]FAILED[/]") for r in results]
        print_table("sparkfleet backup", ("source", "host", "snapshot", "added", "seconds", "result"), rows)
    for r in results:
        if not r.ok:
            print(clean(f"{r.source} ({r.host}): {r.error}"), file=sys.stderr)
    return 0 if all(r.ok for r in results) else 1
