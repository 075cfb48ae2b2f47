"""The front door's commands: `drain` and `undrain` (a backend set aside until undrained, on every front door,
through `runtime`), the door in `status` (its state and rows; the exit rule is `holds.door_ok`), and
`bench --front-door`'s target."""

from __future__ import annotations

import time

from sparkfleet.contract import serving
from sparkfleet.contract.monitoring import FRONT_DOOR_GROUP
from sparkfleet.contract.reach import clients_url, front_door_url
from sparkfleet.contract.settings import parse_settings
from sparkfleet.roles.front_door.holds import controller_name, out_of_rotation
from sparkfleet.fleet.front_door.runtime import FrontDoorRuntime
from sparkfleet.roles.front_door.records import record_command, save_state_command, undrain_command
from sparkfleet.refused import FAILED, Refusal, Refused


class DrainRefused(Refusal):
    """Bad input to drain or undrain (no such host, no front door, not a backend): nothing was touched (exit 2)."""


class DoorUnreachable(Refusal):
    """A front door did not answer, or did not take a change; the message says what was changed (exit 1)."""

    code = FAILED


def _checked(inventory: str, host: str) -> FrontDoorRuntime:
    """The inventory's front doors, once each answered and has `host` among its backends; nothing is touched."""
    from sparkfleet.controller.inventory import load_hosts

    names = [name for name, _ in load_hosts(inventory)]
    if host not in names:
        raise DrainRefused(f"no host named {host!r} in {inventory}: give one of {', '.join(names)}")
    runtime = FrontDoorRuntime.of(inventory)
    if not runtime.doors:
        raise DrainRefused(f"no `{FRONT_DOOR_GROUP}` group in {inventory}: drain sets a host aside on the front door; "
                           "add one (see inventory/office_front_door.py)")
    states = runtime.states()
    silent = sorted(door for door, found in states.items() if found is None)
    if silent:
        raise DoorUnreachable(f"front door {', '.join(silent)} did not answer (SSH, or its HAProxy): nothing "
                              "was changed; run it again once it answers")
    outside = sorted(door for door, found in states.items() if host not in found)
    if outside:
        raise DrainRefused(f"{host} is no backend of the front door on {', '.join(outside)} (a tensor-parallel "
                           "worker, or another served model): give a host that serves behind it")
    return runtime


def _changed_everywhere(runtime: FrontDoorRuntime, command: str, what: str) -> None:
    failed = sorted(door for door, answer in runtime._shell(command).items() if answer is None)
    if failed:
        raise DoorUnreachable(f"front door {', '.join(failed)}: {what} failed: run it again")


def _report(runtime: FrontDoorRuntime, host: str, drained: bool) -> dict:
    """What drain or undrain prints: the host, whether it is drained now, its state on each front door."""
    states = runtime.states()
    return {"host": host, "drained": drained,
            "front_doors": [{"host": door, "state": (found or {}).get(host, {}).get("state", "-")}
                            for door, found in states.items()]}


def drain_host(inventory: str, host: str, log=print) -> dict:
    """Set `host` aside on every front door until `undrain_host`: the record first (a rollout's batch end
    then leaves it out), then drain and maintenance (FrontDoorRuntime.drain), then the server-state file."""
    runtime = _checked(inventory, host)
    _changed_everywhere(runtime, record_command(host, drained=True), "recording the drain (nothing set aside)")
    runtime.drain([host], log)
    _changed_everywhere(runtime, save_state_command(), "saving HAProxy's server state (the drain holds: the "
                        "record is replayed when HAProxy starts)")
    return _report(runtime, host, drained=True)


def undrain_host(inventory: str, host: str, log=print) -> dict:
    """Put `host` back on every front door (it takes requests once its health checks pass), record cleared."""
    runtime = _checked(inventory, host)
    _changed_everywhere(runtime, undrain_command(host), "undrain")
    log(f"front door: {host} back in once its health checks pass")
    return _report(runtime, host, drained=False)


# --- status and bench ------------------------------------------------------------------------------


def front_door_status(inventory: str) -> dict | None:
    """The inventory's front door for `status`: its URL, whether it answers, and each backend's state.

    None when the inventory has no `front_door` group. `up` is False when any
    front door does not answer /health with 200 (down, or no backend in).
    """
    import requests

    runtime = FrontDoorRuntime.of(inventory)
    if not runtime.doors:
        return None
    survey = runtime.survey()  # one SSH round trip to each door
    states, certificates = survey.states, survey.certificates
    doors = []
    for name, data in runtime.doors:
        s = parse_settings(name, data)
        url = front_door_url(name, s, data)
        try:
            up = requests.get(url + serving.HEALTH["path"], timeout=serving.HEALTH["timeout_s"],
                              verify=s.controller_front_door_ca or True).status_code == 200
        except requests.RequestException:
            up = False
        doors.append({"host": name, "url": url, "up": up and states.get(name) is not None,
                      "certificate_ends": certificates.get(name)})
    seen = next((s for s in states.values() if s is not None), {})
    backends = [{"host": host, "state": row["state"]} for host, row in sorted(seen.items())]
    # the floating address (two or more doors): which door holds it now (asked of each door: `ip addr`)
    holder = survey.holder
    return {"url": doors[0]["url"], "up": all(d["up"] for d in doors) and (holder is not None or not runtime.address),
            "doors": doors, "backends": backends, "address": runtime.address, "holder": holder,
            "out_of_rotation": out_of_rotation(seen, controller_name(), time.time())}


def status_rows(door: dict) -> list[tuple[str, str, str]]:
    """The front door for the status table: (front door or backend, where, state); a backend out of rotation
    with its reason (text, never markup)."""
    from sparkfleet.tables import literal

    colour = {"in": "green", "draining": "yellow", "out": "yellow", "drained": "cyan", "down": "red"}
    why = {b["host"]: (b["reason"], b["held"]) for b in door.get("out_of_rotation", ())}

    def state(b: dict) -> str:
        cell = f"[{colour[b['state']]}]{b['state']}[/]"
        if b["host"] not in why:
            return cell
        reason, held = why[b["host"]]
        return f"{cell}: " + (literal(reason) if held else f"[red]{literal(reason)}[/]")

    address = []
    if door.get("address"):
        address = [("floating address", door["address"], f"[green]held by {literal(door['holder'])}[/]"
                    if door.get("holder") else "[red]held by no door[/]")]
    return (address + [(d["host"], d["url"], ("[green]up[/]" if d["up"] else "[red]DOWN[/]")
                        + (" (holds the address)" if d["host"] == door.get("holder") else "")
                        + (f"; certificate until {d['certificate_ends']}" if d.get("certificate_ends") else ""))
                       for d in door["doors"]]
            + [(f"  {b['host']}", "backend", state(b)) for b in door["backends"]])


def bench_target(inventory: str, user: str | None = None) -> tuple[str, str, str]:
    """(url, served model, a user's key) of the inventory's first front door as clients reach it (the floating
    address of two doors), for `bench --front-door` and the demo's chat."""
    runtime = FrontDoorRuntime.of(inventory)
    if not runtime.doors:
        raise Refused(f"no `{FRONT_DOOR_GROUP}` group in {inventory}: add one (see inventory/office_front_door.py)")
    name, data = runtime.doors[0]
    s = parse_settings(name, data)
    if not s.front_door_users:
        raise Refused(f"{name}: setting `front_door_users` is empty: give the front door at least one user")
    user = user or min(s.front_door_users)
    if user not in s.front_door_users:
        raise Refused(f"{name}: no user {user!r} in front_door_users")
    return clients_url(name, s, data), s.served_model_name, s.front_door_users[user].key

