"""What counts as serving: one description of the probes, per engine kind.

Each probe says what is asked (method, path, the body beside the served
name), how long an answer may take, and which rule of the host package
(`sparkfleet_host/probes.py` `ANSWERS`, beyond HTTP 200) judges the answer. The health gate, the
converge's probe, the watchdog, the RAG service probe, the front door's check
and `status` all ask these; the converge writes them to the hosts
(paths.SERVING_FILE, with the watchdog's settings), so the helpers there copy
no default. Plain data: JSON as it stands, for hosts and controller alike.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from sparkfleet.contract import engines, paths
from sparkfleet.contract.settings import Settings
from sparkfleet.contract.shared import probes as host_probes  # this module's `probes` is the probes' list

KINDS = ("chat", "embedding", "reranker")  # what an engine serves: a chat model, or a RAG service's kind

# timeout_s bounds a probe of a running engine; gate_timeout_s an engine's first answers after a (re)start.
HEALTH = {"what": "/health", "method": "GET", "path": "/health", "timeout_s": 5, "gate_timeout_s": 5,
          "answer": "status"}
MODELS = {"what": "/v1/models", "method": "GET", "path": "/v1/models", "timeout_s": 5, "gate_timeout_s": 120,
          "answer": "models"}
REQUESTS = {
    "chat": {"what": "1-token chat completion", "method": "POST", "path": "/v1/chat/completions",
             "timeout_s": 10, "gate_timeout_s": 120, "answer": "completion",
             "body": {"messages": [{"role": "user", "content": "ping"}], "max_tokens": 1,
                      "chat_template_kwargs": {"enable_thinking": False}}},
    "embedding": {"what": "two embeddings", "method": "POST", "path": "/v1/embeddings",
                  "timeout_s": 10, "gate_timeout_s": 120, "answer": "embeddings",
                  "body": {"input": ["ping", "pong"]}},
    "reranker": {"what": "a rerank of two documents", "method": "POST", "path": "/v1/rerank",
                 "timeout_s": 10, "gate_timeout_s": 120, "answer": "rerank",
                 "body": {"query": "ping", "documents": ["ping", "pong"]}},
}
# A chat model with enable_auto_tool_choice: its gate also expects one parsed tool call.
TOOL_CALL = {
    "what": "a tool call", "method": "POST", "path": "/v1/chat/completions", "timeout_s": 30,
    "gate_timeout_s": 120, "answer": "tool_call", "tool": "get_weather",
    "body": {"max_tokens": 64, "tool_choice": "auto",
             "messages": [{"role": "user", "content": "What is the weather in Paris? Use the tool."}],
             "tools": [{"type": "function", "function": {
                 "name": "get_weather", "description": "Weather for a city",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                "required": ["city"]}}}]},
}


def probes() -> dict:
    """Every probe by name: health, models, tool_call and one request per kind."""
    return {"health": HEALTH, "models": MODELS, "tool_call": TOOL_CALL, **REQUESTS}


def http_check(kind: str, served_name: str) -> tuple[str, str, str]:
    """(method, path, compact JSON body) of a kind's request: what HAProxy's `http-check send` asks."""
    probe: dict = REQUESTS[kind]
    return probe["method"], probe["path"], json.dumps(host_probes.probe_body(probe, served_name), separators=(",", ":"))


def work_series(engine: str) -> dict:
    """The /metrics series that tell a busy engine's work from a stuck one (issue 54), one list for the guard's
    answer to the door (roles/guard.py `ready_check`) and the watchdog (`watchdog_config`): `busy`, the gauges of
    requests running and queued; `moves`, what moves while it works (tokens, engine steps, the KV cache in use)."""
    m = engines.descriptor(engine).metrics
    return {"busy": (m.running, m.waiting),
            "moves": tuple(s for s in (m.prompt_tokens, m.generation_tokens, m.steps, m.kv_usage) if s)}


def _json(series: dict) -> dict:
    """The series as JSON reads them back (lists): the serving file is compared as it stands."""
    return {what: list(names) for what, names in series.items()}


def watchdog_service(name: str, kind: str, served_name: str, api_port: int, on_demand: bool = False,
                     engine: str = engines.POOLING_ENGINE) -> dict:
    """One more engine the watchdog keeps serving beside the chat model (a service in its own engine unit: the
    pooling engine's, or a chat service's own `engine`), under the same rules, its engine's frozen-listener rule,
    with its own state. An on-demand one is probed on its engine's own port (never its socket, which would start
    it), and its stop is its idle time's, not a failure."""
    return {"name": name, "unit": paths.service_unit(name), "container": paths.service_container(name),
            "port": paths.engine_port(api_port), "kind": kind, "served_name": served_name,
            "state_file": paths.service_watchdog_state(name),
            "silent_listener_frozen": engines.descriptor(engine).silent_listener_frozen,
            "work": _json(work_series(engine)),
            **({"on_demand": True} if on_demand else {})}


def watchdog_config(s: Settings, services: Sequence[dict] = ()) -> dict:
    """The engines the host's watchdog keeps serving and its rules, from the settings: no secret (the key stays
    in engine.env, under `api_key_var`, the engine's own variable: None where it reads none). `services`
    (watchdog_service each) only where the host has some, so a single model's file stays as it was."""
    return {**({"services": list(services)} if services else {}),
        "api_key_var": engines.descriptor(s.engine).key_var,
        "silent_listener_frozen": engines.descriptor(s.engine).silent_listener_frozen,
        "work": _json(work_series(s.engine)),  # a probe timing out on a busy engine whose work moves is no failure
        "unit": paths.UNIT_NAME, "container": s.container_name, "port": paths.engine_port(s.api_port),
        "host": paths.ENGINE_HOST, "kind": "chat",
        "served_name": s.served_model_name, "env_file": paths.ENGINE_ENV, "state_file": paths.WATCHDOG_STATE,
        "enabled": s.watchdog,
        "start_timeout_s": s.start_timeout_s, "interval_s": s.watchdog_interval_s,
        "failures": s.watchdog_failures, "max_restarts": s.watchdog_max_restarts, "window_s": s.watchdog_window_s,
    }


def serving_file(s: Settings, services: Sequence[dict] = ()) -> str:
    """paths.SERVING_FILE's text: the watchdog's settings and, under "probes", every probe."""
    return json.dumps({**watchdog_config(s, services), "probes": probes()}, indent=1, sort_keys=True) + "\n"
