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
Called by sparkfleet-memcheck (`make_room`); the budget rule is memory.py's `within_budget`.
"""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

from sparkfleet_host.memory import within_budget


def on_demand_units(path) -> tuple[dict[str, str], str | None]:
    """({unit: its guard's listener} of the memory plan's on-demand engines (rows with "on_demand"), the guard's
    stats socket that says when each was last asked); ({}, None) for a plan without any, or one that is absent or
    not the planner's shape."""
    try:
        plan = json.loads(Path(path).read_text())
        units = {str(row["unit"]): f"service_{name}" for name, row in plan["shares"].items() if row.get("on_demand")}
        return units, (str(plan["guard_stats"]) if units else None)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}, None


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


def make_room(plan_file, unit: str | None, running: dict[str, float], share: float, budget: float,
              log=print) -> dict[str, float]:
    """Stop running on-demand engines, least recently used first, until `share` fits beside the rest; never an
    always-on one, nor `unit` (the one starting). `log` hears one line per engine stopped. Returns {unit: share}
    of what is still running."""
    listeners, stats = on_demand_units(plan_file)
    candidates = [u for u in running if u in listeners and u != unit]
    for victim in least_recently_used(candidates, listeners, ask_stats(stats) if candidates else ""):
        if within_budget([*running.values(), share], budget)[1]:
            break
        log(f"stopping {victim} (on demand, the least recently used) to make room for {unit or 'this unit'}")
        subprocess.run(["systemctl", "stop", victim], capture_output=True, timeout=120, check=False)
        running = {u: s for u, s in running.items() if u != victim}
    return running
