"""The fleet token: the secret a host's model share asks its peers for, made once on the controller.

Kept in a 0600 file under the controller's cache directory (written to a
0600 file made with O_EXCL, then linked into place: never readable by others,
and two deploys starting at once agree on one token) and shipped
to every host in a root-only file; it never appears in a plan, a log or a
command line.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from sparkfleet.model.hubs import cache_dir

TOKEN_NAME = "fleet.token"


class FleetTokenError(RuntimeError):
    pass


def token_path() -> Path:
    return cache_dir() / TOKEN_NAME


def fleet_token() -> str:
    """The fleet's token: read from its file, or generated there the first time."""
    path = token_path()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fresh = path.with_name(f".{TOKEN_NAME}.{os.getpid()}.{secrets.token_hex(4)}")
        with os.fdopen(os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
        try:
            os.link(fresh, path)  # atomic, and refuses to replace a token another run made first
        except FileExistsError:
            pass
        finally:
            fresh.unlink()
    return _read(path)


def _read(path: Path) -> str:
    st = os.stat(path)
    if st.st_mode & 0o077:
        raise FleetTokenError(f"{path}: the fleet token file is readable by others (mode {st.st_mode & 0o777:o}): "
                              f"run `chmod 600 {path}`")
    token = path.read_text().strip()
    if not token:
        raise FleetTokenError(f"{path}: the fleet token file is empty: delete it and re-run to make a new one")
    return token
