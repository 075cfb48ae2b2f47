"""The format of each file sparkfleet writes on a host and reads back, with one owner each.

The env files (engine.env, hub.env) and the memory plan are read by the host helpers too, so their rules
live in the host package (files/sparkfleet_host/: envfiles.py renders, parses and edits them for a
rollback; memory.py holds the budget rule) and the controller takes them from here. The release record's
keys are release/plan.py's `release_record`, checked when read back by host/facts.py `RELEASE_KEYS`; the
watchdog's state is files/sparkfleet-watchdog's own (no other reader).
"""

from __future__ import annotations

import json

from sparkfleet.contract import engines, paths
from sparkfleet.contract.shared import envfiles, memory

# engine.env's API key variables: each engine's own (contract/engines.py `key_var`), which the helpers and the
# rollback's edit (host/operations.py env_command) learn from the serving file (contract/serving.py `api_key_var`)
API_KEY_VARS = engines.KEY_VARS
DEFAULT_KEY_VAR = engines.descriptor(engines.DEFAULT_ENGINE).key_var
HUB_TOKEN_VARS = ("HF_TOKEN", "MODELSCOPE_API_TOKEN")  # hub.env: what the official clients read
ENGINE_ENV_HEADER = "Managed by sparkfleet. Root-only: read by `docker run --env-file`."
HUB_ENV_HEADER = "Managed by sparkfleet. Root-only: read by sparkfleet-fetch."
parse_env = envfiles.parse_env
within_budget = memory.within_budget


def engine_env(api_key: str | None, env: dict[str, str], key_var: str | None = DEFAULT_KEY_VAR,
               also: tuple[str, ...] = ()) -> str:
    """engine.env: the API key when one is set and the engine reads one (under `key_var`, the name it reads; None:
    no key line; then under `also`, the names the host's services' other engines read: they share this file), then
    every other variable by name (case-insensitively)."""
    for var in (key_var, *also):
        if var is not None and var not in API_KEY_VARS:
            raise ValueError(f"{var} is not an engine's API key variable ({', '.join(API_KEY_VARS)})")
    for var in API_KEY_VARS:
        if var in env:
            raise ValueError(f"{var} is written from the `api_key` setting, not from the environment")
    head = {var: api_key for var in (key_var, *also) if var} if api_key else {}
    by_name = dict(sorted(env.items(), key=lambda item: item[0].lower()))  # the order the old template wrote
    return envfiles.render_env(ENGINE_ENV_HEADER, {**head, **by_name})


def hub_env(hub_token: str | None) -> str:
    """hub.env: the hub token under each official client's name (nothing when no token is set)."""
    return envfiles.render_env(HUB_ENV_HEADER, dict.fromkeys(HUB_TOKEN_VARS, hub_token) if hub_token else {})


def host_memory_bytes(host_memory_gb: float) -> int:
    """The host's memory in bytes, as the fit and the memory plan count it (the setting is decimal GB)."""
    return int(host_memory_gb * 1e9)


def memory_plan(budget: float, memory_bytes: int, shares: dict[str, tuple[str, float, int]], wait_s: int,
                on_demand: frozenset[str] = frozenset(), min_resident_s: int = 0) -> dict:
    """The host's one memory plan: the budget, each engine's unit, share, bytes and loopback port (by name: "chat",
    each service), the most they hold at once and whether it fits, and the order its engines start in. The planner
    refuses one that does not fit, `plan` prints it, and sparkfleet-memcheck reads it from paths.MEMORY_PLAN
    (read_memory_plan): a unit's start waits up to `wait_s` for each engine before it in `start.order` that is
    loading to answer (start_before), so two engines never race for the unified memory.

    The engines named in `on_demand` run only while asked: they must each fit beside every always-on engine, not
    beside each other (the start check stops the least recently used one first), so the most held at once is the
    always-on shares and the largest on-demand one; they start after every always-on engine. Each serves at least
    `min_resident_s` (counted from its proxy's start: its first answer) before another's start may stop it
    (files/sparkfleet_host/eviction.py)."""
    always = [share for name, (_, share, _) in shares.items() if name not in on_demand]
    largest = max((share for name, (_, share, _) in shares.items() if name in on_demand), default=None)
    total, fits = within_budget([*always, *([largest] if largest is not None else [])], budget)
    order = sorted(shares, key=lambda name: name in on_demand)
    return {"budget": budget, "total": total, "fits": fits,
            **({"guard_stats": paths.GUARD_STATS_SOCKET, "min_resident_s": min_resident_s} if on_demand else {}),
            "shares": {name: {"unit": unit, "share": share, "bytes": int(share * memory_bytes), "engine_port": port,
                              **({"on_demand": True, "proxy": paths.on_demand_proxy(name)} if name in on_demand
                                 else {})}
                       for name, (unit, share, port) in shares.items()},
            "start": {"order": [shares[name][0] for name in order], "wait_s": wait_s,
                      "serving": paths.SERVING_FILE}}


def memory_plan_json(plan: dict) -> str:
    """The memory plan file's bytes (sorted keys: the same plan, the same file)."""
    return json.dumps(plan, indent=1, sort_keys=True) + "\n"
