"""How long is each host out of the front door's rotation when a new model rolls out, staged or not?

    flock /tmp/sparkfleet-e2e.lock python -m tools.bench_rollout [--hosts 3,6] [--fetch-s 30] [--json]

For each fleet size N: `python -m sim up --hosts N`, the fleet converged with its front door on door-1
(inventory/sim_front_door.py), then two rollouts of a new commit of the chat model (`python -m sim hub publish`,
`sparkfleet update` into a lock of the benchmark's own), the hub throttled so that one host's fetch of the largest
file takes --fetch-s seconds:

- before: what a rollout did before issue 22 staged it, one host after the other: `sparkfleet drain`, a converge
  of that host (`pyinfra ... --limit HOST`: the fetch, the verify, the engine's restart and its health gate),
  `sparkfleet undrain`;
- staged: `sparkfleet rollout --batch 1` (every host fetches and verifies beside its running release first, then
  batch by batch: drain, switch, gate, undrain).

Each host's time out of rotation is read from the front door itself (HAProxy's `show stat` on door-1, polled
every 0.5 s), the same for both. At the end the hub's branch, the lock and the release are put back (one converge),
the two commits' model directories removed, and the fleet left at 3 hosts, converged, its front door on door-1.
The fleet changes under everyone's feet: hold the e2e lock the whole time.

This is a benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tools.bench_converge import sim, throttle

ROOT = Path(__file__).resolve().parents[1]
PYINFRA = str(ROOT / ".venv" / "bin" / "pyinfra")
INVENTORY = "inventory/sim_front_door.py"


def run(*argv: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} ... failed (exit {proc.returncode}):\n"
                         f"{(proc.stdout + proc.stderr)[-3000:]}")
    return proc


def sparkfleet(*args: str) -> subprocess.CompletedProcess:
    return run(sys.executable, "-m", "sparkfleet", *args)


def converge(*extra: str) -> None:
    run(PYINFRA, "-y", INVENTORY, "deploy.py", *extra)


def host_shell(container: str, command: str) -> str:
    return subprocess.run(["docker", "exec", container, "sh", "-c", command], capture_output=True, text=True,
                          timeout=60).stdout


class DoorWatch:
    """A front door's backend states (`show_stat`: HAProxy's `show stat` text) polled every 0.5 s on a thread: when
    each backend first left `in` and when it came back (time.time), `on_first_departure` called at the first."""

    def __init__(self, show_stat: Callable[[], str], on_first_departure: Callable[[], None] | None = None):
        self.show_stat, self.on_first_departure = show_stat, on_first_departure
        self.left: dict[str, float] = {}
        self.back: dict[str, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from sparkfleet.fleet.front_door.runtime import backend_states

        while not self.stop.wait(0.5):
            now = time.time()
            for host, found in backend_states(self.show_stat()).items():
                if found["state"] != "in" and host not in self.left:
                    if not self.left and self.on_first_departure:
                        self.on_first_departure()
                    self.left[host] = now
                elif found["state"] == "in" and host in self.left:
                    self.back.setdefault(host, now)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(30)

    def out_s(self) -> dict[str, float]:
        """Each departed host's seconds out of rotation (inf: not back)."""
        return {h: round(self.back.get(h, float("inf")) - t, 1) for h, t in sorted(self.left.items())}


def show_stat(container: str) -> Callable[[], str]:
    from sparkfleet.roles.front_door.records import runtime_command

    return lambda: host_shell(container, runtime_command("show stat"))


def before(hosts: list[str]) -> None:
    """The rollout as it was before staging: each host drained, converged (fetch, restart, gate), undrained."""
    for host in hosts:
        sparkfleet("drain", INVENTORY, host)
        converge("--limit", host)
        sparkfleet("undrain", INVENTORY, host)


def staged(hosts: list[str]) -> None:
    sparkfleet("rollout", INVENTORY, "--batch", "1")


def largest_file(container: str, model_dir: str) -> int:
    sizes = host_shell(container, f"find {shlex.quote(model_dir)} -type f -printf '%s\\n'").split()
    return max(int(n) for n in sizes)


def measure(n: int, fetch_s: float) -> dict:
    from sparkfleet.contract import paths

    sim("up", "--hosts", str(n))
    state = json.loads((ROOT / ".sim" / "state.json").read_text())
    names = [h["name"] for h in state["hosts"]]
    containers = {h["name"]: h["container"] for h in state["hosts"]}
    converge()
    record = json.loads(host_shell(containers[names[0]], f"cat {shlex.quote(paths.RELEASE_FILE)}"))
    bps = max(1, int(largest_file(containers[names[0]], record["model_dir"]) / fetch_s))
    model_root = shlex.quote(os.path.dirname(record["model_dir"]))
    had = {c: set(host_shell(c, f"ls {model_root}").split()) for c in containers.values()}
    found: dict = {"hosts": n, "throttle_bps": bps}
    try:
        for mode, roll in (("before", before), ("staged", staged)):
            sim("hub", "publish")
            sparkfleet("update", INVENTORY)
            throttle(bps)
            started = time.monotonic()
            with DoorWatch(show_stat(state["service_hosts"][0]["container"])) as watch:
                roll(names)
            found[mode] = {"total_s": round(time.monotonic() - started, 1), "out_of_rotation_s": watch.out_s()}
            throttle(None)
    finally:
        throttle(None)
        Path(os.environ["SPARKFLEET_LOCK"]).unlink(missing_ok=True)
        sim("hub", "unpublish")
        converge()
        for c in containers.values():  # the two commits' directories, made by this benchmark
            made = set(host_shell(c, f"ls {model_root}").split()) - had[c]
            if made:
                host_shell(c, "cd " + model_root + " && rm -rf -- " + " ".join(shlex.quote(d) for d in made))
    return found


def print_table(rows: list[dict], fetch_s: float) -> None:
    print(f"rollout of a new model commit, hub throttled (largest file ~{fetch_s:g} s), front door on door-1")
    print(f"{'hosts':>5}  {'mode':<7} {'total s':>8}  {'out of rotation per host (s)':<40} {'max':>6}")
    for row in rows:
        for mode in ("before", "staged"):
            out = row[mode]["out_of_rotation_s"]
            worst = max(out.values(), default=None)
            per_host = ", ".join(f"{h} {v}" for h, v in out.items())
            print(f"{row['hosts']:>5}  {mode:<7} {row[mode]['total_s']:>8.1f}  {per_host:<40} {worst!s:>6}")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="3,6", help="fleet sizes, comma-separated (default 3,6)")
    ap.add_argument("--fetch-s", type=float, default=30.0, help="seconds one host's fetch of the largest file takes")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    lock_dir = tempfile.mkdtemp(prefix="sparkfleet-bench-rollout-")
    os.environ["SPARKFLEET_LOCK"] = str(Path(lock_dir) / "sparkfleet.lock")  # never the project's own lock
    rows = []
    try:
        for n in (int(x) for x in args.hosts.split(",")):
            rows.append(measure(n, args.fetch_s))
    finally:
        sim("up", "--hosts", "3")
        converge()
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print_table(rows, args.fetch_s)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
