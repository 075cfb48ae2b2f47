"""Controller-made secrets: the fleet token (what a host's model share asks its peers for) and each
tensor-parallel group's Ray token (what Ray asks of every node and driver that joins the group's cluster).

Each is made once on the controller, kept in a 0600 file under the controller's
cache directory (written to a 0600 file made with O_EXCL, then linked into
place: never readable by others, and two deploys starting at once agree on one
token) and shipped to every host that needs it in a root-only file; it never
appears in a plan, a log or a command line. Deleting the controller's file
rotates the token on the next converge.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

from sparkfleet.model.hubs import cache_dir

TOKEN_NAME = "fleet.token"


class FleetTokenError(RuntimeError):
    pass


def token_path(name: str = TOKEN_NAME) -> Path:
    return cache_dir() / name


def controller_token(name: str, what: str) -> str:
    """The token kept in the controller's file `name`: read from it, or generated there the first time.
    `what` names it in an error ("the fleet token")."""
    path = token_path(name)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fresh = path.with_name(f".{name}.{os.getpid()}.{secrets.token_hex(4)}")
        with os.fdopen(os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
        try:
            os.link(fresh, path)  # atomic, and refuses to replace a token another run made first
        except FileExistsError:
            pass
        finally:
            fresh.unlink()
    return _read(path, what)


def fleet_token() -> str:
    """The fleet's token (the peer shares')."""
    return controller_token(TOKEN_NAME, "the fleet token")


def ray_token_name(group: str) -> str:
    """The controller's file name of a group's Ray token (`ray-spark-1+spark-2.token`): one per group, so a
    host of another group (or none) holds nothing that joins this one."""
    return f"ray-{re.sub(r'[^A-Za-z0-9.+-]', '_', group)}.token"


def ray_token(group: str) -> str:
    """The Ray token of the tensor-parallel group named `group` (TensorParallelGroup.name)."""
    return controller_token(ray_token_name(group), f"the Ray token of {group}")


def _read(path: Path, what: str) -> str:
    st = os.stat(path)
    if st.st_mode & 0o077:
        raise FleetTokenError(f"{path}: {what}'s file is readable by others (mode {st.st_mode & 0o777:o}): "
                              f"run `chmod 600 {path}`")
    token = path.read_text().strip()
    if not token:
        raise FleetTokenError(f"{path}: {what}'s file is empty: delete it and re-run to make a new one")
    return token
