"""One read of everything a no-op converge decides from: the mode, owner and sha256 of every file sparkfleet manages
outside the model root (paths.MANAGED_GLOBS), the state of its units, its packages and users, in a single command.

pyinfra 3 caches no fact and runs an operation's facts twice (when the deploy is planned, again when it runs): a
converge of files.put calls costs a few round trips per file. The managed operations (sparkfleet/host/managed.py)
read this snapshot instead, and the stages' other reads go through `fact`: each answer is kept while no operation
has run commands on the host, and preflight's one round trip (read_facts) answers most of them up front. The read
is POSIX shell (stat, sha256sum, systemctl): it works on a bare host, before any helper is installed. Secret files
are hashed on the host: their content never leaves it.
"""

from __future__ import annotations

import re
import shlex

from pyinfra.api import FactBase

from sparkfleet.contract import paths

_STAT_LINE = re.compile(r"S (regular file|regular empty file|directory|symbolic link)\|([0-7]{3,4}) (\S+) (\S+) (/.*)")
_HASH_LINE = re.compile(r"H ([0-9a-f]{64})  (/.*)")  # sha256sum escapes a name holding \\ or a newline: no match
_KINDS = {"regular file": "file", "regular empty file": "file", "directory": "dir", "symbolic link": "link"}
_NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]*\*?[A-Za-z0-9._-]*")
RUNNING = ("running", "waiting", "exited", "listening", "mounted")  # as pyinfra's SystemdStatus
ENABLED = ("enabled", "static")  # as pyinfra's SystemdEnabled
UNIT_PREFIX = "sparkfleet-"
NO_UNIT = {"running": False, "enabled": False, "failed": False}  # no file, not loaded

_DEB_FORMAT = "P ${Package} ${Version} ${db:Status-Abbrev}\n"
_DEB_LINE = re.compile(r"P ([a-z0-9][a-z0-9+.-]*) (\S+) (\S+)\s*")
_USER_LINE = re.compile(r"W ([a-z_][a-z0-9_-]*):[^:]*:(\d+):(\d+):[^:]*:([^:]*):([^:]*)")
_UNITS = (
    'command -v systemctl >/dev/null || exit 0; '
    f'for f in {paths.SYSTEMD_DIR}/{UNIT_PREFIX}*; do [ -f "$f" ] && set -- "$@" "${{f##*/}}"; done; '
    f"set -- \"$@\" $(systemctl list-units --all --plain --no-legend '{UNIT_PREFIX}*' 2>/dev/null | "
    "awk '{print $1}'); "
    'systemctl show --property=Id --property=ActiveState --property=SubState --property=UnitFileState -- "$@" '
    '2>/dev/null | sed "s/^/U /"'
)


def glob_word(pattern: str) -> str:
    """A path for the shell, quoted, its last component's one `*` left to the shell (depth 1, never deeper)."""
    head, _, name = pattern.rpartition("/")
    if "*" in head:
        raise ValueError(f"{pattern}: only the last component of a managed path may hold one `*`")
    if "*" not in name:
        return shlex.quote(pattern)
    if not _NAME_PATTERN.fullmatch(name):
        raise ValueError(f"{pattern}: only the last component of a managed path may hold one `*`")
    before, _, after = name.partition("*")
    return shlex.quote(f"{head}/{before}") + "*" + (shlex.quote(after) if after else "")


def state_command(globs, units, packages=(), users=()) -> str:
    """One stat and one sha256sum for every path the globs name (a fork per file would cost the host more than
    the round trip saves), then the packages, users and units asked for."""
    files = " ".join(glob_word(g) for g in globs)
    stats = (f'set --; for f in {files}; do if [ -L "$f" ] || [ -e "$f" ]; then set -- "$@" "$f"; fi; done; '
             "[ $# -eq 0 ] || stat -c 'S %F|%a %U %G %n' -- \"$@\" 2>/dev/null; "
             f'set --; for f in {files}; do if [ -f "$f" ] && [ ! -L "$f" ]; then set -- "$@" "$f"; fi; done; '
             "[ $# -eq 0 ] || sha256sum -- \"$@\" 2>/dev/null | sed 's/^/H /'; " if globs else "")
    debs = (f"command -v dpkg-query >/dev/null && dpkg-query -W -f {shlex.quote(_DEB_FORMAT)} -- "
            f"{' '.join(shlex.quote(p) for p in packages)} 2>/dev/null; " if packages else "")
    accounts = "".join(f"getent passwd {shlex.quote(u)} | sed 's/^/W /'; " for u in users)
    named = " ".join(shlex.quote(u) for u in units)
    return f"{stats}{debs}{accounts}" + (f"set -- {named}; {_UNITS}" if units else "true")


def parse_state(lines: list[str]) -> dict:
    """{"files": {path: {type, mode, user, group, sha256}}, "units": {unit: {running, enabled, failed}},
    "packages": {name: installed version}, "users": {name: {uid, home, shell}}}. What the host printed is data: a
    line that does not parse is left out (its file reads as absent: put again, never trusted)."""
    files, hashes, units, unit, packages, users = {}, {}, {}, None, {}, {}
    for line in lines:
        line = line.rstrip("\r\n")
        account = _USER_LINE.fullmatch(line)
        if account:
            name, uid, _, home, shell = account.groups()
            users[name] = {"uid": int(uid), "home": home, "shell": shell}
            continue
        deb = _DEB_LINE.fullmatch(line)
        if deb:
            if deb.group(3).startswith("ii"):
                packages[deb.group(1)] = deb.group(2)
            continue
        found = _STAT_LINE.fullmatch(line)
        if found:
            kind, mode, user, group, path = found.groups()
            files[path] = {"type": _KINDS[kind], "mode": int(mode, 8), "user": user, "group": group, "sha256": None}
            continue
        digest = _HASH_LINE.fullmatch(line)
        if digest:
            hashes[digest.group(2)] = digest.group(1)
            continue
        if not line.startswith("U "):
            continue
        key, _, value = line[2:].strip().partition("=")
        if key == "Id":
            unit = units.setdefault(value, dict(NO_UNIT)) if value else None
        elif unit is not None and key == "SubState":
            unit["running"] = value in RUNNING
        elif unit is not None and key == "ActiveState":
            unit["failed"] = value == "failed"
        elif unit is not None and key == "UnitFileState":
            unit["enabled"] = value in ENABLED
            unit["linked"] = value == "enabled"  # a link to it in a .wants directory (not only "static")
    for path, digest in hashes.items():
        if path in files and files[path]["type"] == "file":
            files[path]["sha256"] = digest
    return {"files": files, "units": units, "packages": packages, "users": users}


class HostState(FactBase[dict]):
    """Every managed file's and unit's state in one command (parse_state)."""

    @staticmethod
    def default():
        return parse_state([])  # nothing printed: none of the paths exists

    def command(self):
        return state_command(paths.MANAGED_GLOBS, paths.MANAGED_UNITS, paths.MANAGED_PACKAGES, paths.MANAGED_USERS)

    def process(self, output):
        return parse_state(list(output))


class PathState(HostState):
    """One path outside the managed globs (the model root), read the same way."""

    def command(self, path: str):
        return state_command([path], [])


class UnitState(HostState):
    """One unit outside the managed units, read the same way."""

    def command(self, unit: str):
        return state_command([], [unit])


def _changes_so_far(host) -> int:
    """How many of this host's operations have run commands in this run: a snapshot older than the last is stale.

    This count is the only thing that makes a held answer stale. An operation does not announce a change it will
    make (pyinfra and host/drift.py's only_on_drift ask its generator whether it would yield a command, and that
    question must change nothing); before the change runs, the host still is what was read, and after it, pyinfra
    counts the operation executed. A retried operation (`_retries`) decides again from what it read first."""
    state = getattr(host, "state", None)
    if not getattr(state, "is_executing", False):
        return 0
    return sum(1 for data in getattr(state, "ops", {}).get(host, {}).values() if data.operation_meta.executed)


def _fact_key(cls, kwargs: dict) -> tuple:
    return cls, repr(sorted(kwargs.items()))


def _held(host) -> dict:
    held = getattr(host, "_sparkfleet_facts", None)
    if held is None:
        held = host._sparkfleet_facts = {}
    return held


def fact(host, cls, **kwargs):
    """host.get_fact(cls, **kwargs), read once while no operation has run commands on the host: pyinfra reads an
    operation's facts when the deploy is planned and again when it runs, and a converge that changes nothing
    needs each answer once (preflight's one round trip reads most of them, read_facts)."""
    key, changes = _fact_key(cls, kwargs), _changes_so_far(host)
    held = _held(host).get(key)
    if held is None or held[0] != changes:
        held = _held(host)[key] = (changes, host.get_fact(cls, **kwargs))
    return held[1]


def snapshot(host) -> dict:
    """The host's batched state, read again only after an operation on it ran commands."""
    return fact(host, HostState)


def _covered(path: str) -> bool:
    head, _, name = path.rpartition("/")
    return any(path == g or ("*" in g and g.rpartition("/")[0] == head
                             and re.fullmatch(re.escape(g.rpartition("/")[2]).replace(r"\*", ".*"), name))
               for g in paths.MANAGED_GLOBS)


def file_state(host, path: str) -> dict | None:
    """A path's {type, mode, user, group, sha256}, None when absent."""
    if not _covered(path):
        return fact(host, PathState, path=path)["files"].get(path)
    return snapshot(host)["files"].get(path)


def unit_state(host, unit: str) -> dict:
    """A unit's {running, enabled, failed}: a sparkfleet unit the read did not list has no file and is not loaded."""
    if not (unit.startswith(UNIT_PREFIX) or unit in paths.MANAGED_UNITS):
        return fact(host, UnitState, unit=unit)["units"].get(unit, dict(NO_UNIT))
    return {**NO_UNIT, **snapshot(host)["units"].get(unit, {})}


def unit_files(host) -> list[str]:
    """The names of the unit files in systemd's unit directory that sparkfleet names (sparkfleet-*), sorted."""
    prefix = f"{paths.SYSTEMD_DIR}/{UNIT_PREFIX}"
    return sorted(path.rpartition("/")[2] for path, found in snapshot(host)["files"].items()
                  if path.startswith(prefix) and found["type"] == "file")


def installed_packages(host) -> dict[str, str]:
    """The managed Debian packages installed (name -> version)."""
    return snapshot(host).get("packages", {})


def system_user(host, name: str) -> dict | None:
    """A managed user's {uid, home, shell}; None when the host has no such user."""
    return snapshot(host).get("users", {}).get(name)


_SECTION = "@@sparkfleet-fact"


class Facts(FactBase[dict]):
    """Several facts' commands in one round trip, each in its own subshell between markers, with its exit status:
    {index: (status, stdout lines)}."""

    def command(self, commands: list[str]):
        # the echo before each end marker ends an output whose last line has no newline (find -printf '%P\0')
        return "; ".join(f"echo {_SECTION} {i}; ( {c} ); rc=$?; echo; echo {_SECTION}-rc {i} $rc"
                         for i, c in enumerate(commands))

    def process(self, output):
        found, lines, current = {}, [], None
        for line in output:
            marker = line.split(" ")
            if marker[0] == _SECTION and len(marker) == 2:
                current, lines = marker[1], []
            elif marker[0] == f"{_SECTION}-rc" and len(marker) == 3 and marker[1] == current:
                found[int(current)] = (int(marker[2]) if marker[2].isdigit() else 1,
                                       lines[:-1] if lines and lines[-1] == "" else lines)
                current = None
            elif current is not None:
                lines.append(line)
        return found


def read_facts(host, wanted: dict) -> dict:
    """{name: value} for {name: (fact class, kwargs)}, as host.get_fact would return each, in one round trip; each
    answer is then held for `fact` (a later stage's read of it costs nothing while the host is unchanged). A fact
    that needs a binary reads as its default where the binary is missing, as pyinfra's own check does; one whose
    command failed, or that needs another shell, is read again on its own (as before)."""
    changes = _changes_so_far(host)
    held = _held(host)

    def current(cls, kwargs):
        found = held.get(_fact_key(cls, kwargs))
        return found is not None and found[0] == changes

    batched = {name: (cls, kwargs) for name, (cls, kwargs) in wanted.items()
               if not cls.shell_executable and not current(cls, kwargs)}
    facts = {name: cls() for name, (cls, _) in batched.items()}  # process() may read what command() kept
    commands = []
    for name, (_, kwargs) in batched.items():
        command, needs = facts[name].command(**kwargs), facts[name].requires_command(**kwargs)
        text = command.get_raw_value() if hasattr(command, "get_raw_value") else str(command)
        commands.append(f"command -v {shlex.quote(str(needs))} >/dev/null 2>&1 || exit 0; {text}" if needs else text)
    answers = host.get_fact(Facts, commands=commands) if commands else {}
    for index, (name, (cls, kwargs)) in enumerate(batched.items()):
        status, lines = answers.get(index, (1, []))
        if status == 0:
            held[_fact_key(cls, kwargs)] = (changes, facts[name].process(lines) if lines else facts[name].default())
    return {name: fact(host, cls, **kwargs) for name, (cls, kwargs) in wanted.items()}
