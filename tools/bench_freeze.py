"""What a frozen or killed engine costs the office behind the front door (issue 54), on the simulated fleet.

    flock /tmp/sparkfleet-e2e.lock .venv/bin/python -m tools.bench_freeze [INVENTORY] [--json PATH]

INVENTORY (default inventory/sim_front_door.py) is the simulated fleet's with its door. A user of the bench's own is
added (a secrets file in a private temporary directory) and the door converged with it; then, for each scenario
(the engine frozen with `docker pause`, or killed with `docker kill`; the official openai client at its default
two retries, or with none), `--clients` threads send plain chats (non-streamed, each its own conversation) through
the door: `--quiet-s` of quiet, the fault on the first Spark, `--after-s` more. It prints, per scenario, the
completions in each 5-second window (quiet ones first), the quiet rate, the longest wait of a request started
after the fault, the failures (by what the client saw), and whether a window after the fault completed fewer than
half the quiet rate. A frozen engine is unpaused after its window (the watchdog would restart it later), a killed
one restarts alone; the next scenario waits for every engine to serve. At the end the door is converged back on
INVENTORY's own users (as the e2e fixtures expect it). Only the fleet's containers are touched (tools/soak_fleet.py).

`--faults busy` measures the other side, no false mark-down: under the same plain load, `--colleagues` more clients
send long prompts (`--prompt-words` words, a prefill of seconds each on the stand-in: each engine's prefill queue
stays deep, so a one-token probe waits its turn), while one plain answer of `--answer-s` seconds and one stream of
`--stream-s` seconds run (their max_tokens from the stand-in's decode rate, `--tokens-per-s`), sent as the colleagues'
(the door's affinity puts them where the prompts queue). It prints how each long one ended, every mark-down the door
made meanwhile, the engines the hosts' watchdogs restarted (their own 10-s chat probe failing three times in a row),
and how often a one-token chat probe to each engine's guard (every 2 s) took over 1 s (what the door's old check,
`timeout check 1s`, failed) or failed outright.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sparkfleet.refused import Refused

ROOT = Path(__file__).resolve().parents[1]
WINDOW_S = 5.0
STALL_BOUND_S = 10.0  # issue 54's goal: no plain request started after the fault waits longer
USER = "bench-freeze"
ASK = "Summarise the above."  # busy: the colleagues' and the long ones' first user message


@dataclass(frozen=True)
class Done:
    start: float  # seconds from the fault (negative: before it)
    end: float
    outcome: str  # "ok" or what the client saw (tools/soak failure_class)


def windows(done: Sequence[Done], quiet_s: float, after_s: float) -> dict:
    """Completions per 5-second window (by their end), the quiet rate (the quiet windows' mean), the longest wait of
    a request started after the fault, the failures by class, and the windows after the fault under half the quiet
    rate."""
    edges = [-quiet_s + WINDOW_S * i for i in range(int((quiet_s + after_s) // WINDOW_S))]
    counts = [sum(1 for d in done if d.outcome == "ok" and lo <= d.end < lo + WINDOW_S) for lo in edges]
    quiet = [c for lo, c in zip(edges, counts, strict=True) if lo + WINDOW_S <= 0]
    rate = sum(quiet) / len(quiet) if quiet else 0.0
    after = [(lo, c) for lo, c in zip(edges, counts, strict=True) if lo >= 0]
    late = [d for d in done if d.start >= 0]
    failed: dict[str, int] = {}
    for d in done:
        if d.outcome != "ok" and d.end >= 0:
            failed[d.outcome] = failed.get(d.outcome, 0) + 1
    return {"windows": [{"from_s": lo, "completed": c} for lo, c in zip(edges, counts, strict=True)],
            "quiet_rate": round(rate, 1),
            "max_wait_after_s": round(max((d.end - d.start for d in late), default=0.0), 2),
            "over_bound": sum(1 for d in late if d.end - d.start > STALL_BOUND_S),
            "failed": dict(sorted(failed.items())), "requests": len(done),
            "low_windows": [lo for lo, c in after if c < rate / 2]}


def load(url: str, model: str, key: str, clients: int, retries: int, seconds: float, fault_at: list[float],
         out: list[Done]) -> None:
    """`clients` threads of plain chats for `seconds`; each request logged against the fault's time (fault_at[0],
    set when it is injected)."""
    from openai import OpenAI

    from tools.soak import failure_class

    deadline = time.monotonic() + seconds
    lock = threading.Lock()

    def worker(n: int) -> None:
        client = OpenAI(base_url=f"{url}/v1", api_key=key, timeout=60, max_retries=retries)
        turn = 0
        while time.monotonic() < deadline:
            started = time.monotonic()
            try:
                client.chat.completions.create(model=model, max_tokens=16, messages=[
                    {"role": "user", "content": f"bench-freeze client {n} turn {turn} at {started:.3f}"}])
                outcome = "ok"
            except Exception as exc:  # every failure is data: what the client saw
                outcome = failure_class(exc)
            with lock:
                out.append(Done(started, time.monotonic(), outcome))
            turn += 1
            time.sleep(0.2)

    threads = [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 180)


def scenario(fleet, url: str, model: str, key: str, fault: str, retries: int, args) -> dict:
    host = fleet.hosts[0]
    waited = time.monotonic()
    while not fleet.serving(None):
        if time.monotonic() - waited > 300:
            raise Refused("the fleet did not serve again within 300 s: not measured further")
        time.sleep(3)
    done: list[Done] = []
    fault_at: list[float] = []
    runner = threading.Thread(target=load, args=(url, model, key, args.clients, retries,
                                                 args.quiet_s + args.after_s, fault_at, done), daemon=True)
    runner.start()
    time.sleep(args.quiet_s)
    fault_at.append(time.monotonic())
    verb = "pause" if fault == "freeze" else "kill"
    fleet.sh(host, f"docker {verb} {fleet.engine(host)}")
    noticed = None
    while runner.is_alive():
        if noticed is None and fleet.door_states().get(host) not in ("in", None):
            noticed = time.monotonic() - fault_at[0]
        runner.join(0.5)
    if fault == "freeze":
        fleet.sh(host, f"docker unpause {fleet.engine(host)} 2>/dev/null; true")
    t0 = fault_at[0]
    shifted = [Done(d.start - t0, d.end - t0, d.outcome) for d in done]
    return {"fault": fault, "host": host, "client_retries": retries, "door_marked_down_s":
            None if noticed is None else round(noticed, 1), **windows(shifted, args.quiet_s, args.after_s)}


def busy(fleet, url: str, model: str, key: str, args) -> dict:
    """No false mark-down (see the module's docstring): the long answer and the long stream under the plain load and
    the colleagues' long prompts; the door's states and the probes' times sampled meanwhile."""
    from openai import OpenAI

    from tools.soak import failure_class

    seconds = max(args.answer_s, args.stream_s) + 10
    done: list[Done] = []
    colleagues: list[Done] = []
    long_ones: dict[str, dict] = {}
    stop = threading.Event()
    filler = " ".join(f"word{i % 97}" for i in range(args.prompt_words))

    def colleague(n: int) -> None:
        client = OpenAI(base_url=f"{url}/v1", api_key=key, timeout=600, max_retries=0)
        turn = 0
        while not stop.is_set():
            started = time.monotonic()
            try:
                client.chat.completions.create(model=model, max_tokens=16, messages=[
                    {"role": "system", "content": f"colleague {n} turn {turn}: {filler}"},
                    {"role": "user", "content": ASK}])
                outcome = "ok"
            except Exception as exc:  # every failure is data
                outcome = failure_class(exc)
            colleagues.append(Done(started, time.monotonic(), outcome))
            turn += 1

    def long_one(name: str, tokens: int, stream: bool) -> None:
        client = OpenAI(base_url=f"{url}/v1", api_key=key, timeout=900, max_retries=0)
        started = time.monotonic()
        got, outcome = 0, "ok"
        try:
            # the colleagues' first user message and person: the door's affinity puts it where their prompts queue
            messages = [{"role": "system", "content": f"bench-freeze busy {name} at {started:.3f}"},
                        {"role": "user", "content": ASK}]
            if stream:
                for chunk in client.chat.completions.create(model=model, max_tokens=tokens, messages=messages,
                                                            stream=True):
                    got += sum(1 for c in chunk.choices if c.delta.content)
            else:
                reply = client.chat.completions.create(model=model, max_tokens=tokens, messages=messages)
                got = reply.usage.completion_tokens if reply.usage else 0
        except Exception as exc:  # a cut stream or a failed answer is what this measures
            outcome = failure_class(exc)
        long_ones[name] = {"outcome": outcome, "tokens": got, "asked": tokens,
                           "seconds": round(time.monotonic() - started, 1)}

    def probes(out: dict) -> None:
        """A one-token chat probe to each engine's guard every 2 s (what the old check sent, through the same guard),
        and its time."""
        body = {"model": model, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
        while not stop.is_set():
            for host in fleet.hosts:
                started = time.monotonic()
                try:
                    ok = fleet.guards.session.post(
                        f"{fleet.api_urls[host]}/v1/chat/completions", json=body, timeout=30,
                        headers={"Authorization": f"Bearer {fleet.settings[host].api_key}"}).status_code == 200
                except Exception:  # a probe that failed is counted as such
                    ok = False
                took = time.monotonic() - started
                row = out.setdefault(host, {"probes": 0, "over_1s": 0, "failed": 0, "longest_s": 0.0})
                row["probes"] += 1
                row["over_1s"] += took > 1.0
                row["failed"] += not ok
                row["longest_s"] = round(max(row["longest_s"], took), 2)
            stop.wait(2)

    fault_at = [time.monotonic()]
    since_wall = time.time()
    probed: dict[str, dict] = {}
    threads = [threading.Thread(target=load, args=(url, model, key, args.clients, 2, seconds, fault_at, done),
                                daemon=True),
               *(threading.Thread(target=colleague, args=(n,), daemon=True) for n in range(args.colleagues)),
               threading.Thread(target=probes, args=(probed,), daemon=True)]
    for t in threads:
        t.start()
    time.sleep(5)  # the colleagues' prompts queued first
    longs = [threading.Thread(target=long_one, args=("answer", int(args.answer_s * args.tokens_per_s), False)),
             threading.Thread(target=long_one, args=("stream", int(args.stream_s * args.tokens_per_s), True))]
    for t in longs:
        t.start()
    downs: list[str] = []
    before = {h: "in" for h in fleet.hosts}
    while any(t.is_alive() for t in longs):
        try:
            states = fleet.door_states()
        except Exception:  # a slow read is no state change
            states = before
        for host, state in states.items():
            if state != before.get(host):
                downs.append(f"{host} {before.get(host)}->{state} at {time.monotonic() - fault_at[0]:.1f} s")
        before = states
        time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join(60)
    # a restart by the host's watchdog (its own chat probe, 10 s, failing three times in a row) is no door's doing
    restarted = [h for h in fleet.hosts if fleet.watchdog_restarted(h, since_wall)]
    return {"fault": "busy", "long": long_ones, "door_changes": downs, "probes": probed,
            "watchdog_restarted": restarted,
            "plain": {"requests": len(done), "failed": sum(1 for d in done if d.outcome != "ok"),
                      "longest_s": round(max((d.end - d.start for d in done), default=0.0), 1)},
            "colleagues": {"requests": len(colleagues), "failed": sum(1 for d in colleagues if d.outcome != "ok"),
                           "median_s": round(sorted(d.end - d.start for d in colleagues)[len(colleagues) // 2], 1)
                           if colleagues else None}}


def print_busy(r: dict) -> None:
    for name, one in r["long"].items():
        print(f"busy: the long {name}: {one['outcome']}, {one['tokens']} of {one['asked']} tokens in "
              f"{one['seconds']} s")
    print(f"      door changes meanwhile: {r['door_changes'] or 'none'}; engines the watchdog restarted: "
          f"{r['watchdog_restarted'] or 'none'}")
    print(f"      plain: {r['plain']['requests']} requests, {r['plain']['failed']} failed, longest "
          f"{r['plain']['longest_s']} s; colleagues' long prompts: {r['colleagues']['requests']}, "
          f"{r['colleagues']['failed']} failed, median {r['colleagues']['median_s']} s")
    for host, p in sorted(r["probes"].items()):
        print(f"      {host}: one-token probes {p['probes']}, over 1 s {p['over_1s']}, failed {p['failed']}, "
              f"longest {p['longest_s']} s")


def print_table(results: list[dict]) -> None:
    for r in results:
        if r["fault"] == "busy":
            print_busy(r)
            continue
        counts = " ".join(f"{w['completed']}" + ("|" if w["from_s"] + WINDOW_S == 0 else "")
                          for w in r["windows"])
        print(f"{r['fault']:6} retries={r['client_retries']}: windows (5 s, | = the fault) {counts}")
        print(f"        quiet {r['quiet_rate']}/window, door marked down at {r['door_marked_down_s']} s, longest "
              f"wait started after the fault {r['max_wait_after_s']} s ({r['over_bound']} over "
              f"{STALL_BOUND_S:g} s), failed {r['failed'] or 0} of {r['requests']}, windows under half the quiet "
              f"rate: {r['low_windows'] or 'none'}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tools.bench_freeze", description=__doc__.split("\n\n")[0])
    parser.add_argument("inventory", nargs="?", default=str(ROOT / "inventory" / "sim_front_door.py"))
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--quiet-s", type=float, default=20.0)
    parser.add_argument("--after-s", type=float, default=45.0)
    parser.add_argument("--faults", default="freeze,kill", help="freeze, kill, busy (comma-separated)")
    parser.add_argument("--colleagues", type=int, default=3, help="busy: clients sending long prompts")
    parser.add_argument("--prompt-words", type=int, default=4000, help="busy: words of each long prompt")
    parser.add_argument("--answer-s", type=float, default=90.0, help="busy: the long plain answer's seconds")
    parser.add_argument("--stream-s", type=float, default=300.0, help="busy: the long stream's seconds")
    parser.add_argument("--tokens-per-s", type=float, default=50.0, help="busy: the engines' decode rate")
    parser.add_argument("--retries", default="2,0", help="the openai client's max_retries to run, comma-separated")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)
    if not 1 <= args.clients <= 16:
        parser.error("--clients: from 1 to 16")
    if set(args.faults.split(",")) - {"freeze", "kill", "busy"}:
        parser.error("--faults: freeze, kill, busy")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import pyinfra_cli  # noqa: F401  (first, as sparkfleet's main() does: gevent patches ssl before clients import it)

    from tools import soak_fleet

    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="sparkfleet-bench-freeze-") as workdir:
        os.chmod(workdir, 0o700)
        fleet = soak_fleet.Fleet(args.inventory, Path(workdir))
        try:
            fleet.write_inventory()
            key = fleet.add_user(USER)
            fleet.converge_door()
            from sparkfleet.fleet.front_door.commands import bench_target

            url, model, _ = bench_target(fleet.inventory, USER)
            for fault in args.faults.split(","):
                if fault == "busy":
                    results.append(busy(fleet, url, model, key, args))
                    print_table(results[-1:])
                    sys.stdout.flush()
                    continue
                for retries in (int(r) for r in args.retries.split(",")):
                    results.append(scenario(fleet, url, model, key, fault, retries, args))
                    print_table(results[-1:])
                    sys.stdout.flush()
        except Refused as exc:
            print(f"bench_freeze: {exc}", file=sys.stderr)
            return exc.code
        finally:
            for host in fleet.hosts:  # nothing left paused, whatever happened
                fleet.sh(host, f"docker unpause {fleet.engine(host)} 2>/dev/null; true")
            fleet.converge_door(inventory=fleet.base)  # the door back on the inventory's own users
            fleet.close()
    print("\nsummary")
    print_table(results)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
