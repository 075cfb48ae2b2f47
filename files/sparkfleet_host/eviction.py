"""Least-recently-used eviction of on-demand engines, before an engine unit starts.

What it evicts: only the engines the memory plan marks "on_demand" (a model whose systemd socket starts its
proxy, and through it its engine, at the first request; idle, the proxy exits and the engine stops), never an
always-on engine, never the unit starting. Why: the planner fits each on-demand engine beside every always-on one,
not all of them at once (contract/formats.py `memory_plan`: the always-on shares and the largest on-demand one
within the budget), so a start may find the running shares and its own past the budget. Then the on-demand
engine asked longest ago is stopped (its next request starts it again through its socket), then the next, until
the start fits. "Longest ago" is the guard's own count, HAProxy's `lastsess` of each engine's listener in `show
stat`, asked through the guard's stats socket (the plan's `guard_stats`); one never asked since the guard started
goes first. `status` reads the same figures (`python3 sparkfleet_host last-requests SOCKET`, cli.py).

The minimum residency (the plan's `min_resident_s`, the setting `on_demand_min_resident_s`): an engine a client
asked through the guard since it started, and that has served for less (counted from its proxy's start, which
waits for the engine's first answer), is passed over (`resident`). Where only such engines would make room, the
start waits until the first of them has served its residency (its requests stay held: the guard holds them, the
socket keeps them), then stops it; so two models asked in turn swap at most once per residency, not on every
request. A wait past what the guard holds a request (the plan's `start.wait_s`, health_timeout_s) is not begun:
the start fails at once with one line saying why (its client reads 502). Not protected: an engine only the
converge's gate started (it asks the socket, never the guard: a converge of several on-demand models does not wait
on itself), and one systemd gives no times for (a failed reading never keeps an engine forever).
Called by sparkfleet-memcheck (`make_room`); the budget rule is memory.py's `within_budget`.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from sparkfleet_host.memory import within_budget


@dataclass(frozen=True)
class OnDemand:
    """What the memory plan says of its on-demand engines (empty for a plan without any, or one that is absent or
    not the planner's shape; a plan from before the residency: none)."""

    listeners: dict  # {unit: its guard's listener}
    proxies: dict  # {unit: its proxy's unit}, where the plan names it
    stats: str | None = None  # the guard's stats socket that says when each was last asked
    min_resident_s: float = 0  # how long one serves before another's start may stop it
    wait_s: float = 0  # the longest a start waits for a residency to end (what the guard holds a request)


def read_on_demand(path) -> OnDemand:
    try:
        plan = json.loads(Path(path).read_text())
        rows = {str(row["unit"]): row for row in plan["shares"].values() if row.get("on_demand")}
        if not rows:
            return OnDemand({}, {})
        return OnDemand({unit: f"service_{name}" for name, row in plan["shares"].items() if row.get("on_demand")
                         for unit in [str(row["unit"])]},
                        {unit: str(row["proxy"]) for unit, row in rows.items() if row.get("proxy")},
                        str(plan["guard_stats"]), max(0.0, float(plan.get("min_resident_s", 0))),
                        max(0.0, float(plan.get("start", {}).get("wait_s", 0))))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return OnDemand({}, {})


def on_demand_units(path) -> tuple[dict[str, str], str | None]:
    """({unit: its guard's listener} of the memory plan's on-demand engines (rows with "on_demand"), the guard's
    stats socket that says when each was last asked); ({}, None) for a plan without any, or one that is absent or
    not the planner's shape."""
    found = read_on_demand(path)
    return found.listeners, found.stats


def last_requests(stat_csv: str) -> dict[str, float | None]:
    """{listener: seconds since its engine's last request (None: none since the guard started)} from the guard's
    `show stat` (HAProxy's CSV: its own header names the columns; lastsess -1 or empty is none)."""
    lines = stat_csv.strip().splitlines()
    if not lines or not lines[0].startswith("# "):
        return {}
    header = lines[0][2:].split(",")
    found = {}
    for line in lines[1:]:
        row = dict(zip(header, line.split(","), strict=False))
        if row.get("svname") == "engine" and row.get("pxname"):
            seconds = row.get("lastsess", "")
            found[row["pxname"]] = float(seconds) if seconds.isdigit() else None
    return found


def ask_stats(socket_path: str, timeout: float = 5) -> str:
    """The guard's `show stat` through its stats socket ("" when it cannot be asked)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(socket_path)
            sock.sendall(b"show stat\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


def least_recently_used(candidates, listeners: dict[str, str], stats_csv: str) -> list:
    """The on-demand units in the order they are stopped for room: the longest since a request first (one never
    asked since the guard started, first of all)."""
    since = last_requests(stats_csv)
    return sorted(candidates, key=lambda u: -(since.get(listeners[u]) if since.get(listeners[u]) is not None
                                               else float("inf")))


TIMES = ("InactiveExitTimestampMonotonic", "ActiveEnterTimestampMonotonic")  # its start began; it became active
SLACK_S = 1  # the guard's lastsess is whole seconds: a request this much before the start still started it


def unit_times(unit: str) -> dict[str, float]:
    """Of TIMES, those systemd gives for `unit`, in monotonic seconds (CLOCK_MONOTONIC, time.monotonic's); a time
    that is 0 (never) or no number is left out."""
    try:
        out = subprocess.run(["systemctl", "show", *(f"--property={name}" for name in TIMES), "--", unit],
                             capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return {}
    found = {}
    for line in (out.stdout or "").splitlines() if out.returncode == 0 else ():
        key, _, value = line.partition("=")
        if key in TIMES and value.isdigit() and 0 < int(value) < 2**63:
            found[key] = int(value) / 1e6
    return found


def resident(unit: str, proxy: str | None, last_request: float | None) -> float | None:
    """Seconds the running on-demand `unit` has served, where the minimum residency protects it: a client asked it
    through the guard since its start began (`last_request`, the guard's seconds since the last one, is no older
    than that start: the request that started it counts), so an engine only the converge's gate started (it asks
    the socket, not the guard) or that systemd gives no times for is not protected (None). Served: since its proxy
    became active (it waits for the engine's first answer), or since the engine did where the proxy's time is older
    (a previous run's) or unknown."""
    engine = unit_times(unit)
    if last_request is None or len(engine) < len(TIMES):
        return None
    now = time.monotonic()
    if last_request > now - engine[TIMES[0]] + SLACK_S:
        return None
    answered = unit_times(proxy).get(TIMES[1], 0.0) if proxy else 0.0
    return max(0.0, now - max(engine[TIMES[1]], answered))


def still_active(units: list[str]) -> set[str]:
    """Which of `units` are active now (all of them where systemctl does not answer: they hold their memory)."""
    try:
        out = subprocess.run(["systemctl", "is-active", *units], capture_output=True, text=True, timeout=30,
                             check=False).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return set(units)
    return {u for u, state in zip(units, out, strict=False) if state == "active"}


def make_room(plan_file, unit: str | None, running: dict[str, float], share: float, budget: float,
              log=print) -> dict[str, float]:
    """Stop running on-demand engines, least recently used first, until `share` fits beside the rest; never an
    always-on one, nor `unit` (the one starting), nor one that has served less than the plan's minimum residency:
    where only those would make room, wait (the clock: `time`) until the first of them has served it, at most the
    plan's start wait. `log` hears one line per engine stopped and per wait (or why none is begun). Returns {unit:
    share} of what is still running."""
    plan = read_on_demand(plan_file)
    starting = unit or "this unit"
    waited = 0.0
    while True:
        candidates = [u for u in running if u in plan.listeners and u != unit]
        stats = ask_stats(plan.stats) if candidates else ""
        asked = last_requests(stats)
        young: dict[str, float] = {}
        for victim in least_recently_used(candidates, plan.listeners, stats):
            if within_budget([*running.values(), share], budget)[1]:
                return running
            served = (resident(victim, plan.proxies.get(victim), asked.get(plan.listeners[victim]))
                      if plan.min_resident_s else None)
            if served is not None and served < plan.min_resident_s:
                young[victim] = served
                continue
            log(f"stopping {victim} (on demand, the least recently used) to make room for {starting}")
            subprocess.run(["systemctl", "stop", victim], capture_output=True, timeout=120, check=False)
            running = {u: s for u, s in running.items() if u != victim}
        if within_budget([*running.values(), share], budget)[1] or not young:
            return running
        if not within_budget([*(s for u, s in running.items() if u not in young), share], budget)[1]:
            return running  # their going would not make room either: no use waiting (the start fails)
        first = max(young, key=lambda u: young[u])  # whose residency ends first
        wait = plan.min_resident_s - young[first]
        why = (f"{first} has served for {young[first]:.0f} s and stays at least {plan.min_resident_s:g} s "
               "(on_demand_min_resident_s)")
        if waited + wait > plan.wait_s:
            log(f"{starting} cannot start for {wait:.0f} s: {why}, longer than a request is held "
                f"({plan.wait_s:g} s): retry later")
            return running
        log(f"{starting} waits {wait:.0f} s: {why}")
        time.sleep(wait)
        waited += wait
        active = still_active(list(running))
        running = {u: s for u, s in running.items() if u in active}
