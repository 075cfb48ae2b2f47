"""Stage 7 (hosts of the group `front_door`): HAProxy in front of the engines that serve the same model.

Its config comes from the plans of the whole inventory (sparkfleet/roles/front_door/: `front_door_plan`, and what
the host holds, `door_state`); the keys live only in 0600 map files. A change of users or backends is a reload
(in-flight requests finish, drained backends stay drained); the front door must answer before the host counts as
converged. A backend held out by an operation that is gone (a killed rollout) is put back.
"""

import time

from pyinfra import host
from pyinfra.api import deploy

from sparkfleet.contract import monitoring, paths
from sparkfleet.contract.settings import SettingsError
from sparkfleet.controller.inventory import DeployRefused, chat_ui_of
from sparkfleet.host.facts import Ipv4Networks, JsonFile
from sparkfleet.host.state import fact
from sparkfleet.release.plan import HostPlan
from sparkfleet.roles.front_door.address import door_set
from sparkfleet.roles.front_door.desired import door_state, no_door_state
from sparkfleet.roles.front_door.holds import controller_name, stale_holds
from sparkfleet.roles.front_door.plan import front_door_plan
from sparkfleet.tasks.ensure import ensure
from sparkfleet.tasks.tls import host_tls


@deploy("Front door")
def front_door(plan: HostPlan, plans: dict[str, HostPlan]):
    names = [h.name for h in host.state.inventory.get_group(monitoring.FRONT_DOOR_GROUP, [])]
    gone = stale_holds(fact(host, JsonFile, path=paths.FRONT_DOOR_HOLDS), controller_name(), time.time())
    try:
        doors = door_set(names, plans)
        ui, _ = chat_ui_of(host.state)
        door = front_door_plan(plan.name, plans, monitoring.GROUP in host.groups, doors, ui)
        # the networks of the host, where the floating address goes: asked before any change
        networks = fact(host, Ipv4Networks) if doors and doors.address else None
        wanted = door_state(door, networks, gone)
    except SettingsError as exc:
        # refusal: host-only: door_state's interface for the floating address is read from the host (Ipv4Networks);
        # the rest (door_set, the chat UI, front_door_plan, the TLS files) `plan` refuses first (controller/checks.py)
        raise DeployRefused(f"invalid front door settings; no host was changed:\n{exc}") from None
    # its client certificate to the guards (the guard stage put it; a change: a reload)
    ensure(wanted, host_tls(plan).changed)


@deploy("No front door")
def no_front_door():
    """A host outside the group front_door runs no door: one it ran before (the inventory moved the door
    elsewhere) is stopped and its units removed, and so are its files with the users' keys and the engines' key.
    On a host that never ran one, nothing runs (what it would check is in the host's one read)."""
    ensure(no_door_state())
