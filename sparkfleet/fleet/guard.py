"""The guard: one HAProxy on every host in front of its engines, which listen on loopback only.

vLLM's key guards only /v1/*: on the LAN its /metrics, /tokenize, /invocations, /pooling (and the stand-in's
/rerank, /score) answer anyone. The guard answers where the API is meant to be (api_host:api_port, and each
RAG service's api_port), lets /health through with no key, wants the backend key (checked against a 0600 map,
never written in the config) on every other path, and passes only the paths the engine serves to the fleet;
anything else is 404 before the engine is asked, and no body is read before that.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkfleet.fleet import haproxy
from sparkfleet.contract import monitoring, paths
from sparkfleet.release.plan import HostPlan
from sparkfleet.contract.settings import SettingsError

KEY_NAME = "engines"
KEY_USER = "backend"  # what the log names a caller holding the backend key
# A guard buffers nothing (HAProxy's default 16 KiB buffers); its callers are the front doors and the controller.
LIMITS = haproxy.Limits(maxconn=500, bufsize=16384, memory_max="128M")


@dataclass(frozen=True)
class Listener:
    """One engine behind the guard: where the LAN asks it, where it answers, the paths it serves."""

    name: str
    kind: str
    bind: str
    engine: str
    paths: tuple[str, ...]
    node_metrics: bool = False  # also answers NODE_METRICS_PATH (the node exporter on loopback): the first one


@dataclass(frozen=True)
class Guard:
    host: str
    listeners: tuple[Listener, ...]
    api_key: str | None
    tls: bool = False  # TLS only, a client certificate of the fleet CA required (the fleet has a backend hop)

    def config(self) -> str:
        tls = {"cert": paths.TLS_HOST_CERT, "ca": paths.TLS_CA} if self.tls else None
        return haproxy.config("guard.haproxy.cfg.j2", LIMITS, host=self.host, listeners=self.listeners, tls=tls,
                              keyed=self.api_key is not None, key_map=paths.GUARD_KEY_MAP, key_name=KEY_NAME,
                              key_user=KEY_USER, node_metrics=monitoring.NODE_METRICS_PATH,
                              node_exporter=haproxy.address(paths.ENGINE_HOST, monitoring.NODE_EXPORTER_PORT))

    def key_map(self) -> str:
        return f"{KEY_NAME} Bearer {self.api_key}\n" if self.api_key is not None else ""

    def unit(self) -> str:
        return haproxy.unit(f"guard of {self.host}'s engines", paths.GUARD_CONFIG, paths.GUARD_RUNTIME_NAME, LIMITS)


def guard_plan(plan: HostPlan) -> Guard | None:
    """The guard of one host: the chat engine (a single host or a group's head; a worker runs no engine API)
    and each RAG service. None when the host runs no engine at all. Its first listener, the API port, also
    answers the node exporter's metrics (503 until the node_metrics stage runs one): the same guard with or
    without a monitoring host, so adding one changes no guard.

    Raises SettingsError when api_host is not an address HAProxy can bind (the settings grammar already
    refuses one; this is where it lands)."""
    s = plan.settings
    engines = ([("chat", "chat", s.api_port)] if plan.runs_engine else []) + [
        (f"service_{svc.name}", svc.kind, svc.service.api_port) for svc in plan.services]
    if not engines:
        return None
    try:
        listeners = tuple(
            Listener(name, kind, haproxy.address(s.api_host, port),
                     haproxy.address(paths.ENGINE_HOST, paths.engine_port(port)),
                     (*haproxy.API_PATHS[kind], haproxy.METRICS), n == 0)
            for n, (name, kind, port) in enumerate(engines))
    except ValueError as exc:
        raise SettingsError([f"{plan.name}: setting `api_host`: {exc}"]) from None
    return Guard(plan.name, listeners, s.api_key, plan.backend_tls)
