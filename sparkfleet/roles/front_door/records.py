"""What the controller sends a front door host over SSH: HAProxy's runtime API (through its socket) and the
records beside it, the drain record and the holds (`holds`); the stage and `FrontDoorRuntime`
(fleet/front_door/runtime.py) send them.

`sparkfleet drain` keeps a backend out until `undrain`: a root-only record on each front door host
(paths.FRONT_DOOR_DRAINED), beside HAProxy's own state and outside what a converge renders or manages, so a
converge of a drained fleet changes nothing. A reload keeps the backend's maintenance in HAProxy's server-state
file, a start replays the record (the unit's ExecStartPost, `replay_command`), and `FrontDoorRuntime.ready` (a
rollout's batch end, a rollback) skips what the record holds.
"""

from __future__ import annotations

import shlex

from sparkfleet.contract import paths
from sparkfleet.contract.monitoring import FRONT_DOOR_PROXY
from sparkfleet.roles.front_door.holds import Hold
from sparkfleet.roles.haproxy import SERVER_NAME

# The default backend (the door's own served model), which drain and its record address; the status page and the
# dashboards read it by this name too.
BACKEND = FRONT_DOOR_PROXY
CHAT_ROUTE = "chat_"  # each other chat model's backend is CHAT_ROUTE + N (plan.py); a RAG route's is model_N


def chat_backend(name: str) -> bool:
    """Does this backend route a chat model (the default one, or another chat model's)?"""
    return name == BACKEND or name.startswith(CHAT_ROUTE)
_SOCAT = f"socat -t 5 stdio UNIX-CONNECT:{paths.FRONT_DOOR_SOCKET}"  # HAProxy reads one line of commands


def runtime_command(*commands: str) -> str:
    """A shell command sending runtime API commands (one line, `;`-separated) to the front door's socket."""
    return f"echo {shlex.quote('; '.join(commands))} | {_SOCAT}"


def save_state_command() -> str:
    """Save every server's state into HAProxy's server-state file, which a reload or start loads (a drained
    backend's maintenance with it); before each reload, and after a drain or undrain. Through
    files/sparkfleet-servers-save: the configuration, not the file, decides each server's TLS and port."""
    return shlex.join([paths.SERVERS_SAVE, paths.FRONT_DOOR_SOCKET, paths.FRONT_DOOR_CONFIG,
                       paths.FRONT_DOOR_STATE_FILE])


def replay_command() -> str:
    """The drain record into HAProxy's runtime (every name in it to maintenance): the unit runs it once HAProxy
    serves after a start, so a record survives even a lost server-state file."""
    record = paths.FRONT_DOOR_DRAINED
    return (f'test -s {record} || exit 0; sed -n "/^[A-Za-z0-9]/s|.*|set server {BACKEND}/& state maint|p" '
            f'{record} | paste -sd";" | {_SOCAT}')


def _rewrite_command(record: str, kept: str, added: list[str] = ()) -> str:
    """`record` rewritten as the lines `kept` prints (a missing record prints none) and then `added`: written
    beside the old one (root-only) and renamed over it, so a reader sees the old record or the new one."""
    add = f" printf '%s\\n' {' '.join(shlex.quote(line) for line in added)};" if added else ""
    return f"umask 077 && {{ {kept} 2>/dev/null;{add} true; }} > {record}.new && mv -f {record}.new {record}"


def record_command(host: str, drained: bool) -> str:
    """Add `host` to the front door's drain record (drained) or take it off."""
    name = shlex.quote(host)
    return _rewrite_command(paths.FRONT_DOOR_DRAINED, f"grep -vxF -e {name} {paths.FRONT_DOOR_DRAINED}",
                            [host] if drained else [])


def undrain_command(host: str) -> str:
    """Take `host` off the drain record, put it back, and save HAProxy's server state (a later start keeps it in)."""
    ready = runtime_command(f"set server {BACKEND}/{host} state ready")
    return f"{record_command(host, drained=False)} && {ready} && {save_state_command()}"


def _ready_script(names: str) -> str:
    """Put the servers `names` expands to back, but for those the drain record holds: a `kept NAME` line each."""
    return (f'c=; for h in {names}; do if grep -qxF -e "$h" {paths.FRONT_DOOR_DRAINED} 2>/dev/null; '
            f'then echo "kept $h"; else c="$c${{c:+; }}set server {BACKEND}/$h state ready"; fi; done; '
            f'[ -z "$c" ] || echo "$c" | {_SOCAT}')


def ready_command(hosts: list[str]) -> str:
    """Put `hosts` back on a front door, but for those its drain record holds: a `kept NAME` line each."""
    return _ready_script(" ".join(shlex.quote(h) for h in hosts))


def _holds_without(names: str) -> str:
    """A command printing the hold record's lines but those of the backends `names` (one shell word expanding
    to names, space-separated): a line's first field is its backend."""
    return ("awk 'BEGIN { n = split(ARGV[1], d, \" \"); for (i = 1; i <= n; i++) drop[d[i]] = 1; ARGV[1] = \"\" } "
            f"!($1 in drop)' {names} {paths.FRONT_DOOR_HOLDS}")


def _drop_holds(names: str) -> str:
    """The holds of the backends `names` (as `_holds_without`) taken off the hold record."""
    return _rewrite_command(paths.FRONT_DOOR_HOLDS, _holds_without(names))


def hold_command(holds: list[Hold]) -> str:
    """Write `holds` on a front door's hold record, each replacing its backend's older line."""
    names = shlex.quote(" ".join(h.backend for h in holds))
    return _rewrite_command(paths.FRONT_DOOR_HOLDS, _holds_without(names), [h.line() for h in holds])


def back_command(hosts: list[str]) -> str:
    """A batch's end: `hosts` back (ready_command), then their holds dropped; a failed ready keeps the holds."""
    return f"{{ {ready_command(hosts)}; }} && {_drop_holds(shlex.quote(' '.join(hosts)))}"


def put_back_command(holds: list[Hold]) -> str:
    """Put back the backends of these (stale) holds on a front door that still has each very line (a newer hold,
    or none, leaves the backend be), then drop those lines; the drain record still keeps its hosts out."""
    lines, found = " ".join(shlex.quote(h.line()) for h in holds), '"$n"'
    return (f'n=; for l in {lines}; do grep -qxF -e "$l" {paths.FRONT_DOOR_HOLDS} 2>/dev/null && n="$n ${{l%% *}}"; '
            f'done; if [ -n "$n" ]; then {{ {_ready_script("$n")}; }} && {_drop_holds(found)}; fi')


def drained_names(record: str) -> set[str]:
    """The backend names a drain record holds (one a line; anything that is not a server name is skipped)."""
    return {line.strip() for line in record.splitlines() if SERVER_NAME.fullmatch(line.strip())}
