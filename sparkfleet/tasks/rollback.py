"""Switch a host back to its previous release: the units, their settings and the release record
kept on disk when the current release replaced them (no download), with today's secrets, then
the health gate the previous release's own record describes.

A member of a tensor-parallel group rolls back with every other member (the fleet commands
run this on the whole group at once): each puts back its Ray node and checks it joined the
head's cluster; the head also its engine and the engine's gate (a worker serves no API of its own).

A record that names its units (`units`) gets every one of them back, the RAG services' included, and loses those a
newer release added; each kept service is gated too. An older record rolls back its role's units only."""

from pyinfra import host, state
from pyinfra.api import QuoteString, StringCommand, deploy
from pyinfra.operations import server

from sparkfleet.contract import paths
from sparkfleet.controller.progress import watch
from sparkfleet.host.facts import RuntimePath, Unreadable, read_json_object
from sparkfleet.host.operations import (
    ROLE_UNITS,
    previous_release_restored,
    record_health_gate,
    rollback_problem,
)
from sparkfleet.tasks.health import gate, ray_joined


def role_problem(kept: dict, source: str, name: str) -> Unreadable | None:
    """A kept record whose role is none this version knows, or a member's whose group is not one this host is in
    (read back from the host: checked, not trusted)."""
    role = kept.get("role", "single")
    if role not in ROLE_UNITS:
        return Unreadable(source, f"role {str(role)[:40]!r} is not one of {', '.join(ROLE_UNITS)}")
    group = kept.get("group")
    if role == "single":
        return None
    members, addresses = (group.get("members"), group.get("addresses")) if isinstance(group, dict) else (None, None)
    if not (isinstance(members, list) and isinstance(addresses, list) and len(members) == len(addresses) >= 2
            and all(isinstance(v, str) for v in members + addresses) and name in members
            and type(group.get("ray_port")) is int):
        return Unreadable(source, f"the {role}'s `group` is not a group of {name} (members, addresses, ray_port)")
    return None


def ray_members(kept: dict, name: str) -> tuple[str, str, dict[str, str]]:
    """(the head's Ray address, this member's fabric address, the members its gate expects): the head expects
    every member, a worker itself, as the converge's Ray gate does."""
    group = kept["group"]
    addresses = dict(zip(group["members"], group["addresses"], strict=True))
    expected = addresses if kept["role"] == "head" else {name: addresses[name]}
    return f"{group['addresses'][0]}:{group['ray_port']}", addresses[name], expected


@deploy("Rollback")
def rollback():
    current = read_json_object(host, paths.RELEASE_FILE)
    previous = read_json_object(host, paths.PREVIOUS_RELEASE_FILE)
    problem = (current.unreadable or previous.unreadable or rollback_problem(previous.value, previous.path)
               or role_problem(previous.value, previous.path, host.name))
    if problem:
        server.shell(name="Nothing to roll back to", commands=[
            StringCommand("echo", QuoteString(problem.line(host.name)), ">&2; exit 1")])
        return
    kept = previous.value
    swapped = previous_release_restored(
        name=f"Release {kept['release_id']} restored (was {(current.value or {}).get('release_id')})",
        previous=kept, current=current.value or {})
    if kept.get("role", "single") != "single":
        address, node_ip, expected = ray_members(kept, host.name)
        joined = ray_joined(name=f"Ray sees {', '.join(expected)} with 1 GPU each", address=address, node_ip=node_ip,
                            members=expected, wait_s=kept["health_timeout_s"], _if=swapped.did_change)
        record_health_gate(state, host.name, joined)
    if kept.get("role") != "worker":
        watch(state, host, engine=kept["release_id"] != (current.value or {}).get("release_id"))  # its restart
        # a record older than "container" is gated as the current release's container (the key goes nowhere else)
        container = kept.get("container") or (current.value or {}).get("container") or ""
        gate(kept["served_model_name"], kept["api_port"], kept["tools"], kept["health_timeout_s"],
             host.get_fact(RuntimePath), str(container), _if=swapped.did_change)
    if "units" in kept:  # a record that names its units brought back its services' too: each gated as the converge does
        for svc in (kept.get("services") or {}).values():
            gate(svc["served_model_name"], svc["api_port"], False, kept["health_timeout_s"], host.get_fact(RuntimePath),
                 svc["container"], kind=svc["kind"], unit=svc["unit"], _if=swapped.did_change)
