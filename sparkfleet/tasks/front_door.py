"""Stage 7 (hosts of the group `front_door`): HAProxy in front of the engines that serve the same model.

Its config comes from the plans of the whole inventory; the keys live only in
0600 map files. A change of users or backends is a reload (in-flight requests
finish, drained backends stay drained); the front door must answer before the
host counts as converged. A backend held out by an operation that is gone (a killed rollout) is put back.
"""

import time

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import server

from sparkfleet import FILES_DIR
from sparkfleet.contract import monitoring, paths, serving
from sparkfleet.roles.front_door.address import door_set, interface_for, keepalived_conf, keepalived_unit
from sparkfleet.roles.front_door.holds import controller_name, stale_holds
from sparkfleet.roles.front_door.plan import front_door_plan, usage_save_units
from sparkfleet.roles.front_door.records import put_back_command
from sparkfleet.controller.inventory import DeployRefused, chat_ui_of
from sparkfleet.host.facts import Ipv4Networks, JsonFile
from sparkfleet.host.state import fact
from sparkfleet.host.managed import managed_absent, managed_directory, managed_file, managed_packages, managed_unit
from sparkfleet.host.operations import secret_file
from sparkfleet.release.plan import HostPlan
from sparkfleet.tasks.service import unit_removed
from sparkfleet.tasks.tls import host_tls
from sparkfleet.contract.settings import SettingsError


@deploy("Front door")
def front_door(plan: HostPlan, plans: dict[str, HostPlan]):
    try:
        names = [h.name for h in host.state.inventory.get_group(monitoring.FRONT_DOOR_GROUP, [])]
        doors = door_set(names, plans)
        ui, _ = chat_ui_of(host.state)
        door = front_door_plan(plan.name, plans, monitoring.GROUP in host.groups, doors, ui)
        address = doors.address if doors else None
        # the interface whose network holds the floating address, asked of the host before any change
        interface = interface_for(plan.name, str(address), fact(host, Ipv4Networks)) if address else None
    except SettingsError as exc:
        raise DeployRefused(f"invalid front door settings; no host was changed:\n{exc}") from None
    s = door.settings
    # HAProxy itself: the guard stage
    managed_packages(name="socat installed (the front door's runtime API)", packages=["socat"])
    managed_directory(name="Front door config directory (root-only)", path=paths.FRONT_DOOR_DIR, mode="0700")
    changes = [
        managed_file(name="Front door config", content=door.config(), dest=paths.FRONT_DOOR_CONFIG, mode="0644"),
        secret_file(name="Front door users (root-only)", dest=paths.FRONT_DOOR_USERS_MAP, content=door.users_map()),
        secret_file(name="Front door key for the engines (root-only)", dest=paths.FRONT_DOOR_BACKEND_MAP,
                    content=door.backend_map()),
        managed_file(name="Front door users' limits (root-only)", content=door.limits_map(),
                     dest=paths.FRONT_DOOR_LIMITS_MAP, mode="0600"),
        managed_file(name="Front door usage counters (Lua)", src=str(FILES_DIR / "sparkfleet-usage.lua"),
                     dest=paths.FRONT_DOOR_USAGE_LUA, mode="0600"),
    ]
    # the usage counters' snapshot (a restarted door counts on from it): its writer, run by the unit and a timer
    saver = managed_file(name="Helper sparkfleet-usage-save", src=str(FILES_DIR / "sparkfleet-usage-save"),
                         dest=paths.USAGE_SAVE, mode="0755")
    # the server-state file's writer (the unit's reload and `sparkfleet drain` run it)
    managed_file(name="Helper sparkfleet-servers-save", src=str(FILES_DIR / "sparkfleet-servers-save"),
                 dest=paths.SERVERS_SAVE, mode="0755")
    if door.chat_ui:  # who a token the chat UI signed may name, its signing secret, the sign-in page
        changes += [
            secret_file(name="Front door chat UI's accounts (root-only)", dest=paths.FRONT_DOOR_CHAT_UI_USERS,
                        content=door.chat_ui_users_map()),
            secret_file(name="Front door secrets (root-only)", dest=paths.FRONT_DOOR_SECRETS,
                        content=door.secrets_config()),
            managed_file(name="Front door sign-in page", src=str(FILES_DIR / "chat-ui-login.html"),
                         dest=paths.FRONT_DOOR_LOGIN_PAGE, mode="0644"),
        ]
    else:
        for path in CHAT_UI_FILES:
            managed_absent(name=f"{path} removed (no chat UI)", path=path)
    if door.status_page:  # the status page's viewers (digests of their passwords)
        changes.append(secret_file(name="Front door status page viewers (root-only)",
                                   dest=monitoring.FRONT_DOOR_VIEWERS_MAP, content=door.viewers_map()))
    changes += host_tls(plan).ops  # its client certificate to the guards (the guard stage put it; a change: reload)
    if door.tls:
        changes.append(secret_file(name="Front door TLS certificate and key (root-only)", dest=paths.FRONT_DOOR_TLS_PEM,
                                   content=door.tls_pem()))
    unit = managed_file(name="Front door unit", content=door.unit(), dest=paths.FRONT_DOOR_UNIT_PATH, mode="0644")
    started = managed_unit(name="Front door enabled and running", service=paths.FRONT_DOOR_UNIT_NAME, running=True,
                           enabled=True,
                           restarted=unit.will_change,
                           reloaded=not unit.will_change and any(op.will_change for op in changes),
                           daemon_reload=unit.will_change)
    save_service, save_timer = usage_save_units()
    saving = managed_file(name="Usage snapshot unit", content=save_service, dest=paths.unit_path(paths.USAGE_SAVE_UNIT),
                          mode="0644")
    timer = managed_file(name="Usage snapshot timer", content=save_timer, dest=paths.unit_path(paths.USAGE_SAVE_TIMER),
                         mode="0644")
    managed_unit(name=f"Usage snapshot every {paths.USAGE_SNAPSHOT_S} s", service=paths.USAGE_SAVE_TIMER, running=True,
                 enabled=True, restarted=timer.will_change or saving.will_change or saver.will_change,
                 daemon_reload=timer.will_change or saving.will_change)
    if address:
        _door_address(doors, plan.name, interface, s.front_door_port, door.tls)
    else:  # an address the inventory no longer names is held by no door (nothing where a door never had one)
        managed_unit(name="No floating address: keepalived off", service=paths.DOOR_ADDRESS_UNIT_NAME,
                     running=False, enabled=False)
    scheme, health = "https" if door.tls else "http", serving.HEALTH  # its /health: 200 once a backend is in
    wait = (f"for i in $(seq {s.health_timeout_s}); do curl -fsSk --max-time {health['timeout_s']} -o /dev/null "
            f"{scheme}://127.0.0.1:{s.front_door_port}{health['path']} && exit 0; sleep 1; done; "
            f"echo 'the front door has no backend in after {s.health_timeout_s}s' >&2; exit 1")
    if started.will_change or unit.will_change:
        server.shell(name=f"Front door answers on port {s.front_door_port}", commands=[wait])
    gone = stale_holds(fact(host, JsonFile, path=paths.FRONT_DOOR_HOLDS), controller_name(), time.time())
    if gone:  # an interrupted rollout's: each host's release was brought in line by its stages above
        server.shell(name=f"{', '.join(h.backend for h in gone)} back in (held by an operation that is gone)",
                     commands=[put_back_command(gone)])


def _door_address(doors, name: str, interface: str, front_door_port: int, tls: bool) -> None:
    """keepalived (Debian's package; its own keepalived.service masked before the install, so it never starts)
    under sparkfleet's unit, holding the floating address with the other doors."""
    managed_packages(name="keepalived installed (Debian's unit masked first: it never starts)",
                     packages=[paths.KEEPALIVED_PACKAGE], masked=[paths.KEEPALIVED_UNIT])
    managed_unit(name="Debian's keepalived.service off (sparkfleet's unit holds the address)",
                 service=paths.KEEPALIVED_UNIT, running=False, enabled=False)
    conf = managed_file(name=f"Floating address {doors.address} on {interface} (keepalived)",
                        content=keepalived_conf(doors, name, interface, front_door_port, tls),
                        dest=paths.DOOR_ADDRESS_CONFIG, mode="0600")
    unit = managed_file(name="Floating address unit", content=keepalived_unit(), dest=paths.DOOR_ADDRESS_UNIT_PATH,
                        mode="0644")
    managed_unit(name="Floating address: keepalived running", service=paths.DOOR_ADDRESS_UNIT_NAME, running=True,
                 enabled=True, restarted=unit.will_change, reloaded=conf.will_change and not unit.will_change,
                 daemon_reload=unit.will_change)


# what a door leaves on its host, which a host outside the group front_door does not keep (its state directory,
# which holds no secret, aside)
DOOR_UNITS = (paths.DOOR_ADDRESS_UNIT_NAME, paths.USAGE_SAVE_TIMER, paths.USAGE_SAVE_UNIT, paths.FRONT_DOOR_UNIT_NAME)
CHAT_UI_FILES = (paths.FRONT_DOOR_CHAT_UI_USERS, paths.FRONT_DOOR_SECRETS, paths.FRONT_DOOR_LOGIN_PAGE)
DOOR_FILES = (*CHAT_UI_FILES, paths.FRONT_DOOR_USERS_MAP, paths.FRONT_DOOR_BACKEND_MAP, paths.FRONT_DOOR_LIMITS_MAP,
              paths.FRONT_DOOR_TLS_PEM, monitoring.FRONT_DOOR_VIEWERS_MAP, paths.FRONT_DOOR_CONFIG,
              paths.FRONT_DOOR_USAGE_LUA, paths.DOOR_ADDRESS_CONFIG)


@deploy("No front door")
def no_front_door():
    """A host outside the group front_door runs no door: one it ran before (the inventory moved the door
    elsewhere) is stopped and its units removed, and so are its files with the users' keys and the engines' key.
    On a host that never ran one, nothing runs (what it would check is in the host's one read)."""
    why = "this host is not in the group front_door"
    for unit in DOOR_UNITS:
        unit_removed(unit, paths.unit_path(unit), why)
    for path in DOOR_FILES:
        managed_absent(name=f"{path} removed ({why})", path=path)
