"""Stage 4b (right after the service stage, so an engine leaving the API port frees it first): the guard, one
HAProxy on the host's API ports in front of its engines on loopback (sparkfleet/roles/guard.py `guard_state`).

Debian's HAProxy is installed here on every host (the front door stage uses it too) with Debian's own unit
off. It also answers the node exporter's metrics on the API port, behind the backend key (503 until the
node_metrics stage runs one), with or without a monitoring host: adding one changes no guard. A change of rules,
key or TLS files is a reload (connections in flight finish); a changed unit is a restart. A host that runs no
engine (a tensor-parallel worker, a service host) has its guard off.
"""

from pyinfra import host
from pyinfra.api import deploy

from sparkfleet.contract import paths
from sparkfleet.contract.settings import SettingsError
from sparkfleet.controller.inventory import DeployRefused
from sparkfleet.release.plan import HostPlan
from sparkfleet.roles.guard import guard_state
from sparkfleet.tasks.ensure import ensure
from sparkfleet.tasks.tls import host_tls


@deploy("Guard")
def guard(plan: HostPlan):
    try:
        wanted = guard_state(plan, runs_chat_ui=paths.CHAT_UI_GROUP in host.groups)
    except SettingsError as exc:
        raise DeployRefused(f"invalid guard settings; no host was changed:\n{exc}") from None  # refusal: planned
    # the fleet CA's, this host's key and certificate first (a service host's too: it is a client)
    ensure(wanted, host_tls(plan).changed)
