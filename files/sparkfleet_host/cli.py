"""The package's commands, run on a host as `python3 /opt/sparkfleet/bin/sparkfleet_host ARGS` (its __main__)."""

from __future__ import annotations

import json

from sparkfleet_host.envfiles import LEGACY_KEY_VARS, keep_env, restore_env, serving_file_key_vars
from sparkfleet_host.eviction import ask_stats, last_requests
from sparkfleet_host.verify import read_record, scan


def main(argv: list[str]) -> None:
    """`sparkfleet_host DIR`: what testinfra compares with the manifest. `sparkfleet_host env-keep|env-restore
    LIVE KEPT FABRIC,NAMES [SERVING]`: a rollback's edit of the engine env, with no secret on the command line
    (the API key's variable from the serving file SERVING: serving_file_key_vars). `sparkfleet_host
    last-requests SOCKET`: each on-demand model's seconds since its last request, from the guard's stats.
    `sparkfleet_host backup run|snapshots|restore-chat-ui ...`: a data host's backup (backup.py's main)."""
    if argv[:1] == ["backup"]:
        from sparkfleet_host.backup import main as backup

        raise SystemExit(backup(argv[1:]))
    if argv[:1] == ["last-requests"] and len(argv) == 2:  # status: each on-demand model's last request
        print(json.dumps(last_requests(ask_stats(argv[1]))))
        return
    if argv[:1] in (["env-keep"], ["env-restore"]) and len(argv) in (4, 5):
        edit, fabric = keep_env if argv[0] == "env-keep" else restore_env, set(filter(None, argv[3].split(",")))
        key_vars = serving_file_key_vars(argv[4]) if len(argv) == 5 else LEGACY_KEY_VARS
        try:
            edit(argv[1], argv[2], fabric, key_vars)
        except OSError as exc:
            raise SystemExit(f"sparkfleet_host {argv[0]}: {exc.filename}: {exc.strerror}") from None
        return
    found, other = scan(argv[0])
    print(json.dumps({"record": read_record(argv[0]), "files": found, "others": other}))
