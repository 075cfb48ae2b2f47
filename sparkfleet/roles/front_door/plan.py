"""The front door's plan: what one front door host serves, built from the inventory's plans, and the files its
stage writes (config, unit, maps).

Its own served_model_name's hosts are the default backend (runtime.BACKEND); each other chat model the
inventory's engine hosts serve, whatever their engine (vLLM, SGLang, llama.cpp), gets a backend of its own
(chat_N) that a request reaches by naming it in its body's "model", as a RAG service's does. With more than one
chat model the door answers GET /v1/models itself, listing every served name (no one engine knows the others');
with one, that model's engines answer it as before. Drain and its record address BACKEND's hosts only.

Where the front door's host is also a monitoring host, it serves the office status page (Prometheus's console
on loopback) at /status to viewers, HTTP Basic against SHA-256 digests in a 0600 map; nothing else of
Prometheus passes the door.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from sparkfleet.contract import monitoring, paths, serving
from sparkfleet.contract.paths import engine_port
from sparkfleet.contract.settings import Settings, SettingsError
from sparkfleet.roles import chat_ui, guard, haproxy
from sparkfleet.roles.chat_ui import ChatUi
from sparkfleet.roles.front_door.address import DoorSet, door_set
from sparkfleet.roles.front_door.records import BACKEND, CHAT_ROUTE, replay_command, save_state_command
from sparkfleet.release.plan import HostPlan

# Bytes of a request HAProxy reads to name its conversation: enough for the first two messages (a system
# prompt of ~60k tokens); the rest of a longer body need not fit. Two such buffers per connection: 500
# connections (far more requests than the engines behind it run at once) stay within 256 MiB.
BUFSIZE = 256 * 1024
LIMITS = haproxy.Limits(maxconn=500, bufsize=BUFSIZE, memory_max="512M")
# Checks of a chat engine ask its guard (roles/guard.py READY_PATH: busy, ready while its work moves; idle, while it
# answers the chat probe): a frozen or hung one is out within ~5 s (two failed checks, each the guard's 2 s wait for
# its /metrics, `timeout check` above it), a busy one never; back after two good ones.
# Live traffic counts too (observe layer7): three answers in a row that are errors (5xx, a broken or missing answer)
# are one failed check and the next failed check marks the engine down (sudden-death); an engine whose check
# still passes stays in, so one caller's failing requests never take a healthy engine out.
CHECK = {"inter": "1s", "fastinter": "500ms", "fall": 2, "rise": 2, "timeout": "3s", "error_limit": 3,
         "on_error": "sudden-death"}
# front_door_routing = "bounded": consistent hashing with bounded loads. An engine takes a new request while it
# holds at most 175 % of the average in flight (HAProxy's hash-balance-factor: ceil((in flight + 1) x 1.75), shared
# by weight; its manual: "reasonable values are from 125 to 200"). KubeAI's 125 is for hundreds in flight; an office
# has a few to a dozen over three Sparks, where 125 leaves one request of slack and moves a turn in most bursts
# (tests/unit/test_door_failover.py, 12 conversations in step: 125 kept 2-3 of 12 on their engine, 150 6-9, 175
# 8-11 with the busiest engine at 44-52 % of 48 requests, 200 11 but 54-56 %, near the 60 % asked).
HASH_BALANCE_FACTOR = 175


@dataclass(frozen=True)
class Backend:
    name: str  # the inventory host name, which is HAProxy's server name
    address: str
    port: int
    tls: bool = False  # the guard serves TLS: the door verifies its certificate names `name` (roles/pki.py)

    @property
    def target(self) -> str:
        """`address:port` of its `server` line (the host's guard)."""
        return haproxy.address(self.address, self.port)

    @property
    def verifyhost(self) -> str:
        """What its `server` line adds over TLS: the name the guard's certificate must hold (its inventory name)."""
        return f" verifyhost {self.name}" if self.tls else ""

    @property
    def server_id(self) -> int:
        """Its `server` line's id, from its name alone: consistent hashing places a server on the ring by its id,
        so every door maps a key to the same engine (HAProxy's manual: "all servers have the exact same IDs"), and
        a host added or removed moves no other host's keys (ids by position would shift)."""
        return server_id(self.name)


@dataclass(frozen=True)
class Route:
    """A RAG service's model behind the front door: the hosts serving it, found by the `model` of a request's
    body (the OpenAI API's own routing key, the same on /v1/embeddings, /v1/rerank and /v1/score; a path
    would tie one endpoint to one model, and two embedding models could not share /v1/embeddings)."""

    backend: str  # HAProxy's backend name
    served_name: str
    kind: str
    backends: tuple[Backend, ...]
    on_demand: bool = False  # started by its first request on some host: its guard answers the check itself

    @property
    def paths(self) -> tuple[str, ...]:
        """The paths its kind serves, beyond /v1/models (which the chat model's engines answer)."""
        return tuple(p for p in haproxy.API_PATHS[self.kind] if p != "/v1/models")

    @property
    def check(self) -> tuple[str, str, str]:
        """(method, uri, body) of its health check: its kind's probe (contract/serving.py), as the watchdog and
        the converge's probe ask it. An on-demand model's is its guard's /health, which the guard answers without
        asking the engine: a check every few seconds would keep it from ever idling (or start it)."""
        if self.on_demand:
            return "GET", serving.HEALTH["path"], ""
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
    doors: DoorSet | None = None  # the inventory's doors where they share a table or an address (address.py)
    backend_tls: bool = False  # the guards serve TLS: each server line presents this host's certificate
    chat_ui: ChatUi | None = None  # the inventory's chat UI, which this door lets people into (roles/chat_ui.py)

    @property
    def peers(self) -> dict | None:
        """The config's peers section (two or more doors: the usage table shared), else None."""
        return self.doors.peers(self.host) if self.doors else None

    @property
    def served_names(self) -> tuple[str, ...]:
        """Every model a request through this door can name: its own, the other chat models', the RAG services'."""
        return tuple(sorted({self.settings.served_model_name, *(r.served_name for r in self.chat_routes),
                             *(r.served_name for r in self.routes)}))

    def models_answer(self) -> str | None:
        """What the door itself answers to GET /v1/models where it routes more than one model (the OpenAI list of
        every served name: the other chat models', a chat model's or a RAG service's beside it on a Spark; no one
        engine knows the others'), as HAProxy's quoted string; None where one model's engines answer it, as
        before."""
        if len(self.served_names) < 2:
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
            chat_check=("GET", guard.READY_PATH, ""),
            limits_map=paths.FRONT_DOOR_LIMITS_MAP, usage=self.usage(), status_page=self.status_page,
            metrics_path=monitoring.FRONT_DOOR_METRICS_PATH, peers=self.peers,
            server_tls=server_tls(self.settings, self.backend_tls), chat_ui=self.chat_ui_config(),
            routing=routing(self.settings))

    def chat_ui_config(self) -> dict | None:
        """What the config's chat UI blocks name (its frontend, the API's token check), else None."""
        ui = self.chat_ui
        if ui is None:
            return None
        return {"host": ui.host, "port": self.settings.chat_ui_port, "target": ui.target,
                "verifyhost": f" verifyhost {ui.host}" if ui.tls else "", "ui_user": chat_ui.UI_USER,
                "jwt_header": chat_ui.JWT_HEADER, "jwt_key": f'"${{{chat_ui.JWT_ENV}}}"',
                "users_map": paths.FRONT_DOOR_CHAT_UI_USERS, "email_header": chat_ui.EMAIL_HEADER,
                "name_header": chat_ui.NAME_HEADER, "role_header": chat_ui.ROLE_HEADER,
                "door_header": chat_ui.DOOR_HEADER, "domain": chat_ui.EMAIL_DOMAIN, "cookie": chat_ui.COOKIE,
                "login": chat_ui.LOGIN_PATH, "logout": chat_ui.LOGOUT_PATH, "page": paths.FRONT_DOOR_LOGIN_PAGE,
                "health": chat_ui.HEALTH}

    def chat_ui_users_map(self) -> str:
        """Who a token Open WebUI signed may name: the door's users, by their accounts' addresses."""
        return chat_ui.users_map(list(self.settings.front_door_users))

    def secrets_config(self) -> str | None:
        """The 0600 file HAProxy reads before the config (the chat UI's signing secret), else None."""
        return chat_ui.door_secrets(self.api_key) if self.chat_ui else None

    def usage(self) -> dict:
        """What the config's usage and fair-share blocks name: the Lua file, the stick table, the metrics path,
        the refusals and the served names a request's model is counted under (any other is _other)."""
        models = self.served_names
        return {"lua": paths.FRONT_DOOR_USAGE_LUA, "table": monitoring.USAGE_TABLE,
                "snapshot": paths.FRONT_DOOR_USAGE_SNAPSHOT,
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
        """"<key> <user>" lines; with a chat UI, its own key too (under a name no user can have)."""
        ui = f"{chat_ui.ui_key(self.api_key)} {chat_ui.UI_USER}\n" if self.chat_ui else ""
        return "".join(f"{key} {name}\n" for name, key in sorted(self.settings.front_door_keys.items())) + ui

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
                            save_state=save_state_command(), replay=replay_command(), save_usage=usage_save_command(),
                            secrets=paths.FRONT_DOOR_SECRETS if self.chat_ui else None)


def server_id(name: str) -> int:
    """A server's id (1 .. 2**30) from its name: the first 30 bits of its SHA-256, plus one."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big") % (1 << 30) + 1


def routing(s: Settings) -> dict:
    """What the chat backends' routing block names: the mode (front_door_routing) and the bound's factor."""
    return {"mode": s.front_door_routing, "balance_factor": HASH_BALANCE_FACTOR}


def usage_save_command() -> str:
    """The usage snapshot's writer (files/sparkfleet-usage-save) with the door's socket and snapshot."""
    return f"{paths.USAGE_SAVE} {paths.FRONT_DOOR_SOCKET} {paths.FRONT_DOOR_USAGE_SNAPSHOT}"


def usage_save_units() -> tuple[str, str]:
    """The usage snapshot's service and timer (every paths.USAGE_SNAPSHOT_S)."""
    from sparkfleet.release import render

    t = render._templates
    return (t.get_template("sparkfleet-usage-save.service.j2").render(
                front_door_unit=paths.FRONT_DOOR_UNIT_NAME, helper=paths.USAGE_SAVE, socket=paths.FRONT_DOOR_SOCKET,
                snapshot=paths.FRONT_DOOR_USAGE_SNAPSHOT),
            t.get_template("sparkfleet-usage-save.timer.j2").render(interval_s=paths.USAGE_SNAPSHOT_S))


def server_tls(s: Settings, tls: bool) -> str:
    """What every `default-server` line of a door adds where the guards serve TLS: TLS to the guard (its health
    checks too: HAProxy sends them over the server's own TLS), the guard's chain verified against the fleet CA, and
    this host's certificate presented as the client's (its key loaded from beside it)."""
    return f" {haproxy.fleet_tls()}" if tls else ""


def viewer_digest(password: str) -> str:
    """A viewer's password as the viewers map holds it (HAProxy's `digest(sha256),hex` of what a browser sends)."""
    return hashlib.sha256(password.encode()).hexdigest().upper()


def front_door_plan(host: str, plans: dict[str, HostPlan], monitoring_host: bool = False,
                    doors: DoorSet | None = None, ui: ChatUi | None = None) -> FrontDoor:
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
        if not haproxy.SERVER_NAME.fullmatch(p.name):
            problems.append(f"{p.name}: the host name must be letters, digits and _ . : - to be a front door "
                            "backend: rename it in the inventory")
        try:
            haproxy.address(p.lan_address, p.settings.api_port)
        except ValueError as exc:
            problems.append(f"{p.name}: lan_address (or ssh_hostname, or the host's name): {exc}: "
                            "fix it in the inventory")
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
    problems += [f"{host}: hosts {a.name} and {b.name} would share one server id on the front door "
                 f"({server_id(a.name)}): rename one" for i, a in enumerate(backends) for b in backends[i + 1:]
                 if server_id(a.name) == server_id(b.name)]
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
                 "and a service behind this front door: give each its own served_model_name"
                 for r in chat_routes if r.served_name in kinds]
    problems += [f"{host}: {r.served_name!r} is this front door's own model and a service's "
                 f"({', '.join(b.name for b in r.backends)}): give the service its own served_model_name"
                 for r in routes if r.served_name == s.served_model_name]
    if ui:
        problems += chat_ui.door_problems(host, s, ui)
        if ui.settings.api_key not in keys:
            problems.append(f"{host}: the chat UI's host {ui.host} has another `api_key` than this door's engines: "
                            "set one api_key for them all")
    if problems:
        raise SettingsError(problems)
    tls = plans[host].backend_tls
    return FrontDoor(host, s, tuple(Backend(p.name, p.lan_address, p.settings.api_port, tls) for p in backends),
                     keys.pop(), routes, s.monitoring_port if monitoring_host and viewers else None,
                     chat_routes, left_out, doors, tls, ui)


def planned_front_doors(names: list[str], plans: dict[str, HostPlan],
                        monitoring_hosts: frozenset[str] = frozenset(), ui: ChatUi | None = None) -> list[FrontDoor]:
    """The front doors on `names` as the front door stage builds them from the whole inventory's `plans` (those
    in `monitoring_hosts` with the status page; `ui`: the chat UI behind them), their TLS files read as the stage
    reads them (so `plan` refuses what the converge would); SettingsError names every problem of every door."""
    doors, problems = [], []
    try:
        shared = door_set(names, plans)
    except SettingsError as exc:
        problems, shared = list(exc.problems), None
    for name in names:
        try:
            door = front_door_plan(name, plans, name in monitoring_hosts, shared, ui)
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
            "address": str(door.doors.address) if door.doors and door.doors.address else None,
            "peers": list(door.doors.names) if door.peers else [],
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
    if summary.get("address"):
        rows.append(("floating address", literal(f"{summary['address']} (keepalived), shared by "
                                                 f"{', '.join(summary['peers'])}")))
    elif summary.get("peers"):
        rows.append(("shared usage table", literal(", ".join(summary["peers"]))))
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



def _routes(backends: list[HostPlan]) -> tuple[tuple[Route, ...], dict[str, set[str]]]:
    """One route per served name of the RAG services on the front door's hosts, with every host serving it;
    and the kinds seen under each served name (one route serves one kind)."""
    hosts: dict[str, list[Backend]] = {}
    kinds: dict[str, set[str]] = {}
    on_demand: set[str] = set()
    for p in backends:
        for svc in p.services:
            served = svc.service.served_model_name
            hosts.setdefault(served, []).append(Backend(p.name, p.lan_address, svc.service.api_port, p.backend_tls))
            kinds.setdefault(served, set()).add(svc.kind)
            if svc.on_demand:
                on_demand.add(served)
    routes = tuple(Route(f"model_{n}", served, min(kinds[served]), tuple(found), served in on_demand)
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
               else "its name is not one HAProxy takes" if not haproxy.SERVER_NAME.fullmatch(p.name)
               else None if _address_ok(p.lan_address, p.settings.api_port)
               else "its lan_address is not one HAProxy takes")
        if why:
            left.append((p.name, f"{served}: {why}"))
        else:
            hosts.setdefault(served, []).append(Backend(p.name, p.lan_address, p.settings.api_port, p.backend_tls))
    routes = tuple(Route(f"{CHAT_ROUTE}{n}", served, "chat", tuple(found))
                   for n, (served, found) in enumerate(sorted(hosts.items())))
    return routes, tuple(left)
