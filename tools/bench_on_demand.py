"""The time from a request to a stopped on-demand model to its first token, through the front door.

    python -m tools.bench_on_demand INVENTORY SERVED_NAME [--runs 3] [--user alice] [--disk-gbs 5]

Each run waits until the model is idle-stopped (`sparkfleet status`: its idle time must pass), then sends one streamed
chat completion and prints the seconds to its first token. Beside them, on paper for a Spark: the model's weights
read from disk at --disk-gbs (an assumption, not a measurement; vLLM's compile and CUDA graph capture come on top:
the reference write-up's 35 GB model took 3-4 minutes to serve).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import pyinfra_cli  # noqa: F401  (first, as sparkfleet's main() does: gevent patches ssl before requests imports it)

from sparkfleet.contract.recipes import recipe
from sparkfleet.contract.settings import parse_settings
from sparkfleet.fleet.front_door.commands import bench_target
from sparkfleet.controller.inventory import load_hosts, spark_hosts
from tools.bench_front_door import ttft_ms


def on_demand_service(inventory: str, served: str) -> tuple[str, str, int]:
    """(host, service name, the recipe's weight bytes) of the on-demand model served as `served`."""
    for host, data in spark_hosts(load_hosts(inventory)):
        s = parse_settings(host, data)
        for name, entry in s.services.items():
            chosen = recipe(entry.recipe)
            if entry.on_demand and (entry.served_model_name or chosen.settings.get("served_model_name")) == served:
                return host, name, chosen.model.weight_bytes
    raise SystemExit(f"no on-demand service serves {served!r} in {inventory}: mark its entry \"on_demand\": True")


def state(inventory: str, host: str, name: str) -> str | None:
    """The service's state in `sparkfleet status --json` (idle-stopped, starting, running), None when unknown."""
    proc = subprocess.run([sys.executable, "-m", "sparkfleet", "status", inventory, "--json"], capture_output=True,
                          text=True, timeout=600, check=False)
    try:
        row = next(r for r in json.loads(proc.stdout)["hosts"] if r["host"] == host)
        return row["ssh"]["services"][name].get("state")
    except (ValueError, KeyError, TypeError, StopIteration):
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inventory")
    parser.add_argument("served_name")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--user", help="front_door_users name (default: the first)")
    parser.add_argument("--disk-gbs", type=float, default=5.0, help="assumed disk read GB/s for the paper figure")
    parser.add_argument("--wait-s", type=float, default=1800, help="the longest wait for an idle stop")
    args = parser.parse_args(argv)
    url, _, key = bench_target(args.inventory, args.user)
    host, name, weight_bytes = on_demand_service(args.inventory, args.served_name)
    seconds = []
    for run in range(args.runs):
        deadline = time.monotonic() + args.wait_s
        while state(args.inventory, host, name) != "idle-stopped":
            if time.monotonic() > deadline:
                raise SystemExit(f"{args.served_name} on {host} did not stop within {args.wait_s:g} s")
            time.sleep(5)
        seconds.append(ttft_ms(url, key, args.served_name, f"wake up {run} at {time.time()}") / 1000)
        print(f"run {run + 1}: first token {seconds[-1]:.2f} s after the request to the stopped model")
    paper = weight_bytes / (args.disk_gbs * 1e9)
    print(f"{args.served_name} on {host} ({name}): first token after a stop {min(seconds):.2f}-{max(seconds):.2f} s "
          f"over {len(seconds)} runs; on paper for a Spark: >= {paper:.0f} s to read its {weight_bytes / 1e9:.1f} GB "
          f"of weights at {args.disk_gbs:g} GB/s, plus the engine's own start")
    return 0


if __name__ == "__main__":
    sys.exit(main())
