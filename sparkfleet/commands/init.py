"""`sparkfleet init DIR --host NAME=ADDRESS ...`: a ready office project (inventory, deploy.py, secrets, host keys)."""

from __future__ import annotations

import json
from pathlib import Path

from sparkfleet.commands import common

NAME = "init"
HELP = "write a ready office project: inventory, deploy.py, secrets, host keys"


def arguments(parser) -> None:
    parser.add_argument("dir", help="the project directory (new or empty)")
    parser.add_argument("--host", action="append", default=[], required=True, metavar="NAME=ADDRESS",
                        help="a Spark: its inventory name and address (once per Spark; the first runs the front door)")
    parser.add_argument("--front-door", action="append", default=[], metavar="NAME",
                        help="a Spark that runs a front door (once per door; default: the first --host); two or "
                             "more share --front-door-address")
    parser.add_argument("--front-door-address", metavar="CIDR",
                        help="the address two or more front doors share (keepalived), e.g. 10.0.0.100/24: a free "
                             "address in the Sparks' subnet")
    parser.add_argument("--ssh-user", default="root", help="the SSH user on the Sparks (default root)")
    parser.add_argument("--secrets", help="the keys file, outside the project and any git work tree "
                                          "(default ~/.config/sparkfleet/<dir name>.json)")
    parser.add_argument("--force", action="store_true",
                        help="in a non-empty directory: rewrite inventory.py, deploy.py and group_data/all.py; "
                             "an existing secrets file is kept")
    common.as_json(parser, "print what was written as JSON")


def run(args) -> int:
    from sparkfleet.fleet.project import host_key_lines, init_project, parse_host

    sparks = [parse_host(text) for text in args.host]
    report = init_project(Path(args.dir), sparks, ssh_user=args.ssh_user,
                          secrets=Path(args.secrets) if args.secrets else None, force=args.force,
                          front_doors=args.front_door, front_door_address=args.front_door_address)
    if args.json:  # the backup password's file, never the password: JSON is kept by scripts and logs
        print(json.dumps(report.to_dict(), indent=2))
        return 0
    inventory = report.project / "inventory.py"
    print(f"wrote {report.project}/: inventory.py, deploy.py, group_data/all.py, known_hosts")
    print(f"secrets: {report.secrets} (0600, outside the project): "
          + ("kept as it was" if report.secrets_reused else "a new api_key, no users yet"))
    if report.tls:
        print(f"front door TLS: a self-signed certificate, {report.tls[0]}: hand colleagues that file (not secret; "
              f"the .key beside it is) and their clients trust it (the README's client example, or "
              f"SSL_CERT_FILE={report.tls[0].name})")
    else:
        print("front door TLS: none (no openssl here): set front_door_tls_cert and front_door_tls_key in "
              f"{inventory} before adding users")
    if report.backup_password:
        print(f"backup password: {report.backup_password}")
        print("write it down: a restore on a new controller needs it (with this project's inventory from git); it "
              f"is kept in {report.backup_password_file} (0600) and shown only this once")
    elif report.backup_password_file:
        print(f"backup password: {report.backup_password_file} (kept as it was)")
    print(f"SSH host keys ({report.project / 'known_hosts'}):")
    print("\n".join(host_key_lines(report.hosts)))
    print(f"next: sparkfleet users add {inventory} NAME; sparkfleet plan {inventory}")
    return 0
