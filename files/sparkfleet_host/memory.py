"""The memory plan (its path: contract/paths.py MEMORY_PLAN): written by the converge as the planner made it,
read by sparkfleet-memcheck before an engine unit starts. The budget rule the planner and the pre-start check
both apply (`within_budget`), the plan's shares, and its start order (who waits for whom, `start_before`).
Which on-demand engine makes room for another: eviction.py.
"""

from __future__ import annotations

import json
from pathlib import Path


def within_budget(shares, budget: float) -> tuple[float, bool]:
    """(the shares' sum, whether it fits the budget): the one rule the planner and the pre-start check apply."""
    total = round(sum(shares), 6)
    return total, total <= budget + 1e-9


def read_memory_plan(path) -> tuple[float, dict] | None:
    """(budget, {unit: share}) of a memory plan file; None when it is absent or not the planner's shape."""
    try:
        plan = json.loads(Path(path).read_text())
        return float(plan["budget"]), {str(row["unit"]): float(row["share"]) for row in plan["shares"].values()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def start_before(path, unit: str) -> tuple[list[tuple[str, int]], float, str | None]:
    """([(unit, engine port)] of the engines that start before `unit` in the memory plan's order, how long to wait
    for them, the serving file that says what answering is): on unified memory two engines loading at once race for
    the same bytes (each sees the other's half-made allocations as free), so each waits for those before it.
    ([], 0, None) for a unit not in the plan or a plan without a start order (an older release's)."""
    try:
        plan = json.loads(Path(path).read_text())
        start, ports = plan["start"], {str(r["unit"]): int(r["engine_port"]) for r in plan["shares"].values()}
        order = [str(u) for u in start["order"]]
        if unit not in order:
            return [], 0, None
        return ([(u, ports[u]) for u in order[:order.index(unit)]], float(start["wait_s"]), str(start["serving"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return [], 0, None


def own_unit(cgroup_text: str) -> str | None:
    """The systemd service a process runs in, from its /proc/<pid>/cgroup (v2 `0::/system.slice/x.service`, v1's
    name=systemd line): an ExecStartPre runs in its unit's cgroup."""
    for line in cgroup_text.splitlines():
        for part in reversed(line.split(":", 2)[-1].split("/")):
            if part.endswith(".service"):
                return part
    return None
