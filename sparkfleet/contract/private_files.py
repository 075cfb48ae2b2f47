"""A file only its owner may read on the controller (the secrets file, the fleet CA's key): the two rules, one owner
each, which every such file's reader applies and words in its own refusal.

- `open_to_others`: any group or other permission bit set (the fix: chmod 600);
- `exposed`: inside the project or a git work tree, where it would be committed or copied along.

Plain functions of the file system; the callers raise their own refusal (fleet/users.py `SecretsError`,
fleet/project.py `ProjectError`, roles/pki.py `PkiError`), never with the file's content.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import sparkfleet


def open_to_others(path: Path, what: str) -> str | None:
    """Why `what` at `path` is refused for its mode (one line naming the fix), or None when only its owner has a
    permission bit. A missing or unreadable file raises OSError (the caller's own line says so)."""
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        return f"{what} {path} is open to other users (mode {stat.S_IMODE(mode):04o}): chmod 600 {path}"
    return None


def git_work_tree(path: Path) -> Path | None:
    """The git work tree holding `path` (the nearest ancestor with a .git), or None."""
    for parent in (path, *path.parents):
        if (parent / ".git").exists():
            return parent
    return None


def exposed(path: Path, project: Path | None) -> tuple[str, Path] | None:
    """Where `path` would be committed or copied along: ("project", the project) when inside `project`, ("git work
    tree", its top) when inside one; None when neither. Both resolved (a symlink counts where it points)."""
    path = path.expanduser().resolve()
    if project is not None and path.is_relative_to(project.resolve()):
        return "project", project.resolve()
    tree = git_work_tree(path.parent)
    return ("git work tree", tree) if tree else None


def working_project() -> Path | None:
    """The project a command works in (sparkfleet.PROJECT_ROOT: this checkout, or the current directory when
    installed), or None where that is the home directory or above it: run from there, no directory is a project,
    and the keys' default place (~/.config/sparkfleet) is under it."""
    root = Path(sparkfleet.PROJECT_ROOT).resolve()
    home = Path.home().resolve()
    return None if home == root or home.is_relative_to(root) else root


def write_private(path: Path, data: bytes, mode: int = 0o600) -> None:
    """`data` at `path` whole (a temporary file beside it, fsynced, then a rename), with `mode` from its first byte;
    its directory made 0700 when missing: the secrets file, the backup password, a restored key."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(partial, mode)
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
