"""Read a pyinfra inventory the way `pyinfra` does (group_data included), and plan it once per run."""

from __future__ import annotations

import os
from pathlib import Path

from pyinfra.api import State
from pyinfra.api.exceptions import PyinfraError
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import make_inventory

from sparkfleet import PROJECT_ROOT
from sparkfleet.model.hubs import hub_resolver
from sparkfleet.release.plan import HostPlan, plan_hosts
from sparkfleet.release.settings import SettingsError


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


class DeployRefused(PyinfraError):
    """Raised inside deploy.py: pyinfra prints the message, not a traceback, and touches no host."""


def plan_for(state, host) -> HostPlan:
    """This host's plan, from one validation of the whole inventory per pyinfra run (kept on its state)."""
    try:
        plans = getattr(state, "sparkfleet_plans", None)
        if plans is None:
            plans = {p.name: p for p in plan_hosts([(h.name, h.data.dict()) for h in state.inventory],
                                                    resolve=hub_resolver)}
            state.sparkfleet_plans = plans
        plan = plans[host.name]
        if plan.manifest is None:
            raise SettingsError([f"{host.name}: {plan.hub_error}"])
    except SettingsError as exc:
        raise DeployRefused(f"invalid settings; no host was changed:\n{exc}") from None
    return plan
