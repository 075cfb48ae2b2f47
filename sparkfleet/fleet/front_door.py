"""The front door: one HAProxy in front of the engines that serve one model, built from the inventory.

HAProxy (Debian's package) rather than a proxy of our own: per-user keys are a
map file, health routing is its checks (a one-token chat completion, since a
wedged engine still answers /health), cache affinity is `balance hash` on the
conversation with consistent hashing, and drain is its runtime API. Its
backends are the hosts' guards (fleet/guard.py), asked with the engines' key; a
user's key reaches only the OpenAI paths the fleet serves (fleet/haproxy.py
`API_PATHS`). The plain parts (config, maps, reading its state) are functions
here; the runtime calls go over SSH to the front door hosts, through pyinfra
like every other command.

`sparkfleet drain` keeps a backend out until `undrain`: a root-only record on
each front door host (paths.FRONT_DOOR_DRAINED), beside HAProxy's own state
and outside what a converge renders or manages, so a converge of a drained
fleet changes nothing. A reload keeps the backend's maintenance in HAProxy's
server-state file, a start replays the record (the unit's ExecStartPost), and
`FrontDoorRuntime.ready` (a rollout's batch end, a rollback) skips what the
record holds.
"""

from __future__ import annotations

import csv
import io
import re
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

from sparkfleet.fleet import haproxy
from sparkfleet.contract import paths, serving
from sparkfleet.contract.paths import engine_port
from sparkfleet.release.plan import HostPlan
from sparkfleet.contract.settings import Settings, SettingsError, parse_settings

GROUP = "front_door"  # the inventory group whose hosts run a front door
BACKEND = "engines"
# Bytes of a request HAProxy reads to name its conversation: enough for the first two messages (a system
# prompt of ~60k tokens); the rest of a longer body need not fit. Two such buffers per connection: 500
# connections (far more requests than the engines behind it run at once) stay within 256 MiB.
BUFSIZE = 256 * 1024
LIMITS = haproxy.Limits(maxconn=500, bufsize=BUFSIZE, memory_max="512M")
# Checks: a hung engine is out within ~3 s (two missed 1 s checks); back after two good ones.
CHECK = {"inter": "1s", "fastinter": "500ms", "fall": 2, "rise": 2, "timeout": "1s"}
_SERVER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}")


@dataclass(frozen=True)
class Backend:
    name: str  # the inventory host name, which is HAProxy's server name
    address: str
    port: int

    @property
    def target(self) -> str:
        """`address:port` of its `server` line (the host's guard)."""
        return haproxy.address(self.address, self.port)


@dataclass(frozen=True)
class Route:
    """A RAG service's model behind the front door: the hosts serving it, found by the `model` of a request's
    body (the OpenAI API's own routing key, the same on /v1/embeddings, /v1/rerank and /v1/score; a path
    would tie one endpoint to one model, and two embedding models could not share /v1/embeddings)."""

    backend: str  # HAProxy's backend name
    served_name: str
    kind: str
    backends: tuple[Backend, ...]

    @property
    def paths(self) -> tuple[str, ...]:
        """The paths its kind serves, beyond /v1/models (which the chat model's engines answer)."""
        return tuple(p for p in haproxy.API_PATHS[self.kind] if p != "/v1/models")

    @property
    def check(self) -> tuple[str, str, str]:
        """(method, uri, body) of its health check: its kind's probe (contract/serving.py), as the watchdog and
        the converge's probe ask it."""
        return serving.http_check(self.kind, self.served_name)


@dataclass(frozen=True)
class FrontDoor:
    """What one front door host serves: its settings, the engines behind it and the RAG services' routes."""

    host: str
    settings: Settings
    backends: tuple[Backend, ...]
    api_key: str
    routes: tuple[Route, ...] = ()

    @property
    def tls(self) -> bool:
        return bool(self.settings.front_door_tls_cert)

    @property
    def allowed(self) -> tuple[str, ...]:
        """What a user key reaches: the chat paths, and each RAG route's paths (/health needs no key)."""
        return tuple(sorted({*haproxy.API_PATHS["chat"], *(p for r in self.routes for p in r.paths)}))

    def config(self) -> str:
        return haproxy.config(
            "front-door.haproxy.cfg.j2", LIMITS, s=self.settings, backends=self.backends, tls=self.tls,
            tls_pem=paths.FRONT_DOOR_TLS_PEM, socket=paths.FRONT_DOOR_SOCKET, state_file=paths.FRONT_DOOR_STATE_FILE,
            users_map=paths.FRONT_DOOR_USERS_MAP, backend_map=paths.FRONT_DOOR_BACKEND_MAP,
            backend=BACKEND, check=CHECK, routes=self.routes, allowed=self.allowed,
            chat_check=serving.http_check("chat", self.settings.served_model_name))

    def users_map(self) -> str:
        return "".join(f"{key} {name}\n" for name, key in sorted(self.settings.front_door_users.items()))

    def backend_map(self) -> str:
        return f"{BACKEND} Bearer {self.api_key}\n"

    def tls_pem(self) -> str:
        """The certificate and key from the controller, one PEM (read here, shipped as a 0600 file)."""
        s = self.settings
        parts, problems = [], []
        for key, path in (("front_door_tls_cert", s.front_door_tls_cert), ("front_door_tls_key", s.front_door_tls_key)):
            try:
                parts.append(Path(path).read_text().strip() + "\n")
            except OSError as exc:
                problems.append(f"{self.host}: setting `{key}`: cannot read {path} on the controller "
                                f"({exc.strerror}): give a readable PEM file")
        if problems:
            raise SettingsError(problems)
        return "".join(parts)

    def unit(self) -> str:
        return haproxy.unit(f"front door of {self.settings.served_model_name}", paths.FRONT_DOOR_CONFIG,
                            paths.FRONT_DOOR_RUNTIME_NAME, LIMITS, state_dir=paths.FRONT_DOOR_RUNTIME_NAME,
                            save_state=save_state_command(), replay=replay_command())


def front_door_plan(host: str, plans: dict[str, HostPlan]) -> FrontDoor:
    """The front door on `host`: the backends are every host serving the same served_model_name; of a
    tensor-parallel group only its head (the one API the group serves; a worker runs no engine API).

    Raises SettingsError naming each problem: the backends must be reachable from
    another host (not loopback) and share one api_key, which only the front door
    (and the controller's tooling) then holds; a user key is never that key.
    """
    s = plans[host].settings
    problems = []
    backends = sorted((p for p in plans.values()
                       if p.settings.served_model_name == s.served_model_name and p.role != "worker"),
                      key=lambda p: p.name)
    if not backends:
        problems.append(f"{host}: no host serves {s.served_model_name!r} behind this front door: "
                        "give the group front_door hosts that serve the same served_model_name")
    keys = {p.settings.api_key for p in backends}
    for p in backends:
        if not _SERVER_NAME.fullmatch(p.name):
            problems.append(f"{p.name}: the host name must be letters, digits and _ . : - to be a front door "
                            "backend: rename it in the inventory")
        try:
            haproxy.address(p.lan_address, p.settings.api_port)
        except ValueError as exc:
            problems.append(f"{p.name}: lan_address (or ssh_hostname): {exc}: fix it in the inventory")
        if p.settings.api_is_loopback:
            problems.append(f"{p.name}: api_host {p.settings.api_host} is loopback, out of the front door's reach:"
                            " set api_host to a LAN address (or 0.0.0.0) with an api_key")
        if p.settings.api_key is None:
            problems.append(f"{p.name}: setting `api_key` is missing: behind a front door every engine needs the "
                            "key only the front door holds")
        if p.name == host and s.front_door_port in (p.settings.api_port, engine_port(p.settings.api_port),
                                                    p.settings.peer_port):
            problems.append(f"{host}: setting `front_door_port` = {s.front_door_port} is taken by the engine or "
                            "the model share on this host: pick another port")
    if len(keys) > 1:
        problems.append(f"{host}: the backends of {s.served_model_name!r} have different `api_key`s: the front "
                        "door sends one; set one api_key for them all (e.g. in group_data)")
    users = s.front_door_users
    if len(set(users.values())) < len(users):
        problems.append(f"{host}: setting `front_door_users`: two users share one key: give each their own")
    if keys & set(users.values()):
        problems.append(f"{host}: setting `front_door_users`: a user key equals the backends' api_key: "
                        "clients must never hold the engines' key")
    if bool(s.front_door_tls_cert) != bool(s.front_door_tls_key):
        problems.append(f"{host}: set both `front_door_tls_cert` and `front_door_tls_key`, or neither")
    elif users and not s.front_door_tls_cert and not s.front_door_allow_http:
        problems.append(f"{host}: the front door would take its users' keys over plain http: set "
                        "`front_door_tls_cert` and `front_door_tls_key`, or `front_door_allow_http = True` "
                        "on a trusted LAN")
    routes, kinds = _routes(backends)
    for served in (s.served_model_name, *(r.served_name for r in routes)):
        try:
            haproxy.token(served, "served model name")
        except ValueError as exc:
            problems.append(f"{host}: {exc}: rename it")
    problems += [f"{host}: services named {served!r} behind this front door are of different kinds "
                 f"({' and '.join(sorted(k))}): give each kind its own served_model_name"
                 for served, k in kinds.items() if len(k) > 1]
    if problems:
        raise SettingsError(problems)
    return FrontDoor(host, s, tuple(Backend(p.name, p.lan_address, p.settings.api_port) for p in backends),
                     keys.pop(), routes)


def planned_front_doors(names: list[str], plans: dict[str, HostPlan]) -> list[FrontDoor]:
    """The front doors on `names` as the front door stage builds them from the whole inventory's `plans`, their
    TLS files read as the stage reads them (so `plan` refuses what the converge would); SettingsError names
    every problem of every door."""
    doors, problems = [], []
    for name in names:
        try:
            door = front_door_plan(name, plans)
            if door.tls:
                door.tls_pem()
            doors.append(door)
        except SettingsError as exc:
            problems += exc.problems
    if problems:
        raise SettingsError(problems)
    return doors


def door_summary(door: FrontDoor) -> dict:
    """What `plan` shows of a front door: where it listens, the engines and routes behind it, its users by name
    (never a key), TLS on or off (the files' paths), and the HAProxy config the stage writes (it holds no key)."""
    s = door.settings
    return {"host": door.host, "port": s.front_door_port, "tls": door.tls, "tls_cert": s.front_door_tls_cert,
            "tls_key": s.front_door_tls_key, "users": sorted(s.front_door_users),
            "backends": [{"host": b.name, "target": b.target} for b in door.backends],
            "routes": [{"served_name": r.served_name, "kind": r.kind, "backends": [b.name for b in r.backends]}
                       for r in door.routes],
            "config": door.config()}


def door_rows(summary: dict) -> list[tuple[str, str]]:
    """`plan`'s key/value rows of a front door (door_summary); every value is text, never markup."""
    from sparkfleet.tables import literal

    scheme = "https" if summary["tls"] else "http"
    rows = [("listens", f"{scheme} on port {summary['port']}"),
            ("engines", literal(", ".join(f"{b['host']} ({b['target']})" for b in summary["backends"])))]
    rows += [(f"route {literal(r['served_name'])}", literal(f"{r['kind']}: {', '.join(r['backends'])}"))
             for r in summary["routes"]]
    if summary["users"]:
        rows.append(("users", literal(", ".join(summary["users"]))))
    else:
        rows.append(("users", "[yellow]none[/]: no key opens it; set front_door_users"))
    if summary["tls"]:
        rows.append(("TLS", literal(f"on: certificate {summary['tls_cert']}, key {summary['tls_key']}")))
    elif summary["users"]:
        rows.append(("TLS", "[yellow]off[/]: plain http, the users' keys cross the LAN in clear "
                            "(front_door_allow_http)"))
    else:
        rows.append(("TLS", "off: plain http"))
    return rows


def front_door_hosts(inventory: str) -> list[tuple[str, dict]]:
    """The hosts of the inventory's `front_door` group [(name, merged data)]; none without the group."""
    from sparkfleet.fleet.inventory import load_hosts

    try:
        return load_hosts(inventory, limit=GROUP)
    except (KeyError, FileNotFoundError):  # no front_door group (or no inventory: nothing to drain)
        return []


def _routes(backends: list[HostPlan]) -> tuple[tuple[Route, ...], dict[str, set[str]]]:
    """One route per served name of the RAG services on the front door's hosts, with every host serving it;
    and the kinds seen under each served name (one route serves one kind)."""
    hosts: dict[str, list[Backend]] = {}
    kinds: dict[str, set[str]] = {}
    for p in backends:
        for svc in p.services:
            served = svc.service.served_model_name
            hosts.setdefault(served, []).append(Backend(p.name, p.lan_address, svc.service.api_port))
            kinds.setdefault(served, set()).add(svc.kind)
    routes = tuple(Route(f"model_{n}", served, min(kinds[served]), tuple(found))
                   for n, (served, found) in enumerate(sorted(hosts.items())))
    return routes, kinds


def front_door_url(s: Settings, data: dict) -> str:
    """Where the controller reaches a front door."""
    if s.controller_front_door_url:
        return s.controller_front_door_url.rstrip("/")
    scheme = "https" if s.front_door_tls_cert else "http"
    return f"{scheme}://{data.get('ssh_hostname', '')}:{s.front_door_port}"


# --- HAProxy's runtime API -------------------------------------------------------------------------


_SOCAT = f"socat -t 5 stdio UNIX-CONNECT:{paths.FRONT_DOOR_SOCKET}"  # HAProxy reads one line of commands
_STAT_MARK = "@show-stat"  # between the drain record and HAProxy's table in one answer (states)


def runtime_command(*commands: str) -> str:
    """A shell command sending runtime API commands (one line, `;`-separated) to the front door's socket."""
    return f"echo {shlex.quote('; '.join(commands))} | {_SOCAT}"


def save_state_command() -> str:
    """Save every server's state into HAProxy's server-state file, which a reload or start loads (a drained
    backend's maintenance with it); before each reload, and after a drain or undrain."""
    state = paths.FRONT_DOOR_STATE_FILE
    return f'umask 077 && echo "show servers state" | {_SOCAT} > {state}.new && mv {state}.new {state}'


def replay_command() -> str:
    """The drain record into HAProxy's runtime (every name in it to maintenance): the unit runs it once HAProxy
    serves after a start, so a record survives even a lost server-state file."""
    record = paths.FRONT_DOOR_DRAINED
    return (f'test -s {record} || exit 0; sed -n "/^[A-Za-z0-9]/s|.*|set server {BACKEND}/& state maint|p" '
            f'{record} | paste -sd";" | {_SOCAT}')


def record_command(host: str, drained: bool) -> str:
    """Add `host` to the front door's drain record (drained) or take it off: the new record is written beside
    the old one (root-only) and renamed over it, so a reader sees the old record or the new one."""
    record, name = paths.FRONT_DOOR_DRAINED, shlex.quote(host)
    add = f" echo {name};" if drained else ""
    return (f"umask 077 && {{ grep -vxF -e {name} {record} 2>/dev/null;{add} true; }} > {record}.new "
            f"&& mv -f {record}.new {record}")


def undrain_command(host: str) -> str:
    """Take `host` off the drain record, put it back, and save HAProxy's server state (a later start keeps it in)."""
    ready = runtime_command(f"set server {BACKEND}/{host} state ready")
    return f"{record_command(host, drained=False)} && {ready} && {save_state_command()}"


def ready_command(hosts: list[str]) -> str:
    """Put `hosts` back on a front door, but for those its drain record holds: a `kept NAME` line each."""
    names = " ".join(shlex.quote(h) for h in hosts)
    return (f'c=; for h in {names}; do if grep -qxF -e "$h" {paths.FRONT_DOOR_DRAINED} 2>/dev/null; '
            f'then echo "kept $h"; else c="$c${{c:+; }}set server {BACKEND}/$h state ready"; fi; done; '
            f'[ -z "$c" ] || echo "$c" | {_SOCAT}')


def drained_names(record: str) -> set[str]:
    """The backend names a drain record holds (one a line; anything that is not a server name is skipped)."""
    return {line.strip() for line in record.splitlines() if _SERVER_NAME.fullmatch(line.strip())}


def door_states(answer: str) -> dict[str, dict]:
    """One front door's answer to `states`' command (its drain record, the mark, `show stat`) -> its states."""
    record, _, stat = answer.partition(f"{_STAT_MARK}\n")
    return backend_states(stat, drained_names(record))


def backend_states(show_stat: str, drained: set[str] = frozenset()) -> dict[str, dict]:
    """HAProxy's `show stat` CSV -> {server: {"state": in|out|draining|down|drained, "sessions": n}}.

    in: taking requests; draining: set aside, requests still running; out: set
    aside and idle (or in maintenance); drained: out, and held there by
    `sparkfleet drain` (in `drained`) until undrained; down: failing its health
    check.
    """
    rows = csv.DictReader(io.StringIO(show_stat.lstrip("# ")))
    states = {}
    for row in rows:
        if row.get("pxname") != BACKEND or row.get("svname") in ("BACKEND", "FRONTEND", None):
            continue
        status, sessions = row["status"], int(row["scur"] or 0)
        if "MAINT" in status or "NOLB" in status:
            state = "out"
        elif "DRAIN" in status:
            state = "draining" if sessions else "out"
        else:
            state = "in" if status.startswith("UP") else "down"
        if state == "out" and row["svname"] in drained:
            state = "drained"
        states[row["svname"]] = {"state": state, "sessions": sessions, "status": status}
    return states


class FrontDoorRuntime:
    """The front doors of an inventory, driven over SSH: set backends aside and back, read their state.

    With no `front_door` group every method does nothing: a fleet without a
    front door rolls out as before.
    """

    def __init__(self, inventory: str, doors: list[tuple[str, dict]]):
        self.inventory = inventory
        self.doors = doors  # [(host name, merged data)]
        self.drain_timeout_s = max((parse_settings(name, data).drain_timeout_s for name, data in doors), default=0)

    @classmethod
    def of(cls, inventory: str) -> FrontDoorRuntime:
        return cls(inventory, front_door_hosts(inventory))

    def _run(self, *commands: str) -> dict[str, str | None]:
        """Send runtime commands to every front door; its answer, or None where it did not answer."""
        return self._shell(runtime_command(*commands))

    def _shell(self, command: str) -> dict[str, str | None]:
        """Run a shell command on every front door; its output, or None where it failed or did not answer."""
        if not self.doors:
            return {}
        from pyinfra.api import StringCommand

        from sparkfleet.fleet.converge import connected

        out: dict[str, str | None] = {}
        with connected(self.inventory, [name for name, _ in self.doors]) as (state, hosts):
            for host in hosts:
                if host in state.failed_hosts:
                    out[host.name] = None
                    continue
                ok, output = host.run_shell_command(StringCommand(command), print_output=False)
                out[host.name] = output.stdout if ok else None
        return out

    def states(self) -> dict[str, dict[str, dict] | None]:
        """{front door: {backend: state}} (None: that front door did not answer), its drain record read with it."""
        command = f"cat {paths.FRONT_DOOR_DRAINED} 2>/dev/null; echo {_STAT_MARK}; {runtime_command('show stat')}"
        return {door: None if text is None else door_states(text) for door, text in self._shell(command).items()}

    def drain(self, hosts: list[str], log=print) -> None:
        """Send no new requests to `hosts`, wait (up to drain_timeout_s) for theirs to finish, then take them out."""
        if not self.doors or not hosts:
            return
        timeout_s = self.drain_timeout_s
        self._run(*(f"set server {BACKEND}/{h} state drain" for h in hosts))
        deadline = time.monotonic() + timeout_s
        while True:
            busy = {h for states in self.states().values() if states for h in hosts
                    if states.get(h, {}).get("sessions")}
            if not busy or time.monotonic() >= deadline:
                break
            time.sleep(0.5)
        if busy:
            log(f"front door: {', '.join(sorted(busy))} still had requests after drain_timeout_s={timeout_s:g}")
        self._run(*(f"set server {BACKEND}/{h} state maint" for h in hosts))
        log(f"front door: {', '.join(hosts)} out")

    def ready(self, hosts: list[str], log=print) -> None:
        """Put `hosts` back; each takes requests once its health checks pass. A host `sparkfleet drain` set aside
        stays out (each front door's own record decides, in the same command)."""
        if not self.doors or not hosts:
            return
        answers = self._shell(ready_command(hosts))
        kept = {line[len("kept "):] for text in answers.values() if text for line in text.splitlines()
                if line.startswith("kept ")}
        if kept:
            log(f"front door: {', '.join(sorted(kept))} kept out: drained until `sparkfleet undrain`")
        back = [h for h in hosts if h not in kept]
        if back:
            log(f"front door: {', '.join(back)} back in")


# --- drain and undrain: a backend set aside until undrained ------------------------------------------


class DrainRefused(Exception):
    """Bad input to drain or undrain (no such host, no front door, not a backend): nothing was touched."""


class DoorUnreachable(Exception):
    """A front door did not answer, or did not take a change; the message says what was changed."""


def _checked(inventory: str, host: str) -> FrontDoorRuntime:
    """The inventory's front doors, once each answered and has `host` among its backends; nothing is touched."""
    from sparkfleet.fleet.inventory import load_hosts

    names = [name for name, _ in load_hosts(inventory)]
    if host not in names:
        raise DrainRefused(f"no host named {host!r} in {inventory}: give one of {', '.join(names)}")
    runtime = FrontDoorRuntime.of(inventory)
    if not runtime.doors:
        raise DrainRefused(f"no `{GROUP}` group in {inventory}: drain sets a host aside on the front door; "
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
    states = runtime.states()
    doors = []
    for name, data in runtime.doors:
        s = parse_settings(name, data)
        url = front_door_url(s, data)
        try:
            up = requests.get(url + serving.HEALTH["path"], timeout=serving.HEALTH["timeout_s"],
                              verify=s.controller_front_door_ca or True).status_code == 200
        except requests.RequestException:
            up = False
        doors.append({"host": name, "url": url, "up": up and states.get(name) is not None})
    seen = next((s for s in states.values() if s is not None), {})
    backends = [{"host": host, "state": row["state"]} for host, row in sorted(seen.items())]
    return {"url": doors[0]["url"], "up": all(d["up"] for d in doors), "doors": doors, "backends": backends}


def status_rows(door: dict) -> list[tuple[str, str, str]]:
    """The front door for the status table: (front door or backend, where, state)."""
    colour = {"in": "green", "draining": "yellow", "out": "yellow", "drained": "cyan", "down": "red"}
    return ([(d["host"], d["url"], "[green]up[/]" if d["up"] else "[red]DOWN[/]") for d in door["doors"]]
            + [(f"  {b['host']}", "backend", f"[{colour[b['state']]}]{b['state']}[/]") for b in door["backends"]])


def bench_target(inventory: str, user: str | None = None) -> tuple[str, str, str]:
    """(url, served model, a user's key) of the inventory's first front door, for `bench --front-door`."""
    runtime = FrontDoorRuntime.of(inventory)
    if not runtime.doors:
        raise KeyError(f"no `{GROUP}` group in {inventory}: add one (see inventory/office_front_door.py)")
    name, data = runtime.doors[0]
    s = parse_settings(name, data)
    if not s.front_door_users:
        raise KeyError(f"{name}: setting `front_door_users` is empty: give the front door at least one user")
    user = user or min(s.front_door_users)
    if user not in s.front_door_users:
        raise KeyError(f"{name}: no user {user!r} in front_door_users")
    return front_door_url(s, data), s.served_model_name, s.front_door_users[user]
