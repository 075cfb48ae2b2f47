"""How long does a converge of the simulated fleet take, and how many SSH commands does a no-op one send a host?

    flock /tmp/sparkfleet-e2e.lock python tools/bench_converge.py [--hosts 3,6,10] [--runs 5] [--idle-s 30]
                                                                  [--throttle-bps N] [--skip-first] [--json]
                                                                  [--against CHECKOUT]

For each fleet size N: `python -m sim up --hosts N`, a first converge from bare hosts (`sim down` first, the hub
throttled to --throttle-bps), then --runs no-op converges (the median is reported), then one no-op converge of
the first host with `-vv`, whose ">>>" lines are the SSH commands it sent (uploads are not echoed: a no-op
converge has none). Printed as a table
with t(N)/t(3), then the two costs that transfer to real Sparks: a host's CPU per no-op converge (its
container's CPU over the converges less its idle CPU over the same time) and the controller's CPU per host
added. With --against (another checkout of sparkfleet, e.g. `git worktree add /tmp/old <commit>`, its
.sim linked to this one's), the 3-host fleet is also converged by that checkout's deploy.py and its no-op
converges timed the same way in the same run, then converged back. The fleet changes under everyone's feet:
hold the e2e lock the whole time; at the end it is brought back to 3 hosts and converged.

This is a benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYINFRA = str(ROOT / ".venv" / "bin" / "pyinfra")
# pyinfra -vv echoes each command it sends a host, fact reads included, as "[host] >>> command" (ssh.py)
_ROUND_TRIP = re.compile(r"\]\s*>>> ")


def sim(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "sim", *args], cwd=ROOT, check=True, capture_output=True, text=True)


def converge(*extra: str, root: Path = ROOT) -> tuple[float, subprocess.CompletedProcess]:
    start = time.monotonic()
    proc = subprocess.run([PYINFRA, "-y", "inventory/sim.py", "deploy.py", *extra], cwd=root, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise SystemExit(f"converge failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return time.monotonic() - start, proc


def _host_ids() -> list[str]:
    names = [h["container"] for h in json.loads((ROOT / ".sim" / "state.json").read_text())["hosts"]]
    return subprocess.run(["docker", "inspect", "--format", "{{.Id}}", *names], capture_output=True,
                          text=True).stdout.split()


def hosts_rss_mib() -> float | None:
    """The simulated Sparks' resident memory (their cgroups' anonymous memory, page cache left out)."""
    total = 0
    for cid in _host_ids():
        v1 = Path(f"/sys/fs/cgroup/memory/docker/{cid}/memory.stat")
        v2 = Path(f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/memory.stat")
        found = re.search(r"^(?:total_rss|anon) (\d+)$", (v1 if v1.exists() else v2).read_text(), re.M) \
            if v1.exists() or v2.exists() else None
        if not found:
            return None
        total += int(found.group(1))
    return total / 2**20


def hosts_cpu_s() -> float | None:
    """CPU seconds the simulated Sparks (their containers' cgroups) have used so far; None where unreadable."""
    ids = _host_ids()
    total = 0.0
    for cid in ids:
        v1 = Path(f"/sys/fs/cgroup/cpuacct/docker/{cid}/cpuacct.usage")
        v2 = Path(f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/cpu.stat")
        if v1.exists():
            total += int(v1.read_text()) / 1e9
        elif v2.exists():
            total += int(re.search(r"usage_usec (\d+)", v2.read_text()).group(1)) / 1e6
        else:
            return None
    return total if ids else None


def controller_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def round_trips(output: str) -> int:
    """The SSH commands one host's `-vv` converge sent: its fact reads and its commands."""
    return sum(1 for line in output.splitlines() if _ROUND_TRIP.search(line))


def throttle(bps: int | None) -> None:
    state = json.loads((ROOT / ".sim" / "state.json").read_text())
    body = json.dumps({"throttle_bps": bps}).encode()
    request = urllib.request.Request(f"{state['hub']['controller_url']}/_sim/knobs", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=10).read()


def idle_cpu_rate(idle_s: float) -> float | None:
    """The simulated Sparks' CPU seconds per second while nobody converges (their engines, watchdog ticks,
    journald, dockerd): subtracted from the converges' window, so what is left is what a converge costs."""
    before, start = hosts_cpu_s(), time.monotonic()
    time.sleep(idle_s)
    after = hosts_cpu_s()
    return (after - before) / (time.monotonic() - start) if before is not None and after is not None else None


def noop(runs: int, idle_s: float, root: Path = ROOT) -> tuple[list[float], int, dict]:
    """`runs` no-op converges by the checkout at root (after one that makes the fleet its own), and the SSH
    commands of one more on the first host."""
    converge(root=root)
    idle = idle_cpu_rate(idle_s)
    hosts, controller, start = hosts_cpu_s(), controller_cpu_s(), time.monotonic()
    times = [converge(root=root)[0] for _ in range(runs)]
    hosts_after, controller_after, elapsed = hosts_cpu_s(), controller_cpu_s(), time.monotonic() - start
    _, verbose = converge("--limit", "spark-1", "-vv", root=root)
    measured = None not in (hosts, hosts_after, idle)
    cpu = {"controller_cpu_s": (controller_after - controller) / runs,
           "hosts_cpu_s": (hosts_after - hosts - idle * elapsed) / runs if measured else None,
           "hosts_idle_cpu_s_per_s": idle, "hosts_rss_mib": hosts_rss_mib()}
    return times, round_trips(verbose.stdout + verbose.stderr), cpu


def measure(n: int, runs: int, throttle_bps: int | None, first: bool, against: Path | None, idle_s: float) -> dict:
    if first:
        sim("down")
    sim("up", "--hosts", str(n))
    first_s = None
    if first:
        throttle(throttle_bps)
        try:
            first_s, _ = converge()
        finally:
            throttle(None)
    row = {"hosts": n, "first_s": first_s}
    if against is not None and n == 3:
        times, commands, cpu = noop(runs, idle_s, against)
        row.update(against_noop_s=statistics.median(times), against_runs=times, against_commands=commands,
                   against_cpu=cpu)
    times, commands, cpu = noop(runs, idle_s)
    return {**row, "noop_s": statistics.median(times), "noop_runs": times, "commands_per_host": commands, **cpu}


HOST_CPU_TARGET_MS = 400
CONTROLLER_CPU_TARGET_MS = 150


def host_costs(rows: list[dict]) -> dict:
    """The two costs that transfer to real Sparks: a host's CPU per no-op converge (the mean over every size
    measured), and the controller's CPU per host added (between the smallest and the largest fleet)."""
    hosts = [r["hosts_cpu_s"] / r["hosts"] for r in rows if r["hosts_cpu_s"] is not None]
    small, large = min(rows, key=lambda r: r["hosts"]), max(rows, key=lambda r: r["hosts"])
    added = large["hosts"] - small["hosts"]
    return {"host_cpu_ms_per_noop": 1000 * statistics.mean(hosts) if hosts else None,
            "controller_cpu_ms_per_added_host":
                1000 * (large["controller_cpu_s"] - small["controller_cpu_s"]) / added if added else None}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", default="3,6,10", help="fleet sizes, comma-separated (default 3,6,10)")
    ap.add_argument("--runs", type=int, default=5, help="no-op converges per size (the median counts)")
    ap.add_argument("--throttle-bps", type=int, default=50_000_000, help="the hub's rate for first converges")
    ap.add_argument("--skip-first", action="store_true", help="no first converge from bare hosts")
    ap.add_argument("--against", type=Path, help="another checkout whose 3-host no-op converge is timed beside")
    ap.add_argument("--idle-s", type=float, default=30,
                    help="seconds the idle hosts' CPU is read before the no-op converges (default 30: a watchdog tick)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    sizes = [int(v) for v in args.hosts.split(",")]
    rows = []
    try:
        for n in sizes:
            rows.append(measure(n, args.runs, args.throttle_bps, not args.skip_first, args.against, args.idle_s))
    finally:
        sim("up", "--hosts", "3")
        converge()
    base = next((r["noop_s"] for r in rows if r["hosts"] == 3), rows[0]["noop_s"])
    cores = os.cpu_count() or 1
    for row in rows:
        row["ratio"] = row["noop_s"] / base
        if row["hosts_cpu_s"] is not None:
            row["host_cpu_ms_per_host"] = 1000 * row["hosts_cpu_s"] / row["hosts"]
            row["cpu_floor_s"] = (row["controller_cpu_s"] + row["hosts_cpu_s"]) / cores
    summary = host_costs(rows)
    if args.json:
        print(json.dumps({"sizes": rows, **summary}, indent=2))
        return 0
    print(f"{'hosts':>5} {'no-op s (median)':>17} {'t(N)/t(3)':>9} {'SSH cmds/host':>13} {'first s':>8} "
          f"{'controller CPU s':>16} {'hosts CPU s':>11} {'ms/host':>7} {'CPU floor s':>11} {'hosts RSS MiB':>13}")
    for r in rows:
        first = f"{r['first_s']:.1f}" if r["first_s"] is not None else "-"
        hosts = f"{r['hosts_cpu_s']:.2f}" if r["hosts_cpu_s"] is not None else "-"
        rss = f"{r['hosts_rss_mib']:.0f}" if r["hosts_rss_mib"] is not None else "-"
        per_host = f"{r['host_cpu_ms_per_host']:.0f}" if "host_cpu_ms_per_host" in r else "-"
        floor = f"{r['cpu_floor_s']:.2f}" if "cpu_floor_s" in r else "-"
        print(f"{r['hosts']:>5} {r['noop_s']:>17.2f} {r['ratio']:>9.2f} {r['commands_per_host']:>13} {first:>8} "
              f"{r['controller_cpu_s']:>16.2f} {hosts:>11} {per_host:>7} {floor:>11} {rss:>13}")
    print(f"CPU floor: the controller's and the simulated hosts' CPU seconds over this machine's {cores} cores, "
          "which they share: no converge here is faster. ms/host: a simulated host's CPU per no-op converge.")
    if summary["host_cpu_ms_per_noop"] is not None:
        print(f"host CPU per no-op converge: {summary['host_cpu_ms_per_noop']:.0f} ms "
              f"(target <= {HOST_CPU_TARGET_MS} ms; the hosts' idle CPU over the same time subtracted)")
    if summary["controller_cpu_ms_per_added_host"] is not None:
        print(f"controller CPU per added host: {summary['controller_cpu_ms_per_added_host']:.0f} ms "
              f"(target <= {CONTROLLER_CPU_TARGET_MS} ms; from {rows[0]['hosts']} to {rows[-1]['hosts']} hosts)")
    for r in rows:
        if "against_noop_s" in r:
            print(f"3 hosts, {args.against}: no-op {r['against_noop_s']:.2f} s (runs "
                  f"{', '.join(f'{t:.2f}' for t in r['against_runs'])}), {r['against_commands']} SSH cmds/host; "
                  f"this checkout {r['noop_s']:.2f} s: {r['noop_s'] / r['against_noop_s']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
