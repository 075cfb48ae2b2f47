"""Two or more front doors, one address: the rules, as plain functions of the inventory's plans and of what a door
host answers (no I/O here).

- `door_set`: the inventory's doors as one set: the floating address (`front_door_address`, the same on every
  door), VRRP's router id, each door's priority (inventory order: the first door is the highest), the peers
  HAProxy shares its per-user table with; every refusal is one line naming the fix, before any host is touched.
- `interface_for`: the interface keepalived puts the address on: the door's interface whose network holds it
  (from `ip -j -4 addr`, untrusted host output).
- `keepalived_conf`: keepalived's config for one door (templates/front-door.keepalived.conf.j2).
- `handover`: what a planned change of some hosts (a rollout's batch, an upgrade's step) does with the address
  first and afterwards: the one rule rollout, upgrade and the front door's runtime follow.

One door without an address is what it always was: `door_set` is None and nothing here is rendered.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Sequence
from dataclasses import dataclass

from sparkfleet.contract import paths, serving
from sparkfleet.contract.paths import engine_port
from sparkfleet.contract.settings import SettingsError
from sparkfleet.roles import haproxy
from sparkfleet.release import render
from sparkfleet.release.plan import HostPlan

PEERS_SECTION = "sparkfleet_doors"  # HAProxy's peers section: the usage table is shared through it
VRRP_INSTANCE = "sparkfleet_front_door"
TOP_PRIORITY = 200  # the first door's; each next one in the inventory 1 lower (VRRP: 1..254)
MAX_FACT_CHARS = 1_000_000  # an `ip -j -4 addr` answer bigger than this is not believed


@dataclass(frozen=True)
class Door:
    name: str  # its inventory name: HAProxy's peer name, keepalived's router_id
    lan_address: str  # where the other doors reach it (contract/reach.py lan_address)


@dataclass(frozen=True)
class DoorSet:
    """The inventory's front doors as one: `address` None where they share none (each door its own URL)."""

    doors: tuple[Door, ...]
    address: ipaddress.IPv4Interface | None
    router_id: int | None
    preempt: bool
    unicast: bool
    peers_port: int
    # TLS on the peers link where the hops are TLS (`peers_tls`: each door's own peers certificate, only the doors'
    # trusted), the peers section's `default-bind` and `default-server`; None: plain TCP between the doors.
    peers_server_options: str | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.doors)

    @property
    def sharing(self) -> tuple[str, ...]:
        """The doors that move a floating address between them (`handover`'s): none where there is none."""
        return self.names if self.address else ()

    def priority(self, name: str) -> int:
        return TOP_PRIORITY - self.names.index(name)

    def peers(self, host: str) -> dict | None:
        """What the HAProxy config of door `host` names for its peers section (None: one door, no section)."""
        if len(self.doors) < 2:
            return None
        return {"section": PEERS_SECTION, "local": host, "default_server": self.peers_server_options,
                "peers": [{"name": d.name, "target": haproxy.address(d.lan_address, self.peers_port)}
                          for d in self.doors]}

    def lan_of(self, name: str) -> str:
        return self.doors[self.names.index(name)].lan_address


def _ip(value: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        return None


def derived_router_id(address: ipaddress.IPv4Interface) -> int | None:
    """VRRP's router id from the floating address: its last byte (10.0.0.100 -> 100), so two door sets of one
    /24 (or smaller) network never share an id; None where that byte is 0 (a /23 or larger network's)."""
    last = int(address.ip) & 0xFF
    return last or None


def door_set(names: list[str], plans: dict[str, HostPlan]) -> DoorSet | None:
    """The front doors `names` (inventory order) as one set, or None where there is one door and no floating
    address (nothing new is rendered). SettingsError names every problem, one line each:

    - the doors disagree on `front_door_address` (or another host claims another one): two sets, one LAN;
    - the address is a host's own (its LAN address, where the controller reaches it, its api_host);
    - a door's LAN address (an IP literal) is outside the address's network;
    - no router id (the address's last byte is 0 and `front_door_vrrp_router_id` is not set);
    - unicast VRRP with a door whose LAN address is a host name (keepalived's peers are IP addresses);
    - the peers port is another port of that host."""
    if not names:
        return None
    problems = []
    first = plans[names[0]].settings
    claims = {plans[n].settings.front_door_address for n in names}
    if len(claims) > 1:
        shown = ", ".join(f"{n}: {plans[n].settings.front_door_address}" for n in names)
        problems.append(f"{names[0]}: the front doors name different `front_door_address`es ({shown}): one set of "
                        "doors shares one address; set it once, on the group front_door")
    others = {p.settings.front_door_address for n, p in plans.items() if n not in names} - claims - {None}
    if others:
        problems.append(f"{names[0]}: hosts outside the group front_door claim `front_door_address` "
                        f"{', '.join(sorted(others))}: only the doors hold one; set it on the group front_door")
    for n in names:
        if not haproxy.SERVER_NAME.fullmatch(n):
            problems.append(f"{n}: a front door's name must be letters, digits and _ . : - (it names its peer): "
                            "rename it in the inventory")
    text = first.front_door_address
    if text is None or len(claims) > 1:
        if problems:
            raise SettingsError(problems)
        if len(names) < 2:
            return None
        return DoorSet(tuple(Door(n, plans[n].lan_address) for n in names), None, None, False, False,
                       first.front_door_peers_port, peers_tls(plans[names[0]]))
    address = ipaddress.IPv4Interface(text)
    for n, p in plans.items():
        own = {p.lan_address, p.settings.api_host, p.settings.lan_address}
        if str(address.ip) in own:
            problems.append(f"{n}: front_door_address {text} is this host's own address: the floating address "
                            "must be one no host has; choose a free address in the doors' subnet")
    for n in names:
        lan = _ip(plans[n].lan_address)
        if lan is not None and lan not in address.network:
            problems.append(f"{n}: front_door_address {text} is outside the network of {n}'s LAN address {lan}: "
                            "choose an address in the doors' subnet")
    router_id = first.front_door_vrrp_router_id or derived_router_id(address)
    if router_id is None:
        problems.append(f"{names[0]}: front_door_address {text} ends in .0, which gives no VRRP router id: set "
                        "`front_door_vrrp_router_id` (1-255, unique on the LAN)")
    if first.front_door_vrrp_unicast:
        problems += [f"{n}: front_door_vrrp_unicast needs the doors' LAN addresses as IP addresses, not "
                     f"{plans[n].lan_address!r}: set `lan_address` to its IP" for n in names
                     if _ip(plans[n].lan_address) is None]
    port = first.front_door_peers_port
    for n in names:
        s = plans[n].settings
        taken = {"front_door_port": s.front_door_port, "api_port": s.api_port, "peer_port": s.peer_port,
                 "the engine's loopback port": engine_port(s.api_port), "monitoring_port": s.monitoring_port,
                 "alertmanager_port": s.alertmanager_port, "ray_port": s.ray_port}
        clash = [k for k, v in taken.items() if v == port]
        if len(names) > 1 and clash:
            problems.append(f"{n}: front_door_peers_port {port} is {clash[0]} on this host: pick another port")
    if problems:
        raise SettingsError(problems)
    return DoorSet(tuple(Door(n, plans[n].lan_address) for n in names), address, router_id,
                   first.front_door_address_preempt, first.front_door_vrrp_unicast, port, peers_tls(plans[names[0]]))


PEERS_TLS = f"ssl verify required ca-file {paths.TLS_PEERS_CA} crt {paths.TLS_PEERS_PEM}"


def peers_tls(plan: HostPlan) -> str | None:
    """The peers link's TLS options where the fleet's hops are TLS (its plan's backend_tls), else None: TLS both
    ways, each door presenting its own peers certificate and trusting only the doors' (roles/pki.py `peers_state`:
    pinned, not the fleet CA, whose certificates every Spark holds). HAProxy's peers listener checks no name, so
    the trust file is the whole check."""
    return PEERS_TLS if plan.backend_tls else None


# refusal: host-only: it reads the door host's own `ip -j -4 addr` (the floating address's network is the host's)
def interface_for(host: str, address: str, ip_json: str) -> str:
    """The interface of `host` whose IPv4 network holds `address` (CIDR), from `ip -j -4 addr` (untrusted: a
    name that is no interface name, an address that is none, is skipped); SettingsError in one line where
    none does, naming the host's networks."""
    floating = ipaddress.IPv4Interface(address)
    if len(ip_json) > MAX_FACT_CHARS:
        raise SettingsError([f"{host}: `ip -j -4 addr` printed more than {MAX_FACT_CHARS} characters: not believed"])
    try:
        links = json.loads(ip_json or "[]")
    except ValueError:
        raise SettingsError([f"{host}: `ip -j -4 addr` printed no JSON (iproute2 too old for -j?)"]) from None
    seen, found = [], []
    for link in links if isinstance(links, list) else []:
        name = link.get("ifname") if isinstance(link, dict) else None
        if not isinstance(name, str) or not haproxy.SERVER_NAME.fullmatch(name) or len(name) > 15:
            continue
        for info in link.get("addr_info") or []:
            if not isinstance(info, dict) or info.get("family", "inet") != "inet":
                continue
            try:
                net = ipaddress.IPv4Interface(f"{info.get('local')}/{int(info.get('prefixlen'))}")
            except (ValueError, TypeError):
                continue
            if net.ip == floating.ip:  # the floating address itself, where this door holds it now
                continue
            if f"{net.network} on {name}" not in seen:
                seen.append(f"{net.network} on {name}")
            if floating.ip in net.network and name not in found:
                found.append(name)
    if not found:
        networks = ", ".join(seen) or "no IPv4 network"
        raise SettingsError([f"{host}: front_door_address {address} is outside every network of {host} "
                             f"({networks}): choose an address in the doors' subnet"])
    return found[0]


def keepalived_conf(doors: DoorSet, host: str, interface: str, front_door_port: int, tls: bool) -> str:
    """keepalived's config for door `host`: one VRRP instance, BACKUP on every door (nopreempt unless
    front_door_address_preempt), its priority from the inventory's order, a check of the local HAProxy (any answer
    to /health within a second: a door whose HAProxy stops answering gives the address up), and the address on
    `interface` (validated: a name `ip` lists)."""
    if not haproxy.SERVER_NAME.fullmatch(interface) or len(interface) > 15:
        raise ValueError(f"interface {interface!r} is not an interface name")
    scheme = "https" if tls else "http"
    lan = doors.lan_of(host)
    return render._templates.get_template("front-door.keepalived.conf.j2").render(
        host=haproxy.token(host, "front door name"), instance=VRRP_INSTANCE, interface=interface,
        router_id=doors.router_id, priority=doors.priority(host), preempt=doors.preempt, address=str(doors.address),
        check=f"/usr/bin/curl -sk -o /dev/null --max-time {serving.HEALTH['timeout_s']} "
              f"{scheme}://127.0.0.1:{int(front_door_port)}{serving.HEALTH['path']}",
        unicast_src=lan if doors.unicast else None,
        unicast_peers=[d.lan_address for d in doors.doors if d.name != host] if doors.unicast else [])


def keepalived_unit() -> str:
    return render._templates.get_template("sparkfleet-door-address.service.j2").render(
        config=paths.DOOR_ADDRESS_CONFIG, pid_dir=paths.DOOR_ADDRESS_RUNTIME_NAME)


# --- planned changes: the address first --------------------------------------------------------------------


@dataclass(frozen=True)
class Handover:
    """What a planned change of some hosts does with the floating address, before and after it touches them.

    release: the doors among them whose keepalived is stopped first (one holding the address hands it over:
    keepalived sends priority 0 and a backup takes it within a second);
    wait_for: the other doors, one of which must hold the address before anything is touched;
    drain: the door that held it: wait until its own in-flight requests finish (it still listens on its own
    address; no new request comes through the floating one);
    rejoin: after the change, keepalived started again on `release` (BACKUP: under nopreempt it stays so);
    problem: why the address cannot move first (every door is in the change): the change goes on, as with one door.
    """

    release: tuple[str, ...] = ()
    wait_for: tuple[str, ...] = ()
    drain: tuple[str, ...] = ()
    rejoin: tuple[str, ...] = ()
    problem: str | None = None


def handover(hosts: list[str], doors: Sequence[str], holder: str | None) -> Handover:
    """The one rule: a change of `hosts` that includes doors stops their keepalived first, waits until a door
    outside the change holds the address, and drains the door that held it; afterwards their keepalived starts
    again. `doors`: the names of the doors sharing a floating address (DoorSet.sharing; none: nothing to do, as
    where no door is among `hosts`)."""
    touched = tuple(d for d in doors if d in hosts)
    if not touched:
        return Handover()
    rest = tuple(d for d in doors if d not in hosts)
    if not rest:
        return Handover(problem=f"every front door ({', '.join(touched)}) is in this change: the address cannot "
                                "move first; put the doors in different batches")
    held = (holder,) if holder in touched else ()
    return Handover(release=touched, wait_for=rest if held else (), drain=held, rejoin=touched)
