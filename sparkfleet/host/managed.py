"""The files, directories and units sparkfleet manages, decided from one batched read (sparkfleet/host/state.py):
each operation yields commands only on drift (content: one upload, then its mode; mode or owner alone: chmod or
chown only), and changes nothing when the host already holds what it would put."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

from pyinfra import host
from pyinfra.api import OperationError, QuoteString, StringCommand, operation
from pyinfra.api.command import FileUploadCommand
from pyinfra.api.util import get_template
from pyinfra.facts.apt import noninteractive_apt
from pyinfra.operations.util.files import chmod, chown

from sparkfleet.host.state import file_state, installed_packages, system_user, unit_state
from sparkfleet.host.drift import only_on_drift


def _mode(mode: str | int) -> int:
    return int(mode, 8) if isinstance(mode, str) else mode


def _owner_drift(have: dict, user: str | None, group: str | None) -> bool:
    return bool((user and have["user"] != user) or (group and have["group"] != group))


def _file_commands(dest: str, data: bytes, mode: str | int, user: str | None, group: str | None, src: str | None):
    """The commands that make dest hold `data` with this mode (and owner): none when it does already."""
    want = hashlib.sha256(data).hexdigest()
    have = file_state(host, dest)
    if have and have["type"] == "dir":
        raise OperationError(f"{host.name}: {dest} is a directory, where sparkfleet puts a file: move it away")
    if have and have["sha256"] == want:
        yield from ([chmod(dest, f"{_mode(mode):o}")] if have["mode"] != _mode(mode) else []) + (
            [chown(dest, user, group)] if _owner_drift(have, user, group) else [])
        return
    if have is None:
        yield StringCommand("mkdir -p", QuoteString(str(Path(dest).parent)))
    elif have["type"] == "link":
        yield StringCommand("rm -f", QuoteString(dest))  # never written through a link
    yield FileUploadCommand(src if src is not None else io.BytesIO(data), dest,
                            remote_temp_filename=host.get_temp_filename(dest))
    if user or group:
        yield chown(dest, user, group)
    yield chmod(dest, f"{_mode(mode):o}")


@only_on_drift
@operation()
def managed_file(dest: str, src: str | None = None, content: str | None = None, mode: str | int = "0644",
                 user: str | None = None, group: str | None = None):
    """dest holds `content` (or the bytes of the local file `src`) with this mode (and owner, when given)."""
    data = Path(src).read_bytes() if src is not None else (content or "").encode()
    commands = list(_file_commands(dest, data, mode, user, group, src))
    if not commands:
        host.noop(f"{dest} is current")
        return
    yield from commands


@only_on_drift
@operation()
def managed_files(files: list[tuple[str, str, str]]):
    """Each (local file, dest, mode) in place, as managed_file: one operation for files that change together
    (pyinfra's bookkeeping of an operation costs the controller a few milliseconds a host, changed or not)."""
    commands = [c for src, dest, mode in files for c in _file_commands(dest, Path(src).read_bytes(), mode, None,
                                                                         None, src)]
    if not commands:
        host.noop(f"{', '.join(dest for _, dest, _ in files)}: current")
        return
    yield from commands


@only_on_drift
@operation()
def managed_template(src: str, dest: str, mode: str | int = "0644", **data):
    """managed_file with a jinja2 template rendered here (the controller) from `data`."""
    yield from managed_file._inner(dest=dest, content=get_template(src).render(data), mode=mode)


@only_on_drift
@operation()
def managed_directory(path: str, mode: str | int = "0755", user: str | None = None, group: str | None = None):
    """A directory at path with this mode (and owner, when given)."""
    have = file_state(host, path)
    if have and have["type"] != "dir":
        raise OperationError(f"{host.name}: {path} is not a directory: move it away")
    if have and have["mode"] == _mode(mode) and not _owner_drift(have, user, group):
        host.noop(f"directory {path} is current")
        return
    if have is None:
        yield StringCommand("mkdir -p", QuoteString(path))
    if user or group:
        yield chown(path, user, group)
    if have is None or have["mode"] != _mode(mode):
        yield chmod(path, f"{_mode(mode):o}")


@only_on_drift
@operation()
def managed_permissions(path: str, mode: str | int, user: str | None = None, group: str | None = None):
    """A file's mode and owner; its content is another operation's (a secret_file, say), which puts it first."""
    have = file_state(host, path) or {"type": "file", "mode": None, "user": None, "group": None}
    if have["type"] != "file":
        raise OperationError(f"{host.name}: {path} is not a file: move it away")
    commands = ([chown(path, user, group)] if _owner_drift(have, user, group) else []) + (
        [chmod(path, f"{_mode(mode):o}")] if have["mode"] != _mode(mode) else [])
    if not commands:
        host.noop(f"{path} is {_mode(mode):o}, owned as wanted")
        return
    yield from commands


@only_on_drift
@operation()
def managed_absent(path: str):
    """No file at path (a directory there is not touched: refused)."""
    have = file_state(host, path)
    if have is None:
        host.noop(f"{path} is absent")
        return
    if have["type"] == "dir":
        raise OperationError(f"{host.name}: {path} is a directory, where sparkfleet removes a file: remove it by hand")
    yield StringCommand("rm -f", QuoteString(path))


@only_on_drift
@operation()
def managed_unit(service: str, running: bool | None = None, enabled: bool | None = None, restarted: bool = False,
                 reloaded: bool = False, daemon_reload: bool = False):
    """A systemd unit running (or stopped) and enabled (or disabled), as pyinfra's systemd.service: a restart or a
    reload only of a running unit; `daemon_reload` first when its file changed. A restart resets the unit's start
    limit first (`reset-failed`): a planned restart never spends the budget meant to end a crash loop, so two
    quick rollouts do not leave it in start-limit-hit."""
    have = unit_state(host, service)
    verbs = ["daemon-reload"] if daemon_reload else []
    if running is True and not have["running"]:
        verbs.append("start")
    elif running is False and have["running"]:
        verbs.append("stop")
    if have["running"] and running is not False:
        verbs += (["reset-failed", "restart"] if restarted else []) + (["reload"] if reloaded else [])
    if enabled is True and not have["enabled"]:
        verbs.append("enable")
    elif enabled is False and have["enabled"]:
        verbs.append("disable")
    if not verbs:
        host.noop(f"{service} is {'running' if have['running'] else 'stopped'}"
                  f" and {'enabled' if have['enabled'] else 'disabled'}")
        return
    for verb in verbs:
        yield StringCommand("systemctl", verb) if verb == "daemon-reload" else StringCommand(
            "systemctl", verb, QuoteString(service))


@only_on_drift
@operation()
def managed_packages(packages: list[str], update: bool = True, extra_install_args: str = "",
                     masked: list[str] | tuple[str, ...] = ()):
    """These Debian packages installed: `name` at any version, `name=version` at that one. The apt lists are
    refreshed first (unless `update` is off: the toolkit stage refreshes its own source) only when one is
    missing or at another version. The `masked` units (a package's own service, which Debian starts at install)
    are masked before apt runs, so they never start; installed packages: nothing at all."""
    have = installed_packages(host)

    def current(package: str) -> bool:
        name, pinned, version = package.partition("=")
        return name in have and (not pinned or have[name] == version)

    missing = [p for p in packages if not current(p)]
    if not missing:
        host.noop(f"installed: {', '.join(f'{p} {have[p]}' for p in (p.partition('=')[0] for p in packages))}")
        return
    if masked:
        yield StringCommand("systemctl mask --", *(QuoteString(u) for u in masked))
    if update:
        yield noninteractive_apt("update")
    install = f"install {extra_install_args}".strip()
    yield StringCommand(noninteractive_apt(install), *(QuoteString(p) for p in missing))


@only_on_drift
@operation()
def managed_user(user: str, home: str, shell: str):
    """A system user (and its group) with this home, never made, and this shell: a service's own account."""
    have = system_user(host, user)
    if have and have["home"] == home and have["shell"] == shell:
        host.noop(f"user {user} exists ({home}, {shell})")
        return
    if have is None:
        yield StringCommand("useradd --system --user-group --no-create-home --home-dir", QuoteString(home),
                            "--shell", QuoteString(shell), QuoteString(user))
        return
    yield StringCommand("usermod --home", QuoteString(home), "--shell", QuoteString(shell), QuoteString(user))
