"""How often does the quality gate stop a healthy rollout? (issue 52: the false-halt rate; the goal is 0)

    flock /tmp/sparkfleet-e2e.lock python -m tools.false_halts [--rollouts 10] [--host spark-1] [--speed-gate]
                                                                [--json]

On the simulated fleet (`python -m sim up`, inventory/sim.py), `--rollouts` gated rollouts of one host
(`sparkfleet rollout --limit HOST`: no other host restarts), alternating two releases that answer the same: the
inventory's, with an inert stand-in knob in engine_env (SIM_RELEASE_TAG a, then b, then a ...: a new release id each
time, the same engine, the same answers). Each rollout's canary runs the quality gate against the release it
replaces (the first one evaluates the running release after the drain, before the switch; the next ones judge
against the baseline the one before kept); the speed gate only with --speed-gate, so its noise on a shared machine is
not counted as the quality gate's. Printed per rollout: the gate's verdict and seconds, the rollout's seconds; at the
end the false-halt rate (halted / rollouts).

Before the first rollout the host's quality and speed records are saved; after the last, the host is rolled back to
the inventory's own release (ungated) and its records are put back, so the fleet is as the tool found it. The host
changes under everyone's feet: hold the e2e lock the whole time.

This is a benchmark, not a test: it asserts nothing; exit 1 when a rollout halted or failed.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tools.bench_rollout import host_shell

ROOT = Path(__file__).resolve().parents[1]
INVENTORY = "inventory/sim.py"
HERE = ROOT / ".sim" / "false_halts"  # inside the checkout (ignored): the variants' project is the checkout's
TAGS = ("a", "b")


def variant(tag: str) -> str:
    """inventory/sim.py with SIM_RELEASE_TAG=tag in every Spark's engine_env: a release the stand-in serves as the
    inventory's own (it reads no such knob)."""
    HERE.mkdir(parents=True, exist_ok=True)
    path = HERE / f"release_{tag}.py"
    path.write_text("import runpy\n"
                    f"_sim = runpy.run_path({str(ROOT / INVENTORY)!r})\n"
                    f"sparks = [(n, {{**d, 'engine_env': {{**d['engine_env'], 'SIM_RELEASE_TAG': {tag!r}}}}})"
                    " for n, d in _sim['sparks']]\n")
    return str(path)


def sparkfleet(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparkfleet", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def records(container: str, save: bool) -> None:
    """The host's quality and speed records copied aside (`save`), or put back as they were (absent: removed)."""
    from sparkfleet.contract.paths import QUALITY_FILE, SPEED_FILE

    files = " ".join(shlex.quote(f) for f in (QUALITY_FILE, SPEED_FILE))
    host_shell(container, f"for f in {files}; do rm -f $f.false-halts; [ ! -e $f ] || cp -a $f $f.false-halts; done"
               if save else
               f"for f in {files}; do if [ -e $f.false-halts ]; then mv -f $f.false-halts $f; else rm -f $f; fi; done")


def one(n: int, inventory: str, host: str, speed_gate: bool) -> dict:
    """One gated rollout of `host` to `inventory`'s release: its verdict, the gate's seconds, the rollout's."""
    started = time.monotonic()
    proc = sparkfleet("rollout", inventory, "--limit", host, "--json", *([] if speed_gate else ["--no-speed-gate"]))
    took = time.monotonic() - started
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        return {"rollout": n, "release": Path(inventory).stem, "verdict": "failed", "gate_s": None,
                "rollout_s": round(took, 1), "halted": True, "line": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    checks = report.get("quality_gate", {}).get("checks") or [{}]
    check = checks[0]
    speed = (report.get("speed_gate", {}).get("checks") or [{}])[0]
    return {"rollout": n, "release": Path(inventory).stem, "verdict": check.get("verdict", "not evaluated"),
            "gate_s": check.get("seconds"), "baseline": (check.get("baseline") or {}).get("source"),
            "speed": speed.get("verdict"), "rollout_s": round(took, 1), "halted": not report.get("ok"),
            "line": check.get("line", "")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.false_halts", description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=10, help="healthy gated rollouts (default 10)")
    parser.add_argument("--host", default="spark-1", help="the host rolled (default spark-1)")
    parser.add_argument("--speed-gate", action="store_true", help="run the speed gate too (its halts count)")
    parser.add_argument("--json", action="store_true", help="the rollouts and the rate as JSON on stdout")
    args = parser.parse_args(argv)
    from sim.fleet.fleet import container_name

    if not (ROOT / ".sim" / "state.json").exists():
        raise SystemExit("the simulated fleet is not up: python -m sim up, then pyinfra -y inventory/sim.py deploy.py")
    container = container_name(args.host)
    records(container, save=True)
    found = []
    try:
        for n in range(1, args.rollouts + 1):
            row = one(n, variant(TAGS[(n - 1) % 2]), args.host, args.speed_gate)
            found.append(row)
            gate = "-" if row["gate_s"] is None else f"{row['gate_s']:.1f} s"
            print(f"rollout {n:2d} to {row['release']}: quality gate {row['verdict']} in {gate} (baseline: "
                  f"{row['baseline'] or '-'}), rollout {row['rollout_s']:.0f} s"
                  + (f", speed gate {row['speed']}" if args.speed_gate else "")
                  + (f": HALTED: {row['line']}" if row["halted"] else ""), file=sys.stderr)
    finally:
        back = sparkfleet("rollout", INVENTORY, "--limit", args.host, "--no-speed-gate", "--no-quality-gate")
        records(container, save=False)
        if back.returncode != 0:
            print(f"{args.host}: not rolled back to {INVENTORY}'s release: {back.stderr[-2000:]}", file=sys.stderr)
    halts = sum(r["halted"] for r in found)
    gates = [r["gate_s"] for r in found if r["gate_s"] is not None]
    summary = {"rollouts": len(found), "false_halts": halts, "rate": halts / len(found) if found else None,
               "gate_s": {"median": statistics.median(gates) if gates else None, "max": max(gates, default=None)},
               "rollout_s": {"median": round(statistics.median(r["rollout_s"] for r in found), 1) if found else None},
               "speed_gate": args.speed_gate, "host": args.host}
    if args.json:
        print(json.dumps({**summary, "each": found}, indent=2))
    print(f"false halts: {halts} of {len(found)} healthy gated rollouts ({summary['rate'] or 0:.0%}); the quality "
          f"gate's seconds at the canary: median {summary['gate_s']['median']}, max {summary['gate_s']['max']}; a "
          f"rollout: median {summary['rollout_s']['median']} s", file=sys.stderr)
    return 1 if halts else 0


if __name__ == "__main__":
    sys.exit(main())
