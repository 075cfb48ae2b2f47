"""`sparkfleet logs`: a unit's journal on one Spark, over OpenSSH with the inventory's SSH settings.

OpenSSH rather than pyinfra's connection: `--follow` streams until Ctrl-C, and `ssh` already does that well. The
argv is built plainly, so that what runs is what the tests read: the inventory's user, port, key and host-key
policy with its known_hosts (contract/reach.py `ssh_command`, the speed gate's forward's too), and one remote
command quoted with shlex. No secret is on it (a key file is named, never read).

What the host prints is untrusted (a journal holds whatever an engine, or the hub code it ran, logged): every line,
of ssh's output and of its errors, reaches the terminal through the project's one sanitizer (`shown`: tables.py
`clean`, ESC, C1, bidi and the rest as visible escapes; a JSON entry re-written with JSON's own escapes, so it stays
JSON). Only ssh's own prompts (a password, a host key) go to the terminal directly, as ssh writes them there.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import threading
from collections.abc import Iterable
from typing import IO

from sparkfleet.contract import paths
from sparkfleet.contract.reach import ssh_command
from sparkfleet.refused import Refusal
from sparkfleet.tables import clean

UNITS = {
    "engine": paths.UNIT_NAME,
    "watchdog": paths.WATCHDOG_UNIT,
    "front-door": paths.FRONT_DOOR_UNIT_NAME,
    "ray": paths.RAY_UNIT_NAME,
    "guard": paths.GUARD_UNIT_NAME,
    "share": paths.SHARE_UNIT_NAME,
}
DEFAULT_LINES = 200


class LogsError(ValueError, Refusal):
    """The host or unit cannot be read: one line naming the fix (a refusal, exit 2)."""


def unit_for(choice: str, services: list[str]) -> str:
    """The systemd unit of `--unit`: one of UNITS, or a RAG service of this host (its own vLLM unit)."""
    if choice in UNITS:
        return UNITS[choice]
    if choice in services:
        return paths.service_unit(choice)
    raise LogsError(f"--unit {choice!r}: give one of {', '.join(UNITS)}"
                    + (f", or a service of this host ({', '.join(services)})" if services else
                       " (this host runs no RAG service)"))


def journal_command(unit: str, lines: int = DEFAULT_LINES, follow: bool = False, as_json: bool = False) -> list[str]:
    """The journalctl run on the host."""
    return ["journalctl", "--no-pager", "--unit", unit, "--lines", str(lines),
            *(["--follow"] if follow else []), *(["--output", "json"] if as_json else [])]


def ssh_argv(host: str, data: dict, remote: list[str]) -> list[str]:
    """`ssh` with pyinfra's connection settings of this host (its merged inventory data: contract/reach.py
    `ssh_command`) running `remote`."""
    if data.get("_sudo"):
        remote = ["sudo", "-n", *remote]
    return [*ssh_command(host, data), shlex.join(remote)]


def pick_host(hosts: list[tuple[str, dict]], host: str) -> dict:
    """The merged data of `host` among the inventory's (name, data) list."""
    found = dict(hosts)
    if host not in found:
        raise LogsError(f"no host named {host!r} in the inventory: its hosts are {', '.join(found) or 'none'}")
    return found[host]


def logs_argv(host: str, data: dict, unit: str, services: list[str], lines: int = DEFAULT_LINES,
              follow: bool = False, as_json: bool = False) -> list[str]:
    """The whole `sparkfleet logs` command line: ssh to `host`, journalctl of the chosen unit there."""
    if lines < 1:
        raise LogsError(f"-n {lines}: give a positive number of lines")
    return ssh_argv(host, data, journal_command(unit_for(unit, services), lines, follow, as_json))


def shown(raw: bytes, as_json: bool = False) -> str:
    """One line the host printed, for the terminal: a journal entry of `--output json` re-written with JSON's own
    escapes (ASCII only: still the same JSON), anything else through `clean`, whole (journald bounds a line
    itself); bytes that are no UTF-8 shown as their escapes."""
    text = raw.decode("utf-8", errors="backslashreplace").rstrip("\r\n")
    if as_json:
        try:
            return json.dumps(json.loads(text), ensure_ascii=True)
        except ValueError:
            pass
    return clean(text, limit=None)


def relay(lines: Iterable[bytes], out: IO[str], as_json: bool = False) -> None:
    """Each line of `lines` to `out` through `shown`, flushed as it comes (`--follow`)."""
    for raw in lines:
        out.write(shown(raw, as_json) + "\n")
        out.flush()


def run_shown(argv: list[str], out: IO[str], err: IO[str], as_json: bool = False) -> int:
    """Run `argv` (ssh), its output and errors relayed line by line through `shown`; its exit status (130 where
    Ctrl-C ended it)."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    errors = threading.Thread(target=relay, args=(proc.stderr, err), daemon=True)
    errors.start()
    try:
        relay(proc.stdout, out, as_json)
        code = proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait()
        code = 130
    errors.join(timeout=5)
    return code
