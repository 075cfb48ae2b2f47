"""The guard: one HAProxy on every host in front of its engines, which listen on loopback only.

vLLM's key guards only /v1/*: on the LAN its /metrics, /tokenize, /invocations, /pooling (and the stand-in's
/rerank, /score) answer anyone. The guard answers where the API is meant to be (api_host:api_port, and each
RAG service's api_port), lets /health through with no key, wants the backend key (checked against a 0600 map,
never written in the config) on every other path, and passes only the paths the engine serves to the fleet;
anything else is 404 before the engine is asked, and no body is read before that.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass

from sparkfleet import FILES_DIR
from sparkfleet.roles import chat_ui, haproxy, pki
from sparkfleet.roles.desired import DesiredState, Directory, File, Packages, Unit, desired, secret
from sparkfleet.contract import monitoring, paths, serving
from sparkfleet.release.plan import HostPlan
from sparkfleet.contract.settings import SettingsError

KEY_NAME = "engines"
KEY_USER = "backend"  # what the log names a caller holding the backend key
# A guard buffers nothing (HAProxy's default 16 KiB buffers); its callers are the front doors and the controller.
LIMITS = haproxy.Limits(maxconn=500, bufsize=16384, memory_max="128M")
# A front door's check of a chat engine (issue 54; docs/front-door.md, "A sick engine"): the guard answers it
# (files/sparkfleet-ready.lua) from the engine's own /metrics, so that a busy engine is judged by its work, never by
# a probe waiting its turn behind colleagues' long prompts. Busy, it is ready while a series of its work (tokens,
# steps, the KV cache in use) moved within READY window; idle, while it answers the one-token chat probe.
READY_PATH = "/sparkfleet/ready"
# The window: the expected time to first token of one engine step's prefill at the planned context. A working engine
# moves a series at every step, and its longest step prefills at most one chunk of prompt: vLLM's API server's
# default budget on a GPU of 70 GiB and more, a Spark's 128 GB included (vllm/engine/arg_utils.py
# `get_batch_defaults`: max_num_batched_tokens 8,192; llama.cpp's batch, 2,048, is under it), at a Spark's prefill
# rate (2,000 tokens/s: sim/engine/standin_vllm.py cites the measurements), and a margin of two checks.
STEP_TOKENS = 8192
PREFILL_TOKENS_PER_S = 2000
READY_MARGIN_S = 2


@dataclass(frozen=True)
class Listener:
    """One engine behind the guard: where the LAN asks it, where it answers, the paths it serves."""

    name: str
    kind: str
    bind: str
    engine: str
    paths: tuple[str, ...]
    node_metrics: bool = False  # also answers NODE_METRICS_PATH (the node exporter on loopback): the first one
    on_demand: dict | None = None  # an on-demand model: {"served_name", "max_waiting", "wait_s"} (its socket's hold)
    ready: dict | None = None  # a chat engine always on: what its READY_PATH reads (`ready_check`)


@dataclass(frozen=True)
class Guard:
    host: str
    listeners: tuple[Listener, ...]
    api_key: str | None
    tls: bool = False  # TLS only, a client certificate of the fleet CA required (the fleet has a backend hop)
    chat_ui: dict | None = None  # the chat UI on this host: {"bind", "local" (its socket), "header"} (roles/chat_ui.py)

    def config(self) -> str:
        tls = {"cert": paths.TLS_HOST_CERT, "ca": paths.TLS_CA} if self.tls else None
        stats = paths.GUARD_STATS_SOCKET if any(listener.on_demand for listener in self.listeners) else None
        ready = ({"lua": paths.GUARD_READY_LUA, "path": READY_PATH} if self.ready else None)
        return haproxy.config("guard.haproxy.cfg.j2", LIMITS, host=self.host, listeners=self.listeners, tls=tls,
                              ready=ready,
                              stats=stats, on_demand_errors=on_demand_errors, chat_ui=self.chat_ui,
                              keyed=self.api_key is not None, key_map=paths.GUARD_KEY_MAP, key_name=KEY_NAME,
                              key_user=KEY_USER, node_metrics=monitoring.NODE_METRICS_PATH,
                              node_exporter=haproxy.address(paths.ENGINE_HOST, monitoring.NODE_EXPORTER_PORT))

    @property
    def ready(self) -> bool:
        """Whether a listener answers READY_PATH (the guard then loads files/sparkfleet-ready.lua)."""
        return any(listener.ready for listener in self.listeners)

    def key_map(self) -> str:
        return f"{KEY_NAME} Bearer {self.api_key}\n" if self.api_key is not None else ""

    def unit(self) -> str:
        return haproxy.unit(f"guard of {self.host}'s engines", paths.GUARD_CONFIG, paths.GUARD_RUNTIME_NAME, LIMITS)


def on_demand_errors(served_name: str, wait_s: int) -> dict[int, str]:
    """What a client of an on-demand model reads when its start fails (502), outlasts the hold (504), or the hold is
    full (503), in the OpenAI API's error shape."""
    def error(code: int, message: str) -> str:
        return "'" + json.dumps({"error": {"message": message, "type": "ServiceUnavailableError", "code": code}},
                                separators=(",", ":")) + "'"
    return {502: error(502, f"model {served_name} did not start: see `sparkfleet status`"),
            503: error(503, f"model {served_name} is starting and holds as many requests as it may: retry shortly"),
            504: error(504, f"model {served_name} did not answer within {wait_s} s of its start: see `sparkfleet "
                            f"status`")}


def ready_window_s(max_model_len: int | None) -> int:
    """Seconds a busy engine may leave every series of its work still before its check fails: one step's prefill
    (STEP_TOKENS, or the whole planned context where it is shorter) at PREFILL_TOKENS_PER_S, and the margin."""
    tokens = min(max_model_len or STEP_TOKENS, STEP_TOKENS)
    return math.ceil(tokens / PREFILL_TOKENS_PER_S) + READY_MARGIN_S


def ready_check(engine: str, served_name: str, max_model_len: int | None) -> dict:
    """What a chat engine's READY_PATH reads: its chat probe (contract/serving.py: path, and body in base64, which
    HAProxy decodes), its /metrics series of requests in flight (`busy`) and of work (`moves`: tokens, steps, the
    KV cache in use: contract/serving.py `work_series`, which the watchdog reads too), and the window."""
    _, path, body = serving.http_check("chat", haproxy.token(served_name, "served_model_name"))
    return {"path": path, "probe": base64.b64encode(body.encode()).decode(), **serving.work_series(engine),
            "window_s": ready_window_s(max_model_len)}


def chat_ui_listener(plan: HostPlan) -> dict:
    """What the guard of the chat UI's host adds: its LAN port, Open WebUI's unix socket as HAProxy reaches it after
    its chroot (it connects from there: the path in the chroot), the door's header."""
    s = plan.settings
    return {"bind": haproxy.address(s.api_host, s.chat_ui_host_port),
            "local": f"unix@{paths.CHAT_UI_SOCKET.removeprefix(paths.HAPROXY_CHROOT)}",
            "header": chat_ui.DOOR_HEADER}


def guard_plan(plan: HostPlan, runs_chat_ui: bool = False) -> Guard | None:
    """The guard of one host: the chat engine (a single host or a group's head; a worker runs no engine API)
    and each RAG service. None when the host runs no engine at all. Its first listener, the API port, also
    answers the node exporter's metrics (503 until the node_metrics stage runs one): the same guard with or
    without a monitoring host, so adding one changes no guard.

    Raises SettingsError when api_host is not an address HAProxy can bind (the settings grammar already
    refuses one; this is where it lands)."""
    s = plan.settings
    engines = ([("chat", "chat", s.api_port, None)] if plan.runs_engine else []) + [
        (f"service_{svc.name}", svc.kind, svc.service.api_port, svc) for svc in plan.services]
    if not engines:
        return None
    try:
        listeners = tuple(
            Listener(name, kind, haproxy.address(s.api_host, port),
                     haproxy.address(paths.ON_DEMAND_HOST if svc and svc.on_demand else paths.ENGINE_HOST,
                                     paths.engine_port(port)),
                     (*haproxy.API_PATHS[kind], haproxy.METRICS), n == 0,
                     {"served_name": haproxy.token(svc.service.served_model_name, "served_model_name"),
                      "max_waiting": s.on_demand_max_waiting, "wait_s": s.health_timeout_s}
                     if svc and svc.on_demand else None,
                     None if kind != "chat" or (svc and svc.on_demand) else
                     ready_check(plan.engine.descriptor.name, s.served_model_name, s.max_model_len) if svc is None
                     else ready_check(svc.engine.descriptor.name, str(svc.service.served_model_name),
                                      svc.service.max_model_len))
            for n, (name, kind, port, svc) in enumerate(engines))
    except ValueError as exc:
        raise SettingsError([f"{plan.name}: setting `api_host`: {exc}"]) from None
    return Guard(plan.name, listeners, s.api_key, plan.backend_tls,
                 chat_ui_listener(plan) if runs_chat_ui and s.api_key else None)


def guard_state(plan: HostPlan, runs_chat_ui: bool = False) -> DesiredState:
    """What the guard stage ensures on one host: Debian's HAProxy installed (the front door runs it too) with
    Debian's own unit off, and the guard (its config, its 0600 key map, its unit) running; off on a host that runs
    no engine. A change of rules, key or this host's TLS files (`pki.TLS_FILES`, which tasks/tls.py puts first) is a
    reload (connections in flight finish); a changed unit is a restart. SettingsError as `guard_plan`."""
    wanted = guard_plan(plan, runs_chat_ui)
    tls = pki.TLS_FILES if plan.backend_tls else ()
    haproxy_itself = (Packages("HAProxy installed", ("haproxy",)),
                      Unit("haproxy.service", "Debian's own haproxy.service off (sparkfleet runs its own units)",
                           running=False, enabled=False))
    if wanted is None:
        return desired(haproxy_itself, Unit(paths.GUARD_UNIT_NAME, "Guard off (this host runs no engine)",
                                            running=False, enabled=False), after=tls)
    return desired(
        haproxy_itself,
        Directory(paths.GUARD_DIR, "Guard config directory (root-only)", mode="0700"),
        File(paths.GUARD_CONFIG, "Guard config", content=wanted.config()),
        secret(paths.GUARD_KEY_MAP, "Guard's backend key (root-only)", wanted.key_map()),
        *((File(paths.GUARD_READY_LUA, "Guard's answer to a door's check (Lua)",
                src=str(FILES_DIR / "sparkfleet-ready.lua")),) if wanted.ready else ()),
        File(paths.GUARD_UNIT_PATH, "Guard unit", content=wanted.unit()),
        Unit(paths.GUARD_UNIT_NAME, "Guard enabled and running", restart_on=(paths.GUARD_UNIT_PATH,),
             reload_on=(paths.GUARD_CONFIG, paths.GUARD_KEY_MAP, *((paths.GUARD_READY_LUA,) if wanted.ready else ()),
                        *tls), daemon_reload_on=(paths.GUARD_UNIT_PATH,)),
        after=tls)
