"""The front door: one HAProxy in front of the fleet's engines, built from the inventory.

Its own served_model_name's hosts are the default backend (BACKEND); each other chat model the inventory's
engine hosts serve, whatever their engine (vLLM, SGLang, llama.cpp), gets a backend of its own (chat_N) that
a request reaches by naming it in its body's "model", as a RAG service's does. With more than one chat model
the door answers GET /v1/models itself, listing every served name (no one engine knows the others'); with
one, that model's engines answer it as before. Drain and its record address BACKEND's hosts only.

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

A rollout's drain is held too, by who made it and when (`Hold`, one line per
backend in paths.FRONT_DOOR_HOLDS), and its batch end drops the line. A hold
whose operation is gone (`stale`) is put back by the next converge's front door
stage or rollout: HAProxy routes to it only once its checks pass, and that
host's own converge brings its release to the planned one and gates it.
`status` names every backend out of rotation with what holds it.

Where the front door's host is also a monitoring host, it serves the office status page (Prometheus's console
on loopback) at /status to viewers, HTTP Basic against SHA-256 digests in a 0600 map; nothing else of
Prometheus passes the door.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import shlex
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from sparkfleet.fleet import haproxy
from sparkfleet.contract import monitoring, paths, serving
from sparkfleet.contract.paths import engine_port
from sparkfleet.release.plan import HostPlan
from sparkfleet.contract.settings import Settings, SettingsError, parse_settings

GROUP = monitoring.FRONT_DOOR_GROUP  # the inventory group whose hosts run a front door
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
    """What one front door host serves: its settings, the engines behind it (those of its own served name, the
    default for a request naming no other), the RAG services' routes and the other chat models' routes (each
    the hosts serving that served name, whatever their engine), and the engine hosts it leaves out (why)."""

    host: str
    settings: Settings
    backends: tuple[Backend, ...]
    api_key: str
    routes: tuple[Route, ...] = ()
    status_port: int | None = None  # Prometheus's loopback port where this door offers the status page, else None
    chat_routes: tuple[Route, ...] = ()
    left_out: tuple[tuple[str, str], ...] = ()  # (host, why) of an engine host serving another model, not behind it

    @property
    def served_names(self) -> tuple[str, ...]:
        """Every model a request through this door can name: its own, the other chat models', the RAG services'."""
        return tuple(sorted({self.settings.served_model_name, *(r.served_name for r in self.chat_routes),
                             *(r.served_name for r in self.routes)}))

    def models_answer(self) -> str | None:
        """What the door itself answers to GET /v1/models where it routes more than one chat model (the OpenAI
        list of every served name: no one engine knows the others'), as HAProxy's quoted string; None where one
        chat model's engines answer it, as before."""
        if not self.chat_routes:
            return None
        data = [{"id": name, "object": "model", "owned_by": "sparkfleet"} for name in self.served_names]
        return "'" + json.dumps({"object": "list", "data": data}, separators=(",", ":")) + "'"  # tokens: no quote

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
            backend=BACKEND, check=CHECK, routes=self.routes, allowed=self.allowed, chat_routes=self.chat_routes,
            models_answer=self.models_answer(),
            chat_check=serving.http_check("chat", self.settings.served_model_name),
            limits_map=paths.FRONT_DOOR_LIMITS_MAP, usage=self.usage(), status_page=self.status_page,
            metrics_path=monitoring.FRONT_DOOR_METRICS_PATH)

    def usage(self) -> dict:
        """What the config's usage and fair-share blocks name: the Lua file, the stick table, the metrics path,
        the refusals and the served names a request's model is counted under (any other is _other)."""
        models = self.served_names
        return {"lua": paths.FRONT_DOOR_USAGE_LUA, "table": monitoring.USAGE_TABLE,
                "path": monitoring.USAGE_METRICS_PATH, "rate_429": haproxy.RATE_429,
                "at_once_429": haproxy.AT_ONCE_429, "models": [haproxy.token(m, "served model name") for m in models]}

    @property
    def status_page(self) -> dict | None:
        """What the config needs to serve the office status page (GET FRONT_DOOR_STATUS_PATH to viewers, mapped to
        Prometheus's console on loopback); None where this door does not offer it."""
        if self.status_port is None:
            return None
        return {"path": monitoring.FRONT_DOOR_STATUS_PATH, "console": monitoring.STATUS_PAGE,
                "port": self.status_port, "viewers_map": monitoring.FRONT_DOOR_VIEWERS_MAP}

    def viewers_map(self) -> str:
        """The status page's viewers, one "<name> <SHA-256 of the password, upper-case hex>" a line: HAProxy hashes
        what a browser sends the same way and compares the two digests in constant time (secure_memcmp)."""
        return "".join(f"{name} {viewer_digest(password)}\n"
                       for name, password in sorted(self.settings.front_door_viewers.items()))

    def users_map(self) -> str:
        return "".join(f"{key} {name}\n" for name, key in sorted(self.settings.front_door_keys.items()))

    def limits_map(self) -> str:
        """Each user's limits, "<name> <requests a minute>:<at once>" (0: none), as the fair-share block reads
        them; a user without limits has no line."""
        return "".join(f"{name} {rate or 0}:{at_once or 0}\n"
                       for name, (rate, at_once) in sorted(self.settings.front_door_limits().items())
                       if rate or at_once)

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


def viewer_digest(password: str) -> str:
    """A viewer's password as the viewers map holds it (HAProxy's `digest(sha256),hex` of what a browser sends)."""
    return hashlib.sha256(password.encode()).hexdigest().upper()


def front_door_plan(host: str, plans: dict[str, HostPlan], monitoring_host: bool = False) -> FrontDoor:
    """The front door on `host`: the backends are every host serving the same served_model_name; of a
    tensor-parallel group only its head (the one API the group serves; a worker runs no engine API). Where `host`
    is also a monitoring host and has viewers, the door offers the status page.

    Raises SettingsError naming each problem: the backends must be reachable from
    another host (not loopback) and share one api_key, which only the front door
    (and the controller's tooling) then holds; a user key is never that key.
    """
    s = plans[host].settings
    problems = []
    backends = sorted((p for p in plans.values()
                       if p.settings.served_model_name == s.served_model_name and p.runs_engine),
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
    users = s.front_door_keys
    if len(set(users.values())) < len(users):
        problems.append(f"{host}: setting `front_door_users`: two users share one key: give each their own")
    if keys & set(users.values()):
        problems.append(f"{host}: setting `front_door_users`: a user key equals the backends' api_key: "
                        "clients must never hold the engines' key")
    viewers = s.front_door_viewers
    if keys & set(viewers.values()):
        problems.append(f"{host}: setting `front_door_viewers`: a viewer's password equals the backends' api_key: "
                        "give viewers passwords of their own")
    if set(users.values()) & set(viewers.values()):
        problems.append(f"{host}: setting `front_door_viewers`: a viewer's password equals a user's key: give "
                        "viewers passwords of their own")
    if monitoring_host and viewers and s.monitoring_port == s.front_door_port:
        problems.append(f"{host}: setting `monitoring_port` = {s.monitoring_port} is the front door's port: "
                        "pick another port")
    if viewers and monitoring_host and not s.front_door_tls_cert and not s.front_door_allow_http:
        problems.append(f"{host}: the status page would take its viewers' passwords over plain http: set "
                        "`front_door_tls_cert` and `front_door_tls_key`, or `front_door_allow_http = True` "
                        "on a trusted LAN")
    if bool(s.front_door_tls_cert) != bool(s.front_door_tls_key):
        problems.append(f"{host}: set both `front_door_tls_cert` and `front_door_tls_key`, or neither")
    elif users and not s.front_door_tls_cert and not s.front_door_allow_http:
        problems.append(f"{host}: the front door would take its users' keys over plain http: set "
                        "`front_door_tls_cert` and `front_door_tls_key`, or `front_door_allow_http = True` "
                        "on a trusted LAN")
    routes, kinds = _routes(backends)
    chat_routes, left_out = _chat_routes(s.served_model_name, plans, keys)
    for served in (s.served_model_name, *(r.served_name for r in routes), *(r.served_name for r in chat_routes)):
        try:
            haproxy.token(served, "served model name")
        except ValueError as exc:
            problems.append(f"{host}: {exc}: rename it")
    problems += [f"{host}: services named {served!r} behind this front door are of different kinds "
                 f"({' and '.join(sorted(k))}): give each kind its own served_model_name"
                 for served, k in kinds.items() if len(k) > 1]
    problems += [f"{host}: {r.served_name!r} is served by a chat engine ({', '.join(b.name for b in r.backends)}) "
                 "and a RAG service behind this front door: give each its own served_model_name"
                 for r in chat_routes if r.served_name in kinds]
    if problems:
        raise SettingsError(problems)
    return FrontDoor(host, s, tuple(Backend(p.name, p.lan_address, p.settings.api_port) for p in backends),
                     keys.pop(), routes, s.monitoring_port if monitoring_host and viewers else None,
                     chat_routes, left_out)


def planned_front_doors(names: list[str], plans: dict[str, HostPlan],
                        monitoring_hosts: frozenset[str] = frozenset()) -> list[FrontDoor]:
    """The front doors on `names` as the front door stage builds them from the whole inventory's `plans` (those
    in `monitoring_hosts` with the status page), their TLS files read as the stage reads them (so `plan` refuses
    what the converge would); SettingsError names every problem of every door."""
    doors, problems = [], []
    for name in names:
        try:
            door = front_door_plan(name, plans, name in monitoring_hosts)
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
            "limits": {name: {"requests_per_minute": rate, "max_concurrent": at_once}
                       for name, (rate, at_once) in sorted(s.front_door_limits().items()) if rate or at_once},
            "status_page": door.status_page is not None, "viewers": sorted(s.front_door_viewers),
            "backends": [{"host": b.name, "target": b.target} for b in door.backends],
            "routes": [{"served_name": r.served_name, "kind": r.kind, "backends": [b.name for b in r.backends]}
                       for r in (*door.chat_routes, *door.routes)],
            "models": list(door.served_names), "left_out": [{"host": h, "why": why} for h, why in door.left_out],
            "config": door.config()}


def door_rows(summary: dict) -> list[tuple[str, str]]:
    """`plan`'s key/value rows of a front door (door_summary); every value is text, never markup."""
    from sparkfleet.tables import literal

    scheme = "https" if summary["tls"] else "http"
    rows = [("listens", f"{scheme} on port {summary['port']}"),
            ("engines", literal(", ".join(f"{b['host']} ({b['target']})" for b in summary["backends"])))]
    rows += [(f"route {literal(r['served_name'])}", literal(f"{r['kind']}: {', '.join(r['backends'])}"))
             for r in summary["routes"]]
    rows += [(f"not behind it: {literal(o['host'])}", literal(o["why"])) for o in summary.get("left_out", ())]
    if summary["users"]:
        rows.append(("users", literal(", ".join(summary["users"]))))
    else:
        rows.append(("users", "[yellow]none[/]: no key opens it; set front_door_users"))
    if summary.get("limits"):
        rows.append(("limits", literal(", ".join(
            f"{name} " + " and ".join(part for part in (
                f"{lim['requests_per_minute']} a minute" if lim["requests_per_minute"] else "",
                f"{lim['max_concurrent']} at once" if lim["max_concurrent"] else "") if part)
            for name, lim in summary["limits"].items()))))
    if summary.get("status_page"):
        viewers = ", ".join(summary["viewers"])
        rows.append(("status page", literal(f"{monitoring.FRONT_DOOR_STATUS_PATH} for {viewers}")))
    if summary["tls"]:
        rows.append(("TLS", literal(f"on: certificate {summary['tls_cert']}, key {summary['tls_key']}")))
    elif summary["users"]:
        rows.append(("TLS", "[yellow]off[/]: plain http, the users' keys cross the LAN in clear "
                            "(front_door_allow_http)"))
    else:
        rows.append(("TLS", "off: plain http"))
    return rows


def front_door_hosts(inventory: str, group: str = GROUP) -> list[tuple[str, dict]]:
    """The hosts of the inventory's `front_door` group (or `group`) [(name, merged data)]; none without it."""
    from sparkfleet.fleet.inventory import load_hosts

    try:
        return load_hosts(inventory, limit=group)
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


def _address_ok(address: str, port: int) -> bool:
    try:
        haproxy.address(address, port)
    except ValueError:
        return False
    return True


def _chat_routes(own: str, plans: dict[str, HostPlan],
                 keys: set) -> tuple[tuple[Route, ...], tuple[tuple[str, str], ...]]:
    """One route per other chat model the inventory's engine hosts serve (a served_model_name not the door's own),
    by the body's "model" as the RAG routes are, with every host serving it that the door reaches with its one
    key; and the engine hosts it cannot take, with why (plan shows them: none is dropped unsaid). A host serving
    another model is not refused here: it may well be meant for another door, or for no door."""
    hosts: dict[str, list[Backend]] = {}
    left = []
    for p in sorted(plans.values(), key=lambda p: p.name):
        served = p.settings.served_model_name
        if not p.runs_engine or served == own:
            continue
        why = ("its api_host is loopback" if p.settings.api_is_loopback
               else "it has no api_key" if p.settings.api_key is None
               else "its api_key is not the one this door sends" if p.settings.api_key not in keys
               else "its name is not one HAProxy takes" if not _SERVER_NAME.fullmatch(p.name)
               else None if _address_ok(p.lan_address, p.settings.api_port)
               else "its lan_address is not one HAProxy takes")
        if why:
            left.append((p.name, f"{served}: {why}"))
        else:
            hosts.setdefault(served, []).append(Backend(p.name, p.lan_address, p.settings.api_port))
    routes = tuple(Route(f"chat_{n}", served, "chat", tuple(found))
                   for n, (served, found) in enumerate(sorted(hosts.items())))
    return routes, tuple(left)


def front_door_url(s: Settings, data: dict) -> str:
    """Where the controller reaches a front door."""
    if s.controller_front_door_url:
        return s.controller_front_door_url.rstrip("/")
    scheme = "https" if s.front_door_tls_cert else "http"
    return f"{scheme}://{data.get('ssh_hostname', '')}:{s.front_door_port}"


# --- holds: who set a backend aside for a change, and whether that operation still runs ----------------


OPERATIONS = ("rollout", "rollback", "upgrade")  # the operations that hold a backend out while they change its host
# Another controller's process cannot be asked: its hold counts as gone once older than this. A batch's drain,
# deploy (its model download included) and gate take far less; a hold this old is a controller that died.
HOLD_MAX_AGE_S = 6 * 3600
_HOLD_LINE = re.compile(f"(?P<backend>{_SERVER_NAME.pattern}) (?P<operation>" + "|".join(OPERATIONS)
                        + r") (?P<controller>[A-Za-z0-9][A-Za-z0-9_.-]{0,252}) (?P<pid>[0-9]{1,10}) "
                        r"(?P<started>[0-9]{1,20}) (?P<since>[0-9]{1,12})")


@dataclass(frozen=True)
class Hold:
    """A backend set aside by an operation: which, on which controller, by which process (its pid and its start
    time, which tell a reused pid apart), since when (epoch seconds)."""

    backend: str
    operation: str
    controller: str
    pid: int
    started: int  # the process's start time in clock ticks after boot (/proc/PID/stat), 0 where unknown
    since: int

    def line(self) -> str:
        """Its line on the hold record (parse_holds reads it back)."""
        line = f"{self.backend} {self.operation} {self.controller} {self.pid} {self.started} {self.since}"
        if not _HOLD_LINE.fullmatch(line):
            raise ValueError(f"not a hold: {line!r}")
        return line

    def holder(self) -> dict:
        """Who holds it, for status: the operation, controller, pid and since (UTC)."""
        return {"operation": self.operation, "controller": self.controller, "pid": self.pid,
                "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.since))}


def parse_holds(record: str) -> dict[str, Hold]:
    """{backend: its hold} from a hold record read back from a front door: a line that is not a hold is skipped
    (data, never run); of two lines for one backend the later counts, as hold_command writes it."""
    holds = {}
    for line in record.splitlines():
        found = _HOLD_LINE.fullmatch(line.strip())
        if found:
            f = found.groupdict()
            holds[f["backend"]] = Hold(f["backend"], f["operation"], f["controller"], int(f["pid"]), int(f["started"]),
                                       int(f["since"]))
    return holds


def controller_name() -> str:
    """This controller's host name as a hold names it (anything outside its grammar becomes `_`)."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())[:253] or "controller"
    return name if name[0].isalnum() else f"c{name[:252]}"


def process_start(pid: int) -> int | None:
    """A process's start time (clock ticks after boot, field 22 of /proc/PID/stat); None when no such process
    runs, 0 where /proc cannot tell (not Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return 0
    except OSError:
        return 0
    fields = stat.rpartition(")")[2].split()
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else 0


def this_hold(backend: str, operation: str) -> Hold:
    """The hold this process makes on `backend` now."""
    pid = os.getpid()
    return Hold(backend, operation, controller_name(), pid, process_start(pid) or 0, int(time.time()))


def stale(hold: Hold, controller: str, now: float, start_of=None, max_age_s: float = HOLD_MAX_AGE_S) -> bool:
    """Whether the operation that made `hold` is gone: on this controller, its pid runs no more as the same
    process (another start time, asked of `start_of`, process_start by default; where the start time is unknown,
    a running pid counts as the same); on another, the hold is older than `max_age_s` (HOLD_MAX_AGE_S)."""
    if hold.controller != controller:
        return now - hold.since > max_age_s
    start = (start_of or process_start)(hold.pid)
    return start is None or bool(start and hold.started and start != hold.started)


def stale_holds(record: str | None, controller: str, now: float, start_of=None) -> list[Hold]:
    """The holds of a hold record (None: none) whose operation is gone, by backend name."""
    holds = parse_holds(record or "")
    return [h for _, h in sorted(holds.items()) if stale(h, controller, now, start_of)]


def out_of_rotation(states: dict[str, dict], controller: str, now: float, start_of=None) -> list[dict]:
    """Every backend out of rotation (set aside, draining, drained) in a front door's `states` (door_states),
    with why and whether something live holds it: a maintenance drain holds it; so does a live operation's hold;
    a gone operation's hold, or no record at all, does not."""
    found = []
    for name, row in sorted(states.items()):
        if row["state"] not in ("out", "draining", "drained"):
            continue
        hold = row.get("hold")
        if row["state"] == "drained" or row.get("recorded"):  # drained, or on its way out (draining)
            why, held = "maintenance drain: until `sparkfleet undrain`", True
        elif hold is None:
            why, held = "out with no record: nothing holds it", False
        else:
            who = hold.holder()
            held = not stale(hold, controller, now, start_of)
            by = f"{hold.operation} pid {hold.pid} on controller {hold.controller} since {who['since']}"
            why = f"held by {by}" if held else f"held by a {hold.operation} that is gone ({by})"
        found.append({"host": name, "state": row["state"], "reason": why, "held": held,
                      "holder": hold.holder() if hold else None})
    return found


# --- HAProxy's runtime API -------------------------------------------------------------------------


_SOCAT = f"socat -t 5 stdio UNIX-CONNECT:{paths.FRONT_DOOR_SOCKET}"  # HAProxy reads one line of commands
_STAT_MARK = "@show-stat"  # between the records and HAProxy's table in one answer (states)
_HOLDS_MARK = "@holds"  # between the drain record and the holds in that answer


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


def _rewrite_command(record: str, kept: str, added: list[str] = ()) -> str:
    """`record` rewritten as the lines `kept` prints (a missing record prints none) and then `added`: written
    beside the old one (root-only) and renamed over it, so a reader sees the old record or the new one."""
    add = f" printf '%s\\n' {' '.join(shlex.quote(line) for line in added)};" if added else ""
    return f"umask 077 && {{ {kept} 2>/dev/null;{add} true; }} > {record}.new && mv -f {record}.new {record}"


def record_command(host: str, drained: bool) -> str:
    """Add `host` to the front door's drain record (drained) or take it off."""
    name = shlex.quote(host)
    return _rewrite_command(paths.FRONT_DOOR_DRAINED, f"grep -vxF -e {name} {paths.FRONT_DOOR_DRAINED}",
                            [host] if drained else [])


def undrain_command(host: str) -> str:
    """Take `host` off the drain record, put it back, and save HAProxy's server state (a later start keeps it in)."""
    ready = runtime_command(f"set server {BACKEND}/{host} state ready")
    return f"{record_command(host, drained=False)} && {ready} && {save_state_command()}"


def _ready_script(names: str) -> str:
    """Put the servers `names` expands to back, but for those the drain record holds: a `kept NAME` line each."""
    return (f'c=; for h in {names}; do if grep -qxF -e "$h" {paths.FRONT_DOOR_DRAINED} 2>/dev/null; '
            f'then echo "kept $h"; else c="$c${{c:+; }}set server {BACKEND}/$h state ready"; fi; done; '
            f'[ -z "$c" ] || echo "$c" | {_SOCAT}')


def ready_command(hosts: list[str]) -> str:
    """Put `hosts` back on a front door, but for those its drain record holds: a `kept NAME` line each."""
    return _ready_script(" ".join(shlex.quote(h) for h in hosts))


def _holds_without(names: str) -> str:
    """A command printing the hold record's lines but those of the backends `names` (one shell word expanding
    to names, space-separated): a line's first field is its backend."""
    return ("awk 'BEGIN { n = split(ARGV[1], d, \" \"); for (i = 1; i <= n; i++) drop[d[i]] = 1; ARGV[1] = \"\" } "
            f"!($1 in drop)' {names} {paths.FRONT_DOOR_HOLDS}")


def _drop_holds(names: str) -> str:
    """The holds of the backends `names` (as `_holds_without`) taken off the hold record."""
    return _rewrite_command(paths.FRONT_DOOR_HOLDS, _holds_without(names))


def hold_command(holds: list[Hold]) -> str:
    """Write `holds` on a front door's hold record, each replacing its backend's older line."""
    names = shlex.quote(" ".join(h.backend for h in holds))
    return _rewrite_command(paths.FRONT_DOOR_HOLDS, _holds_without(names), [h.line() for h in holds])


def back_command(hosts: list[str]) -> str:
    """A batch's end: `hosts` back (ready_command), then their holds dropped; a failed ready keeps the holds."""
    return f"{{ {ready_command(hosts)}; }} && {_drop_holds(shlex.quote(' '.join(hosts)))}"


def put_back_command(holds: list[Hold]) -> str:
    """Put back the backends of these (stale) holds on a front door that still has each very line (a newer hold,
    or none, leaves the backend be), then drop those lines; the drain record still keeps its hosts out."""
    lines, found = " ".join(shlex.quote(h.line()) for h in holds), '"$n"'
    return (f'n=; for l in {lines}; do grep -qxF -e "$l" {paths.FRONT_DOOR_HOLDS} 2>/dev/null && n="$n ${{l%% *}}"; '
            f'done; if [ -n "$n" ]; then {{ {_ready_script("$n")}; }} && {_drop_holds(found)}; fi')


def drained_names(record: str) -> set[str]:
    """The backend names a drain record holds (one a line; anything that is not a server name is skipped)."""
    return {line.strip() for line in record.splitlines() if _SERVER_NAME.fullmatch(line.strip())}


def states_command() -> str:
    """What `states` asks a front door: its drain record, its holds, HAProxy's `show stat`, between marks."""
    return (f"cat {paths.FRONT_DOOR_DRAINED} 2>/dev/null; echo {_HOLDS_MARK}; cat {paths.FRONT_DOOR_HOLDS} "
            f"2>/dev/null; echo {_STAT_MARK}; {runtime_command('show stat')}")


def door_states(answer: str) -> dict[str, dict]:
    """One front door's answer to `states_command` -> its states, each with whether the drain record holds it
    ("recorded") and its hold ("hold": a Hold or None)."""
    records, _, stat = answer.partition(f"{_STAT_MARK}\n")
    record, _, held = records.partition(f"{_HOLDS_MARK}\n")
    holds, drained = parse_holds(held), drained_names(record)
    return {name: {**row, "recorded": name in drained, "hold": holds.get(name)}
            for name, row in backend_states(stat, drained).items()}


def backend_states(show_stat: str, drained: set[str] = frozenset()) -> dict[str, dict]:
    """HAProxy's `show stat` CSV -> {server: {"state": in|out|draining|down|drained, "sessions": n}}, of BACKEND's
    servers only: drain and its record address `BACKEND/host`, so another chat model's route (chat_N) is not
    listed, and `sparkfleet drain` refuses its hosts rather than claim a drain it cannot make.

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
        return {door: None if text is None else door_states(text)
                for door, text in self._shell(states_command()).items()}

    def drain(self, hosts: list[str], log=print, operation: str | None = None) -> None:
        """Send no new requests to `hosts`, wait (up to drain_timeout_s) for theirs to finish, then take them out.
        For an `operation` (a rollout's), each is held first, by this process (this_hold), in the same command."""
        if not self.doors or not hosts:
            return
        timeout_s = self.drain_timeout_s
        drain = runtime_command(*(f"set server {BACKEND}/{h} state drain" for h in hosts))
        self._shell(f"{hold_command([this_hold(h, operation) for h in hosts])} && {drain}" if operation else drain)
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
        """Put `hosts` back, their holds dropped; each takes requests once its health checks pass. A host
        `sparkfleet drain` set aside stays out (each front door's own record decides, in the same command)."""
        if not self.doors or not hosts:
            return
        self._put_back(back_command(hosts), hosts, log)

    def put_back_stale(self, log=print) -> list[str]:
        """Put back every backend held by an operation that is gone (stale), on each front door that still holds
        it so; the names put back (a rollout's first step)."""
        if not self.doors:
            return []
        now, controller = time.time(), controller_name()
        found = {row["hold"] for states in self.states().values() if states for row in states.values()
                 if row["hold"] and stale(row["hold"], controller, now)}
        names = sorted({h.backend for h in found})
        if names:
            log(f"front door: {', '.join(names)} held by an operation that is gone: putting back")
            self._put_back(put_back_command(sorted(found, key=Hold.line)), names, log)
        return names

    def _put_back(self, command: str, hosts: list[str], log) -> None:
        answers = self._shell(command)
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
    return {"url": doors[0]["url"], "up": all(d["up"] for d in doors), "doors": doors, "backends": backends,
            "out_of_rotation": out_of_rotation(seen, controller_name(), time.time())}


def door_ok(door: dict) -> bool:
    """`status`'s rule for a front door: every front door answers, and nothing is out of rotation that nothing
    live holds (a maintenance drain and a running rollout's hold are held; a gone one's, or none, is not)."""
    return door["up"] and all(b["held"] for b in door.get("out_of_rotation", ()))


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

    return ([(d["host"], d["url"], "[green]up[/]" if d["up"] else "[red]DOWN[/]") for d in door["doors"]]
            + [(f"  {b['host']}", "backend", state(b)) for b in door["backends"]])


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
    return front_door_url(s, data), s.served_model_name, s.front_door_users[user].key
