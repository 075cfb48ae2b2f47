"""The inventory's checks across hosts, the one owner of every refusal the deploy could make offline: `plan` and
the deploy (`controller/inventory.py` `plans`) both run `check_inventory` on the whole inventory's plans, so what
the deploy refuses, `plan` refuses first, before any host is touched.

Each role's planner runs here as its stage runs it (the chat UI, the front doors with the chat UI behind them, the
monitoring hosts' whole desired state, every host's guard), and the rules no single role owns: every port a host
would bind (`bound_ports`) differs from its others, no two hosts share one SSH target or one LAN address, a group
whose name is near one of sparkfleet's is a typo, a key in the namespace of a pyinfra connector must be one it
knows (else the host is reached by its inventory name), viewers of the status page need a door that is a
monitoring host. A refusal the deploy keeps is one only a host (its networks, its records) or a hub or registry
can answer: tests/unit/test_refusals_planned.py holds every refusal site of the deploy path to that.

`duplicate_entries` reads the inventory file itself (pyinfra merges a host named twice silently): every command's
inventory load runs it (`load_hosts`).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass

from sparkfleet.contract import monitoring as m
from sparkfleet.contract.paths import CHAT_UI_GROUP, engine_port
from sparkfleet.contract.reach import ssh_address
from sparkfleet.contract.settings import CONNECTION_PREFIXES, GROUPS_KEY, Settings, SettingsError
from sparkfleet.controller.backup_plan import plan_backups
from sparkfleet.release.plan import HostPlan
from sparkfleet.roles.chat_ui import ChatUi, chat_ui_plan, email
from sparkfleet.roles.front_door.plan import FrontDoor, planned_front_doors
from sparkfleet.roles.guard import guard_plan, guard_state
from sparkfleet.roles.monitoring import monitoring_state

# The inventory groups sparkfleet gives a meaning to: a group named near one of them is a typo.
ROLE_GROUPS = (m.FRONT_DOOR_GROUP, m.GROUP, CHAT_UI_GROUP)
TYPO_CUTOFF = 0.8  # difflib's ratio: chatui / chat_ui 0.92, monitor / monitoring 0.82, front / front_door 0.67


@dataclass(frozen=True)
class Checked:
    """What the checks planned beside each host's release: the front doors and the chat UI (None without one)."""

    doors: tuple[FrontDoor, ...]
    ui: ChatUi | None


def groups_of(hosts: Iterable[tuple[str, dict]]) -> dict[str, set[str]]:
    """{host: its inventory groups} (GROUPS_KEY, as `load_hosts` and the deploy's host data carry them)."""
    return {name: set(data.get(GROUPS_KEY, ())) for name, data in hosts}


def members(groups: dict[str, set[str]], group: str) -> list[str]:
    return [name for name, of in groups.items() if group in of]


def check_inventory(hosts: list[tuple[str, dict]], plans: list[HostPlan]) -> Checked:
    """Every cross-host and role check of the whole inventory (`hosts`: [(name, merged data)], `plans`: their
    plans); SettingsError naming every problem, one line each: the host(s), the setting and the fix."""
    planned = {p.name: p for p in plans}
    groups = {name: of for name, of in groups_of(hosts).items() if name in planned}
    problems = connection_key_problems(hosts) + group_problems(groups) + address_problems(hosts, planned)
    ui = None
    try:
        ui = chat_ui_plan(members(groups, CHAT_UI_GROUP), planned)
    except SettingsError as exc:
        problems += exc.problems
    doors: list[FrontDoor] = []
    try:
        doors = planned_front_doors(members(groups, m.FRONT_DOOR_GROUP), planned,
                                    frozenset(members(groups, m.GROUP)), ui)
    except SettingsError as exc:
        problems += exc.problems
    monitored = groups if members(groups, m.GROUP) else {}
    for name in members(groups, m.GROUP):
        try:
            monitoring_state(name, planned, monitored)
        except SettingsError as exc:
            problems += exc.problems
    for plan in plans:
        try:
            guard_state(plan, runs_chat_ui=CHAT_UI_GROUP in groups.get(plan.name, ()))
        except SettingsError as exc:
            problems += exc.problems
    try:  # the backups' sources, target, password file and the target's pinned host key (controller/backup_plan.py)
        plan_backups({name: data for name, data in hosts if name in planned}, planned, ui.host if ui else None)
    except SettingsError as exc:
        problems += exc.problems
    problems += viewer_problems(planned, groups)
    problems += chat_ui_problems(ui, planned, groups)
    problems += port_problems(planned, groups, problems)
    problems += quality_problems(plans)
    if problems:
        raise SettingsError(list(dict.fromkeys(problems)))
    return Checked(tuple(doors), ui)


def quality_problems(plans: list[HostPlan]) -> list[str]:
    """Each Spark's probe suite (`quality_probes`, else the packaged one: sparkfleet.quality.suite) parses, and each
    chat model it serves (its own, a chat service's) has the context every chat probe needs; a file's problem said
    once, a host's fit per host. `quality_margin` and the interval are the settings' (contract/settings.py)."""
    from sparkfleet.contract.quality import suite_path
    from sparkfleet.quality.suite import SuiteError, check_suite, load_suite

    problems, suites = [], {}
    for plan in plans:
        if not plan.runs_engine:
            continue
        path = suite_path(plan.settings.quality_probes)
        if str(path) not in suites:
            try:
                suites[str(path)] = load_suite(path)
            except SuiteError as exc:
                suites[str(path)] = None
                problems.append(f"setting `quality_probes`: {exc}")
        suite = suites[str(path)]
        contexts = [plan.settings.max_model_len, *(svc.settings.max_model_len for svc in plan.services
                                                   if svc.settings is not None)]
        for context in (contexts if suite is not None else ()):
            try:
                check_suite(suite, context)
            except SuiteError as exc:
                problems.append(f"{plan.name}: {exc}")
                break
    return problems


# --- the inventory's own shape ------------------------------------------------------------------------------------


def connector_keys() -> frozenset[str]:
    """The host data keys pyinfra's connectors know (ssh_hostname, ssh_port, docker_identifier, ...), from each
    connector's own declaration."""
    from pyinfra.api.connectors import get_all_connectors

    return frozenset(key for connector in get_all_connectors().values()
                     for key in getattr(connector, "data_meta", None) or {})


def global_arguments() -> frozenset[str]:
    """pyinfra's global arguments a host's data may set (`_sudo`, `_sudo_user`, ...)."""
    from pyinfra.api.arguments import all_global_arguments

    return frozenset(f"_{name.lstrip('_')}" for name, _ in all_global_arguments())


def connection_key_problems(hosts: list[tuple[str, dict]]) -> list[str]:
    """A key in pyinfra's connectors' namespace (contract/settings.py CONNECTION_PREFIXES: ssh_, winrm_, ...: the
    settings never check them) that no connector knows is a typo pyinfra ignores (an `ssh_hostnmae`: the host then
    reached by its inventory name); an `_` key near one of pyinfra's global arguments (`_sduo`) too."""
    known, arguments, problems = connector_keys(), global_arguments(), []
    for name, data in hosts:
        for key in data:
            if not isinstance(key, str) or key in known or key in Settings.model_fields:
                continue
            if key.startswith(CONNECTION_PREFIXES) and not key.startswith("_"):
                close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
                fix = f"did you mean `{close[0]}`?" if close else f"pyinfra knows {', '.join(sorted(known))}"
                problems.append(f"{name}: unknown connection key `{short(key)}`: {fix}")
            elif key.startswith("_") and key not in arguments and not key.startswith("_sparkfleet"):
                close = difflib.get_close_matches(key, arguments, n=1, cutoff=0.8)
                if close:
                    problems.append(f"{name}: unknown key `{short(key)}`: did you mean pyinfra's `{close[0]}`?")
    return problems


def group_problems(groups: dict[str, set[str]]) -> list[str]:
    """A group whose name is near, but not, one of sparkfleet's (ROLE_GROUPS) gives its hosts no role: a typo."""
    problems = []
    for group in sorted({g for of in groups.values() for g in of} - set(ROLE_GROUPS)):
        close = difflib.get_close_matches(group.lower(), ROLE_GROUPS, n=1, cutoff=TYPO_CUTOFF)
        if close:
            problems.append(f"group `{short(group)}` ({', '.join(members(groups, group))}): not one of sparkfleet's "
                            f"groups ({', '.join(ROLE_GROUPS)}): did you mean `{close[0]}`? rename it")
    return problems


def address_problems(hosts: list[tuple[str, dict]], planned: dict[str, HostPlan]) -> list[str]:
    """Two inventory hosts on one SSH target (address and port) are one machine converged twice; two on one LAN
    address are one machine to every other host (the doors' server lines, the peers, Prometheus)."""
    problems, said = [], set()
    by_ssh: dict[tuple[str, object], list[str]] = {}
    by_lan: dict[str, list[str]] = {}
    for name, data in hosts:
        if name not in planned:
            continue
        by_ssh.setdefault((ssh_address(name, data), data.get("ssh_port") or 22), []).append(name)
        by_lan.setdefault(planned[name].lan_address, []).append(name)
    for (address, port), names in by_ssh.items():
        if len(names) > 1:
            problems.append(f"{', '.join(names)}: one SSH target {address}:{port} (ssh_hostname, ssh_port): two "
                            "inventory hosts would be one machine: give each its own `ssh_hostname`, or drop one")
            said.add(tuple(names))
    for address, names in by_lan.items():
        if len(names) > 1 and tuple(names) not in said:
            problems.append(f"{', '.join(names)}: one LAN address {address} (lan_address, else ssh_hostname, else "
                            "the host's name): give each its own `lan_address`, or drop one")
    return problems


def duplicate_entries(inventory_path: str) -> list[str]:
    """The inventory file's groups as written (pyinfra merges the entries of a host named twice, the later's
    values silently winning): a host named twice in one group, or two entries giving one key different values,
    one line each. The same settings given in several groups (`front_door = sparks`) are one host's."""
    from pyinfra_cli.inventory import _get_groups_from_filename

    problems: list[str] = []
    given: dict[str, dict[str, tuple[str, object]]] = {}  # host -> key -> (the group that gave it, its value)
    for group, entries in _get_groups_from_filename(inventory_path).items():
        entries = entries[0] if isinstance(entries, tuple) else entries
        seen: set[str] = set()
        for entry in entries:
            name, data = (entry[0], entry[1]) if isinstance(entry, tuple) and len(entry) == 2 else (entry, {})
            if not isinstance(name, str):
                continue
            if name in seen:
                problems.append(f"{short(name)}: named twice in group `{group}` of {inventory_path}: keep one entry")
            seen.add(name)
            for key, value in (data.items() if isinstance(data, dict) else ()):
                first = given.setdefault(name, {}).setdefault(key, (group, value))
                if first[0] != group and first[1] != value:
                    problems.append(f"{short(name)}: `{short(str(key))}` is given two values, in groups `{first[0]}` "
                                    f"and `{group}` of {inventory_path}: the later would silently win: give it once")
    return problems


# --- roles and ports ----------------------------------------------------------------------------------------------


def viewer_problems(planned: dict[str, HostPlan], groups: dict[str, set[str]]) -> list[str]:
    """The status page is served by a door that is also a monitoring host (front_door_plan): viewers set on the
    doors of an inventory where no door is one would never be asked for their passwords."""
    doors = members(groups, m.FRONT_DOOR_GROUP)
    if any(m.GROUP in groups[name] for name in doors):
        return []
    return [f"{name}: setting `front_door_viewers` is set, but no front door is also a monitoring host, the one "
            f"that serves the status page: put a door in the group `{m.GROUP}`, or drop the viewers"
            for name in doors if planned[name].settings.front_door_viewers]


def chat_ui_problems(ui: ChatUi | None, planned: dict[str, HostPlan], groups: dict[str, set[str]]) -> list[str]:
    """What the chat UI needs beyond its own host's settings (chat_ui_plan): a front door, the only way in; a
    guard on its host, which the doors reach it through (a host running no engine, a tensor-parallel worker, runs
    none); on each door, users told apart by more than case (their accounts are e-mail addresses, lower-cased)."""
    if ui is None:
        return []
    doors = members(groups, m.FRONT_DOOR_GROUP)
    problems = []
    if not doors:
        problems.append(f"{ui.host}: group `{CHAT_UI_GROUP}` without a front door: people reach the chat UI only "
                        f"through one: put a host in the group `{m.FRONT_DOOR_GROUP}`")
    if guard_plan(planned[ui.host]) is None and not planned[ui.host].is_service:
        problems.append(f"{ui.host}: group `{CHAT_UI_GROUP}`: this host runs no engine (a tensor-parallel worker), "
                        "so no guard the doors could reach the chat UI through: put a host that serves in the group")
    for door in doors:
        seen: dict[str, str] = {}
        for name in planned[door].settings.front_door_users:
            if seen.setdefault(email(name), name) != name:
                problems.append(f"{door}: setting `front_door_users`: {seen[email(name)]!r} and {name!r} differ only "
                                "in case: the chat UI's accounts would be one; rename one")
    return problems


def bound_ports(plan: HostPlan, groups: set[str], doors: int, monitored: bool) -> list[tuple[str, int]]:
    """Every port `plan`'s host would bind, named by its setting: the engines (the guard on each API port, the
    engine behind it on its engine port), the model share, Ray's head, the node exporter, the door (its port, its
    peers' where two or more doors share the table, the chat UI's), Prometheus and Alertmanager, the chat UI's
    listener on its host's guard. Loopback or LAN, a port is bound once on a host."""
    s, ports = plan.settings, []
    if plan.runs_engine:
        ports += [("api_port", s.api_port), ("the engine port of api_port", engine_port(s.api_port))]
    for svc in plan.services:
        port = svc.service.api_port
        ports += [(f"service {svc.name}'s api_port", port), (f"the engine port of service {svc.name}'s api_port",
                                                             engine_port(port))]
    if not plan.is_service:
        ports.append(("peer_port", s.peer_port))
    if plan.role == "head":
        ports.append(("ray_port", s.ray_port))
    if monitored and plan.runs_engine:
        ports.append(("the node exporter's port", m.NODE_EXPORTER_PORT))
    if m.FRONT_DOOR_GROUP in groups:
        ports.append(("front_door_port", s.front_door_port))
        if doors > 1:
            ports.append(("front_door_peers_port", s.front_door_peers_port))
    if m.GROUP in groups:
        ports.append(("monitoring_port", s.monitoring_port))
        if s.alertmanager_webhook_url:
            ports.append(("alertmanager_port", s.alertmanager_port))
    if CHAT_UI_GROUP in groups:
        ports.append(("chat_ui_host_port", s.chat_ui_host_port))
    return ports


def port_problems(planned: dict[str, HostPlan], groups: dict[str, set[str]], said: Iterable[str] = ()) -> list[str]:
    """Two settings of one host that bind one port: one line per clash, naming both; a clash a role's planner
    already named (`said`: its line names the host and one of the two settings at that port) is not said twice."""
    doors = len(members(groups, m.FRONT_DOOR_GROUP))
    monitored = bool(members(groups, m.GROUP))
    ui = bool(members(groups, CHAT_UI_GROUP))
    problems = []
    for name, plan in planned.items():
        of = groups.get(name, set())
        ports = bound_ports(plan, of, doors, monitored)
        if ui and m.FRONT_DOOR_GROUP in of:
            ports.append(("chat_ui_port", plan.settings.chat_ui_port))
        first: dict[int, str] = {}
        for what, port in ports:
            named = (f"`{what}` = {port}", f"`{first.get(port)}` = {port}")
            if port in first and first[port] != what and not any(
                    line.startswith(f"{name}: ") and any(n in line for n in named) for line in said):
                problems.append(f"{name}: {fix_name(what)} = {port} is {fix_name(first[port], '')} too (two "
                                "listeners on one port of this host): pick another port")
            first.setdefault(port, what)
    return problems


def fix_name(what: str, setting: str = "setting ") -> str:
    """A port's name in a line: a setting in backquotes, a derived port as it is."""
    return f"{setting}`{what}`" if " " not in what else what


def short(text: str, limit: int = 60) -> str:
    """A name from the inventory, cut where it is long (a line never echoes 100,000 characters)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"
