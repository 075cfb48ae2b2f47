"""Stage 4b (right after the service stage, so an engine leaving the API port frees it first): the guard, one
HAProxy on the host's API ports in front of its engines on loopback (sparkfleet/roles/guard.py).

Debian's HAProxy is installed here on every host (the front door stage uses it too) with Debian's own unit
off. It also answers the node exporter's metrics on the API port, behind the backend key (503 until the
node_metrics stage runs one), with or without a monitoring host: adding one changes no guard. A change of rules or key is a reload (connections in flight finish); a
changed unit is a restart. A host that runs no engine (a tensor-parallel worker) has its guard off.
"""

from pyinfra import host
from pyinfra.api import deploy

from sparkfleet.contract import paths
from sparkfleet.roles.guard import guard_plan
from sparkfleet.controller.inventory import DeployRefused
from sparkfleet.host.managed import managed_directory, managed_file, managed_packages, managed_unit
from sparkfleet.host.operations import secret_file
from sparkfleet.release.plan import HostPlan
from sparkfleet.tasks.tls import host_tls
from sparkfleet.contract.settings import SettingsError


@deploy("Guard")
def guard(plan: HostPlan):
    try:
        wanted = guard_plan(plan, runs_chat_ui=paths.CHAT_UI_GROUP in host.groups)
    except SettingsError as exc:
        raise DeployRefused(f"invalid guard settings; no host was changed:\n{exc}") from None
    managed_packages(name="HAProxy installed", packages=["haproxy"])
    managed_unit(name="Debian's own haproxy.service off (sparkfleet runs its own units)",
                 service="haproxy.service", running=False, enabled=False)
    tls = host_tls(plan)  # the fleet CA's, this host's key and certificate (a service host's too: it is a client)
    if wanted is None:
        managed_unit(name="Guard off (this host runs no engine)", service=paths.GUARD_UNIT_NAME, running=False,
                     enabled=False)
        return
    managed_directory(name="Guard config directory (root-only)", path=paths.GUARD_DIR, mode="0700")
    changes = [
        managed_file(name="Guard config", content=wanted.config(), dest=paths.GUARD_CONFIG, mode="0644"),
        secret_file(name="Guard's backend key (root-only)", dest=paths.GUARD_KEY_MAP, content=wanted.key_map()),
        *tls.ops,
    ]
    unit = managed_file(name="Guard unit", content=wanted.unit(), dest=paths.GUARD_UNIT_PATH, mode="0644")
    managed_unit(name="Guard enabled and running", service=paths.GUARD_UNIT_NAME, running=True, enabled=True,
                 restarted=unit.will_change, reloaded=not unit.will_change and any(op.will_change for op in changes),
                 daemon_reload=unit.will_change)
