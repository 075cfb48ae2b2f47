"""`sparkfleet logs`: a unit's journal on one Spark, over OpenSSH with the inventory's SSH settings.

OpenSSH rather than pyinfra's connection: `--follow` streams until Ctrl-C, and `ssh` already does that
(and the terminal) well. The argv is built plainly, so that what runs is what the tests read: the inventory's
user, port, key and host-key policy with its known_hosts (contract/reach.py `ssh_command`, the speed gate's
forward's too), and one remote command quoted with shlex. No secret is on it (a key file is named, never read).
"""

from __future__ import annotations

import shlex

from sparkfleet.contract import paths
from sparkfleet.contract.reach import ssh_command
from sparkfleet.refused import Refusal

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
