"""Read a pyinfra inventory the way `pyinfra` does (group_data included), without connecting."""

from __future__ import annotations

import os
from pathlib import Path

from pyinfra.api import State
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import make_inventory

from . import PROJECT_ROOT


def load_hosts(inventory_path: str, limit: str | None = None) -> list[tuple[str, dict]]:
    """[(host name, merged data)] in inventory order; `limit` is a host or group name."""
    if not Path(inventory_path).exists():
        raise FileNotFoundError(f"no inventory file at {inventory_path}")
    with ctx_state.use(State()):
        inventory = make_inventory(os.path.abspath(inventory_path), cwd=str(PROJECT_ROOT))
    hosts = [(h.name, h.data.dict()) for h in inventory]
    if limit:
        hosts = [(n, d) for n, d in hosts if n == limit or limit in inventory.get_host(n).groups]
        if not hosts:
            raise KeyError(f"no host or group named {limit!r} in {inventory_path}")
    return hosts
