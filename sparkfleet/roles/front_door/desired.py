"""What a front door host holds, as its stage ensures it (roles/desired.py): the door's config, unit and maps (keys
only in 0600 files), its helpers, the usage snapshot's timer, keepalived with the floating address where the doors
share one, the wait for its /health and the put-back of backends held by an operation that is gone. A change of
users or backends is a reload (in-flight requests finish, drained backends stay drained); a changed unit is a
restart; the door must answer before the host counts as converged.

A host outside the group front_door keeps none of it (`no_door_state`).
"""

from __future__ import annotations

from collections.abc import Sequence

from sparkfleet import FILES_DIR
from sparkfleet.contract import monitoring, paths, serving
from sparkfleet.roles import pki
from sparkfleet.roles.desired import (Absent, Command, DesiredState, Directory, File, HttpWait, Packages, Unit,
                                      UnitRemoved, desired, secret)
from sparkfleet.roles.front_door.address import DoorSet, interface_for, keepalived_conf, keepalived_unit
from sparkfleet.roles.front_door.holds import Hold
from sparkfleet.roles.front_door.plan import FrontDoor, usage_save_units
from sparkfleet.roles.front_door.records import put_back_command

# what a door leaves on its host, which a host outside the group front_door does not keep (its state directory,
# which holds no secret, aside)
DOOR_UNITS = (paths.DOOR_ADDRESS_UNIT_NAME, paths.USAGE_SAVE_TIMER, paths.USAGE_SAVE_UNIT, paths.FRONT_DOOR_UNIT_NAME)
CHAT_UI_FILES = (paths.FRONT_DOOR_CHAT_UI_USERS, paths.FRONT_DOOR_SECRETS, paths.FRONT_DOOR_LOGIN_PAGE)
DOOR_FILES = (*CHAT_UI_FILES, paths.FRONT_DOOR_USERS_MAP, paths.FRONT_DOOR_BACKEND_MAP, paths.FRONT_DOOR_LIMITS_MAP,
              paths.FRONT_DOOR_TLS_PEM, monitoring.FRONT_DOOR_VIEWERS_MAP, paths.FRONT_DOOR_CONFIG,
              paths.FRONT_DOOR_USAGE_LUA, paths.DOOR_ADDRESS_CONFIG)


def door_state(door: FrontDoor, networks: str | None = None, gone: Sequence[Hold] = ()) -> DesiredState:
    """Door `door.host`'s files, units and checks. `networks`: the host's `ip -j -4 addr` (host/facts.py
    Ipv4Networks, read before any change), where the floating address goes; `gone`: the holds of its record
    whose operation is gone (holds.py `stale_holds`), put back once each host's release is in line (the stages
    before this one). SettingsError where the address fits no network of the host or the TLS files cannot be
    read on the controller."""
    s = door.settings
    tls = pki.TLS_FILES if door.backend_tls else ()  # its client certificate to the guards: a change is a reload
    save_service, save_timer = usage_save_units()
    saving, timer = paths.unit_path(paths.USAGE_SAVE_UNIT), paths.unit_path(paths.USAGE_SAVE_TIMER)
    files = desired(
        File(paths.FRONT_DOOR_CONFIG, "Front door config", content=door.config()),
        secret(paths.FRONT_DOOR_USERS_MAP, "Front door users (root-only)", door.users_map()),
        secret(paths.FRONT_DOOR_BACKEND_MAP, "Front door key for the engines (root-only)", door.backend_map()),
        File(paths.FRONT_DOOR_LIMITS_MAP, "Front door users' limits (root-only)", content=door.limits_map(),
             mode="0600"),
        File(paths.FRONT_DOOR_USAGE_LUA, "Front door usage counters (Lua)", src=str(FILES_DIR / "sparkfleet-usage.lua"),
             mode="0600"))
    # who a token the chat UI signed may name, its signing secret, the sign-in page
    chat_ui = desired(
        secret(paths.FRONT_DOOR_CHAT_UI_USERS, "Front door chat UI's accounts (root-only)", door.chat_ui_users_map()),
        secret(paths.FRONT_DOOR_SECRETS, "Front door secrets (root-only)", door.secrets_config()),
        File(paths.FRONT_DOOR_LOGIN_PAGE, "Front door sign-in page", src=str(FILES_DIR / "chat-ui-login.html")),
    ) if door.chat_ui else None
    maps = desired(
        chat_ui,
        secret(monitoring.FRONT_DOOR_VIEWERS_MAP, "Front door status page viewers (root-only)", door.viewers_map())
        if door.status_page else None,  # the status page's viewers (digests of their passwords)
        secret(paths.FRONT_DOOR_TLS_PEM, "Front door TLS certificate and key (root-only)", door.tls_pem())
        if door.tls else None)
    # the peers link (two or more doors, over TLS): this door's peers certificate, and the doors' it trusts
    peers = (pki.peers_state(pki.ca_of(s), door.host, [(d.name, d.lan_address) for d in door.doors.doors])
             if door.doors and door.peers and door.peers["default_server"] else desired())
    reload_on = (*files.files, *maps.files, *tls, *peers.files)
    return desired(
        # HAProxy itself: the guard stage
        Packages("socat installed (the front door's runtime API)", ("socat",)),
        Directory(paths.FRONT_DOOR_DIR, "Front door config directory (root-only)", mode="0700"),
        files,
        # the usage counters' snapshot (a restarted door counts on from it): its writer, run by the unit and a timer
        File(paths.USAGE_SAVE, "Helper sparkfleet-usage-save", src=str(FILES_DIR / "sparkfleet-usage-save"),
             mode="0755"),
        # the server-state file's writer (the unit's reload and `sparkfleet drain` run it)
        File(paths.SERVERS_SAVE, "Helper sparkfleet-servers-save", src=str(FILES_DIR / "sparkfleet-servers-save"),
             mode="0755"),
        None if door.chat_ui else [Absent(path, f"{path} removed (no chat UI)") for path in CHAT_UI_FILES],
        maps,
        peers,
        File(paths.FRONT_DOOR_UNIT_PATH, "Front door unit", content=door.unit()),
        Unit(paths.FRONT_DOOR_UNIT_NAME, "Front door enabled and running", restart_on=(paths.FRONT_DOOR_UNIT_PATH,),
             reload_on=reload_on, daemon_reload_on=(paths.FRONT_DOOR_UNIT_PATH,)),
        File(saving, "Usage snapshot unit", content=save_service),
        File(timer, "Usage snapshot timer", content=save_timer),
        Unit(paths.USAGE_SAVE_TIMER, f"Usage snapshot every {paths.USAGE_SNAPSHOT_S} s",
             restart_on=(timer, saving, paths.USAGE_SAVE), daemon_reload_on=(timer, saving)),
        _address_state(door.doors, door.host, networks, s.front_door_port, door.tls),
        HttpWait(f"Front door answers on port {s.front_door_port}",  # its /health: 200 once a backend is in
                 f"{'https' if door.tls else 'http'}://127.0.0.1:{s.front_door_port}{serving.HEALTH['path']}",
                 s.health_timeout_s, serving.HEALTH["timeout_s"],
                 f"the front door has no backend in after {s.health_timeout_s}s",
                 when=(paths.FRONT_DOOR_UNIT_NAME, paths.FRONT_DOOR_UNIT_PATH), insecure=door.tls),
        # an interrupted rollout's holds: each host's release was brought in line by its stages before this one
        Command(f"{', '.join(h.backend for h in gone)} back in (held by an operation that is gone)",
                put_back_command(list(gone))) if gone else None,
        after=tls)


def _address_state(doors: DoorSet | None, host: str, networks: str | None, front_door_port: int,
                   tls: bool) -> DesiredState:
    """keepalived (Debian's package; its own keepalived.service masked before the install, so it never starts)
    under sparkfleet's unit, holding the floating address with the other doors on the interface whose network
    holds it. An address the inventory no longer names is held by no door (nothing where a door never had one)."""
    if doors is None or not doors.address:
        return desired(Unit(paths.DOOR_ADDRESS_UNIT_NAME, "No floating address: keepalived off", running=False,
                            enabled=False))
    interface = interface_for(host, str(doors.address), networks or "")
    return desired(
        Packages("keepalived installed (Debian's unit masked first: it never starts)", (paths.KEEPALIVED_PACKAGE,),
                 masked=(paths.KEEPALIVED_UNIT,)),
        Unit(paths.KEEPALIVED_UNIT, "Debian's keepalived.service off (sparkfleet's unit holds the address)",
             running=False, enabled=False),
        File(paths.DOOR_ADDRESS_CONFIG, f"Floating address {doors.address} on {interface} (keepalived)",
             content=keepalived_conf(doors, host, interface, front_door_port, tls), mode="0600"),
        File(paths.DOOR_ADDRESS_UNIT_PATH, "Floating address unit", content=keepalived_unit()),
        Unit(paths.DOOR_ADDRESS_UNIT_NAME, "Floating address: keepalived running",
             restart_on=(paths.DOOR_ADDRESS_UNIT_PATH,), reload_on=(paths.DOOR_ADDRESS_CONFIG,),
             daemon_reload_on=(paths.DOOR_ADDRESS_UNIT_PATH,)))


def no_door_state() -> DesiredState:
    """A host outside the group front_door runs no door: one it ran before (the inventory moved the door
    elsewhere) is stopped and its units removed, and so are its files with the users' keys and the engines' key.
    On a host that never ran one, nothing runs (what it would check is in the host's one read)."""
    why = "this host is not in the group front_door"
    return desired([UnitRemoved(unit, paths.unit_path(unit), why) for unit in DOOR_UNITS],
                   [Absent(path, f"{path} removed ({why})") for path in DOOR_FILES])
