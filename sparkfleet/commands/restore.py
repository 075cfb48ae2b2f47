"""`sparkfleet restore INVENTORY chat-ui|controller`: put an office's data back from its backups (fleet/backup.py).

`chat-ui [--snapshot ID] [--host NAME] --yes`: the chat UI's data from a snapshot onto the inventory's chat UI host,
which may be another Spark than the one it came from (move the chat UI there in the inventory and converge first).
The snapshot is checked from the controller first (the repository opens with the office's password, the snapshot
exists and this fleet wrote it); then the host's helper stops the UI, puts the data in place (a database newer than
the running Open WebUI refused), starts it and waits for its answer, and keeps the data it replaced until then.

`controller [--snapshot ID] [--password-file F] --yes`: on a new controller, the secrets file, the front door's
certificate and key, the fleet CA (its key and generations) and the release lock, each written where the
inventory names it (0600; the certificates and the lock 0644), and the backup password file where it is missing.
The password: --password-file F (one line, chmod 600), else the inventory's controller_backup_password_file where
it exists, else asked on the terminal (never an argument). The inventory loads while the secrets file it names is
still missing: this command alone sets SPARKFLEET_RESTORING=1 for itself, under which the inventory's read of the
missing file gives a placeholder (fleet/users.py read_secrets); nothing is converged with it.

Without --yes, both say what they would overwrite and change nothing. Exit status: 0 done (or the dry run); 1 the
target or the host did not answer, or the restore failed (the data it would replace is back); 2 refused."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from sparkfleet.commands import common
from sparkfleet.refused import FAILED, Refused

NAME = "restore"
HELP = "put the chat UI's data or the controller's files back from a backup (--yes; without it: what it would do)"
WHAT = ("chat-ui", "controller")
RESTORING = "SPARKFLEET_RESTORING"  # fleet/users.py RESTORING_ENV (this module stays light at import)


def arguments(parser) -> None:
    parser.epilog = ("controller, on a new controller: the inventory from git loads while the secrets file it names "
                     f"is still missing (this command alone sets {RESTORING}=1 for itself: the missing file reads as "
                     "a placeholder, nothing is converged with it); the password from --password-file, else the "
                     "inventory's controller_backup_password_file, else asked (never an argument). Without --yes: "
                     "what it would overwrite, nothing changed.")
    parser.add_argument("inventory")
    parser.add_argument("what", choices=WHAT, help="chat-ui: the chat UI's data; controller: the controller's files")
    parser.add_argument("--snapshot", default="latest", metavar="ID",
                        help="a snapshot's id or its short id (`sparkfleet backup INVENTORY --list`; default latest)")
    parser.add_argument("--host", help="chat-ui: the chat UI host (default the group chat_ui's; refused if not in it)")
    parser.add_argument("--password-file", metavar="F",
                        help="controller: the file holding the office's backup password (one line, chmod 600); "
                             "default the inventory's controller_backup_password_file, else asked")
    parser.add_argument("--yes", action="store_true", help="do it (without: what it would overwrite, nothing changed)")
    common.as_json(parser, "print the result as JSON")


def run(args) -> int:
    if args.what == "controller":
        if args.host:
            raise Refused("--host is for `restore ... chat-ui`: the controller's files go where the inventory names "
                          "them")
        return controller(args)
    if args.password_file:
        raise Refused("--password-file is for `restore ... controller`: a chat UI restore uses this controller's "
                      "controller_backup_password_file")
    return chat_ui(args)


def chat_ui(args) -> int:
    from sparkfleet.fleet.backup import NO_TARGET, chat_ui_host, check_chat_ui_snapshot, office_of, restore_chat_ui
    from sparkfleet.fleet.status import quiet_connections
    from sparkfleet.tables import clean

    office = office_of(args.inventory)
    host = chat_ui_host(office.chat_ui, args.host)
    if not office.configured:
        raise Refused(NO_TARGET)
    snapshot = check_chat_ui_snapshot(office, args.snapshot)  # before the host is touched
    quiet_connections()
    result = restore_chat_ui(args.inventory, host, str(snapshot["id"]), dry_run=not args.yes)
    if args.json:
        print(json.dumps({"host": host, "snapshot": snapshot.get("short_id"), **result}, indent=2))
    if result.get("ok") is not True:
        raise Refused(f"the chat UI was not restored on {host}: {clean(result.get('error') or 'no reason given')}",
                      FAILED)
    if args.json:
        return 0
    when = str(snapshot.get("time", "?"))[:19]
    version = result.get("version") or "none (older than its migrations)"
    replaces = [str(name) for name in result.get("replaces") or []]
    if not args.yes:
        print(clean(f"would restore the chat UI's snapshot {snapshot.get('short_id')} ({when}) on {host}, database "
                    f"revision {version}: it replaces {result.get('data')} ({', '.join(replaces) or 'empty'}), "
                    f"kept aside until the restored UI answers"))
        print("nothing was changed: --yes restores it")
        return 0
    print(clean(f"restored the chat UI's snapshot {snapshot.get('short_id')} ({when}) on {host}: database revision "
                f"{version}; the chat UI answers"))
    return 0


def password_of(args, office) -> str:
    """The office's password: --password-file, else the inventory's password file where it exists, else asked."""
    import getpass

    from sparkfleet.fleet.backup import read_password

    if args.password_file:
        return read_password(Path(args.password_file).expanduser(), "--password-file")
    if office.password_file is not None and office.password_file.exists():
        return read_password(office.password_file)
    if not sys.stdin.isatty():
        raise Refused("no backup password: give --password-file F (one line, chmod 600), or run this on a terminal "
                      "to type it")
    password = getpass.getpass("the office's backup password (written down at `sparkfleet init`): ").strip()
    if not password:
        raise Refused("no backup password given: nothing was restored")
    return password


def controller(args) -> int:
    from sparkfleet.fleet.backup import NO_TARGET, office_of, restore_controller, write_private
    from sparkfleet.fleet.users import RESTORING_ENV
    from sparkfleet.tables import literal, print_table

    before = os.environ.get(RESTORING_ENV)
    os.environ[RESTORING_ENV] = "1"  # while the inventory loads only: its secrets file may be missing
    try:
        office = office_of(args.inventory)
    finally:
        if before is None:
            os.environ.pop(RESTORING_ENV, None)
        else:
            os.environ[RESTORING_ENV] = before
    if not office.configured:
        raise Refused(f"{NO_TARGET}, as the lost controller's inventory had it")
    password = password_of(args, office)
    snapshot, plan = restore_controller(office.repository_for("controller"), password, office.files,
                                        args.snapshot, yes=args.yes, target=office.reach())
    pw = office.password_file
    if pw is not None:
        plan.append({"file": "backup password", "path": str(pw), "exists": pw.exists(), "mode": "0600"})
        if args.yes and not pw.exists():
            write_private(pw, (password + "\n").encode())
            plan[-1]["written"] = True
    if args.json:
        print(json.dumps({"snapshot": snapshot.get("short_id"), "time": snapshot.get("time"), "yes": args.yes,
                          "files": plan}, indent=2))
        return 0

    def state(row: dict) -> str:
        if row["path"] is None:
            return "[yellow]the inventory names no place for it: left out[/]"
        if row["file"] == "backup password" and row["exists"] and not row.get("written"):
            return "kept (exists)"
        if args.yes:
            return "[green]written[/]" if row.get("written") else "[red]not written[/]"
        return "would overwrite it" if row["exists"] else "would write it (missing)"

    title = f"sparkfleet restore controller: snapshot {snapshot.get('short_id')} ({str(snapshot.get('time'))[:19]})"
    print_table(title, ("file", "path", "mode", "now"),
                [(literal(r["file"]), literal(r["path"] or "-"), r["mode"], state(r)) for r in plan])
    if not args.yes:
        print("nothing was changed: --yes writes them")
    else:
        print(f"next: `sparkfleet plan {args.inventory}`; a converge changes nothing, and every key answers as before")
    return 0
