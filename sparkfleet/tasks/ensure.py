"""One pass over a role's desired state (roles/desired.py): each step put in place by its `host/` operation, in the
state's order; a unit's restart, reload and daemon-reload, a command and a wait decided from what the steps before
them changed (and, for the keys the state declares `after`, what another stage's pass changed).

An operation that would change nothing is not even registered (host/drift.py), so a converged host costs no more
than before. Each step is one position of pyinfra's `host.loop`: hosts whose states hold different steps still
order their operations without a cycle (pyinfra orders operations by call site, and every step is called from the
few lines below).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from pyinfra import host
from pyinfra.operations import server

from sparkfleet.host.managed import (managed_absent, managed_directory, managed_file, managed_packages,
                                     managed_permissions, managed_unit)
from sparkfleet.host.operations import http_wait, secret_file
from sparkfleet.roles.desired import (Absent, Command, DesiredState, Directory, File, HttpWait, Packages, Step, Unit,
                                      UnitRemoved)
from sparkfleet.tasks.service import unit_removed


def ensure(wanted: DesiredState, earlier: Mapping[str, bool] | None = None) -> dict[str, bool]:
    """Put `wanted` in place on the current host; {key: whether its step changes the host}, `earlier`'s included
    (another stage's pass: the keys `wanted.after` names)."""
    changed = dict(earlier or {})

    def any_of(keys: Iterable[str]) -> bool:
        return any(changed.get(key, False) for key in keys)

    for step in host.loop(wanted.steps):
        changed[step.key] = _ensure(step, any_of)
    return changed


def _owner(owner: tuple[str, str] | None) -> dict[str, str]:
    return {"user": owner[0], "group": owner[1]} if owner else {}


def _ensure(step: Step, any_of: Callable[[Iterable[str]], bool]) -> bool:
    """Ensure one step; whether it changes the host."""
    if isinstance(step, File):
        owner = _owner(step.owner)
        if not step.secret:
            source = {"src": step.src} if step.src is not None else {"content": step.content}
            return managed_file(name=step.name, dest=step.path, mode=step.mode, **source, **owner).will_change
        written = secret_file(name=step.name, dest=step.path, content=step.content)
        if owner:  # written as root, then given to its service's user
            managed_permissions(name=f"{step.name}: owned by {':'.join(step.owner)}", path=step.path,
                                mode=step.mode, **owner)
        return written.will_change
    if isinstance(step, Directory):
        owner = _owner(step.owner)
        return managed_directory(name=step.name, path=step.path, mode=step.mode, **owner).will_change
    if isinstance(step, Absent):
        return managed_absent(name=step.name, path=step.path).will_change
    if isinstance(step, Packages):
        extra = {"masked": list(step.masked)} if step.masked else {}
        if step.extra_install_args:
            extra["extra_install_args"] = step.extra_install_args
        return managed_packages(name=step.name, packages=list(step.packages), **extra).will_change
    if isinstance(step, Unit):
        restarted = any_of(step.restart_on)
        return managed_unit(name=step.name, service=step.service, running=step.running, enabled=step.enabled,
                            restarted=restarted, reloaded=not restarted and any_of(step.reload_on),
                            daemon_reload=any_of(step.daemon_reload_on)).will_change
    if isinstance(step, UnitRemoved):
        unit_removed(step.service, step.path, step.why)
        return False  # nothing in a state waits on a unit it removes
    if isinstance(step, Command):
        if step.when is not None and not any_of(step.when):
            return False
        return server.shell(name=step.name, commands=[step.command]).will_change
    if isinstance(step, HttpWait):
        if not any_of(step.when):
            return False
        return http_wait(name=step.name, url=step.url, timeout_s=step.timeout_s, max_time_s=step.max_time_s,
                         failure=step.failure, insecure=step.insecure,
                         **({"unix_socket": step.unix_socket} if step.unix_socket else {})).will_change
    raise TypeError(f"not a step of a desired state: {step!r}")
