"""How long does a converge of the simulated fleet take, and how many SSH commands does a no-op one send a host?

    flock /tmp/sparkfleet-e2e.lock python tools/bench_converge.py [--hosts 3,6,10] [--runs 5]
                                                                  [--throttle-bps N] [--skip-first] [--json]

For each fleet size N: `python -m sim up --hosts N`, a first converge from bare hosts (`sim down` first, the hub
throttled to --throttle-bps), then --runs no-op converges (the median is reported), then one no-op converge of
the first host with `-vv`, whose ">>>" lines are the SSH commands it sent (uploads are not echoed: a no-op
converge has none). Printed as a table
with t(N)/t(3). The fleet changes under everyone's feet: hold the e2e lock the whole time; at the end it is
brought back to 3 hosts and converged.

This is a benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import re
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


def converge(*extra: str) -> tuple[float, subprocess.CompletedProcess]:
    start = time.monotonic()
    proc = subprocess.run([PYINFRA, "-y", "inventory/sim.py", "deploy.py", *extra], cwd=ROOT, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise SystemExit(f"converge failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return time.monotonic() - start, proc


def round_trips(output: str) -> int:
    """The SSH commands one host's `-vv` converge sent: its fact reads and its commands."""
    return sum(1 for line in output.splitlines() if _ROUND_TRIP.search(line))


def throttle(bps: int | None) -> None:
    state = json.loads((ROOT / ".sim" / "state.json").read_text())
    body = json.dumps({"throttle_bps": bps}).encode()
    request = urllib.request.Request(f"{state['hub']['controller_url']}/_sim/knobs", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=10).read()


def measure(n: int, runs: int, throttle_bps: int | None, first: bool) -> dict:
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
    else:
        converge()
    times = [converge()[0] for _ in range(runs)]
    _, verbose = converge("--limit", "spark-1", "-vv")
    return {"hosts": n, "first_s": first_s, "noop_s": statistics.median(times), "noop_runs": times,
            "commands_per_host": round_trips(verbose.stdout + verbose.stderr)}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", default="3,6,10", help="fleet sizes, comma-separated (default 3,6,10)")
    ap.add_argument("--runs", type=int, default=5, help="no-op converges per size (the median counts)")
    ap.add_argument("--throttle-bps", type=int, default=50_000_000, help="the hub's rate for first converges")
    ap.add_argument("--skip-first", action="store_true", help="no first converge from bare hosts")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    sizes = [int(v) for v in args.hosts.split(",")]
    rows = []
    try:
        for n in sizes:
            rows.append(measure(n, args.runs, args.throttle_bps, not args.skip_first))
    finally:
        sim("up", "--hosts", "3")
        converge()
    base = next((r["noop_s"] for r in rows if r["hosts"] == 3), rows[0]["noop_s"])
    for row in rows:
        row["ratio"] = row["noop_s"] / base
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'hosts':>5} {'no-op s (median)':>17} {'t(N)/t(3)':>9} {'SSH cmds/host':>13} {'first s':>8}")
    for r in rows:
        first = f"{r['first_s']:.1f}" if r["first_s"] is not None else "-"
        print(f"{r['hosts']:>5} {r['noop_s']:>17.2f} {r['ratio']:>9.2f} {r['commands_per_host']:>13} {first:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
