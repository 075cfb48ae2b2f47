"""The desired state of one role on one host: what its stage ensures, as plain data planned without a host.

A role's planner (`roles/guard.py` `guard_state`, `roles/front_door/desired.py` `door_state`, ...) returns one
`DesiredState`: its steps in the order they are ensured (a package before the unit it ships is turned off, a key
file before the unit that reads it, a config before its reload, a check before the wait on what it checked). The
stage hands it to `tasks/ensure.py` `ensure`, which puts each step in place with its `host/` operation in one pass.

A unit's restart, reload and daemon-reload, a command and a wait are decided from what the steps before them
changed, named by key: a file's (or directory's, or absent path's) path, a unit's name, a command's or a wait's
name. A unit restarts when a step of `restart_on` changed, else reloads when one of `reload_on` did. A key another
stage ensures first (this host's TLS files: `tasks/tls.py`) is declared in `after`; a trigger naming anything else
is refused here, when the state is planned.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class File:
    """A file holding `content` (planned here) or the bytes of `src` (a file on the controller), with this mode
    and, when given, (user, group). A `secret` is root-only (0600): its bytes never reach a command, a log or a
    diff (host/operations.py `secret_file`); its owner, when given, is set after it lands."""

    path: str
    name: str
    content: str | None = None
    src: str | None = None
    mode: str = "0644"
    owner: tuple[str, str] | None = None
    secret: bool = False

    def __post_init__(self) -> None:
        if (self.content is None) == (self.src is None):
            raise ValueError(f"{self.path}: a file is either content or a source, not both or neither")
        if self.secret and (self.src is not None or self.mode != "0600"):
            raise ValueError(f"{self.path}: a secret is content, 0600")

    @property
    def key(self) -> str:
        return self.path


def secret(path: str, name: str, content: str, owner: tuple[str, str] | None = None) -> File:
    """A root-only (0600) file whose content is a secret (File.secret)."""
    return File(path, name, content=content, mode="0600", owner=owner, secret=True)


@dataclass(frozen=True)
class Directory:
    path: str
    name: str
    mode: str = "0755"
    owner: tuple[str, str] | None = None

    @property
    def key(self) -> str:
        return self.path


@dataclass(frozen=True)
class Absent:
    """No file at `path` (one a role no longer keeps)."""

    path: str
    name: str

    @property
    def key(self) -> str:
        return self.path


@dataclass(frozen=True)
class Packages:
    """Debian packages installed; the `masked` units (a package's own service, which Debian would start at the
    install) are masked before apt runs, so they never start."""

    name: str
    packages: tuple[str, ...]
    masked: tuple[str, ...] = ()
    extra_install_args: str = ""

    @property
    def key(self) -> str:
        return "packages " + " ".join(self.packages)


@dataclass(frozen=True)
class Unit:
    """A systemd unit running (or stopped) and enabled (or disabled); restarted when a step of `restart_on`
    changed, else reloaded when one of `reload_on` did; systemd's daemon-reload first when one of
    `daemon_reload_on` (its unit file) did."""

    service: str
    name: str
    running: bool | None = True
    enabled: bool | None = True
    restart_on: tuple[str, ...] = ()
    reload_on: tuple[str, ...] = ()
    daemon_reload_on: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return self.service

    @property
    def triggers(self) -> tuple[str, ...]:
        return (*self.restart_on, *self.reload_on, *self.daemon_reload_on)


@dataclass(frozen=True)
class UnitRemoved:
    """A unit a host no longer runs: stopped, disabled, its file at `path` gone (tasks/service.py `unit_removed`)."""

    service: str
    path: str
    why: str

    @property
    def key(self) -> str:
        return self.service


@dataclass(frozen=True)
class Command:
    """A shell command run when a step of `when` changed; with `when` None, always (the planner includes it only
    where it has something to do: a database kept before a version change, a stale hold put back)."""

    name: str
    command: str
    when: tuple[str, ...] | None = None

    @property
    def key(self) -> str:
        return self.name

    @property
    def triggers(self) -> tuple[str, ...]:
        return self.when or ()


@dataclass(frozen=True)
class HttpWait:
    """Wait until `url` answers (2xx or 3xx) on the host, asked once a second, `timeout_s` times, each ask given
    `max_time_s`; else the stage fails with `failure` (host/operations.py `http_wait`). Only when a step of `when`
    changed: a service that did not restart needs no wait."""

    name: str
    url: str
    timeout_s: int
    max_time_s: int
    failure: str
    when: tuple[str, ...]
    insecure: bool = False  # https to the host's own service: its certificate is not checked (curl -k)
    unix_socket: str | None = None  # asked on this unix socket (curl --unix-socket): the URL's host is only a name

    @property
    def key(self) -> str:
        return self.name

    @property
    def triggers(self) -> tuple[str, ...]:
        return self.when


Step = File | Directory | Absent | Packages | Unit | UnitRemoved | Command | HttpWait


@dataclass(frozen=True)
class DesiredState:
    """A role's steps on one host, in the order they are ensured; `after`: the keys another stage ensured first
    that a trigger here may name."""

    steps: tuple[Step, ...] = ()
    after: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        known = set(self.after)
        for step in self.steps:
            unknown = [k for k in getattr(step, "triggers", ()) if k not in known]
            if unknown:
                raise ValueError(f"{step.key}: {unknown[0]} is the key of no step before it")
            if step.key in known:
                raise ValueError(f"{step.key}: two steps of one state have this key")
            known.add(step.key)

    def __add__(self, other: DesiredState) -> DesiredState:
        return DesiredState(self.steps + other.steps, tuple(dict.fromkeys(self.after + other.after)))

    def _of(self, kind: type) -> list:
        return [s for s in self.steps if isinstance(s, kind)]

    @property
    def files(self) -> dict[str, File]:
        return {f.path: f for f in self._of(File)}

    @property
    def directories(self) -> dict[str, Directory]:
        return {d.path: d for d in self._of(Directory)}

    @property
    def absent(self) -> tuple[str, ...]:
        return tuple(a.path for a in self._of(Absent))

    @property
    def packages(self) -> dict[str, Packages]:
        """Each package by name, with the step that installs it."""
        return {p: step for step in self._of(Packages) for p in step.packages}

    @property
    def units(self) -> dict[str, Unit]:
        return {u.service: u for u in self._of(Unit)}

    @property
    def removed_units(self) -> tuple[str, ...]:
        return tuple(u.service for u in self._of(UnitRemoved))

    @property
    def commands(self) -> dict[str, Command]:
        return {c.name: c for c in self._of(Command)}

    @property
    def waits(self) -> dict[str, HttpWait]:
        return {w.name: w for w in self._of(HttpWait)}


def desired(*parts: Step | DesiredState | Iterable[Step] | None, after: Iterable[str] = ()) -> DesiredState:
    """A DesiredState of steps, states and lists of steps in this order (None: nothing, for a step a planner
    leaves out)."""
    steps: list[Step] = []
    afters = list(after)
    for part in parts:
        if part is None:
            continue
        if isinstance(part, DesiredState):
            steps += part.steps
            afters += part.after
        elif isinstance(part, (list, tuple)):
            steps += part
        else:
            steps.append(part)  # type: ignore[arg-type]
    return DesiredState(tuple(steps), tuple(dict.fromkeys(afters)))
