"""What conversation affinity at the front door buys: time to first token, prefix-cache hits and each engine's share
under each `front_door_routing` mode (issue 54).

    python -m tools.bench_affinity INVENTORY [--modes roundrobin,hash,bounded] [--conversations 12] [--turns 5]
                                   [--concurrency 4] [--system-prompts 3] [--system-words 700] [--json]

Run it on the simulated fleet under the e2e lock (it converges the front door):

    flock /tmp/sparkfleet-e2e.lock .venv/bin/python -m tools.bench_affinity inventory/sim_front_door.py

For each mode it converges the inventory's front doors alone with `--data front_door_routing=MODE` (`pyinfra ...
--limit DOOR`: the engines keep their release), then sends N conversations of M turns through the door, each turn
re-sending the conversation so far (a long system prompt, one of a few shared by the conversations; every other
conversation opens with the same first user message, as a tool's preamble or a template does), a few conversations
at once, streamed, thinking off. It prints per mode: p50/p95 time to the first content chunk, requests a second,
the prefix-cache hit rate (the engines' own counters, vLLM's vllm:prefix_cache_hits/queries, read through each
host's guard before and after; llama.cpp's `timings.cache_n` / `prompt_n` of the replies where the engine exports
no such counter) and each engine's share of the requests (HAProxy's `stot` per server, checks not counted). Each
mode's prompts carry their own tag, so no mode finds another's prefixes cached. At the end the doors are converged
again from the inventory as given: the fleet as it was found. A benchmark, not a test: it asserts nothing.

`--kv-blocks N` makes it an eviction workload: before the modes, the whole inventory is converged with
`extra_engine_args` set to vLLM's `--num-gpu-blocks-override N` (the engines restart with a prefix cache of N blocks of
16 tokens, which the stand-in honours, least recently used out first), so that more conversations than one engine's
cache holds run through it; at the end the whole inventory is converged again as given (the engines restart on their
own release). Give it more conversations than fit (`--conversations 24`, say).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyinfra_cli  # noqa: F401  (first, as sparkfleet's main() does: gevent patches ssl before requests imports it)
import requests

from sparkfleet.contract.settings import parse_settings
from sparkfleet.controller.inventory import load_hosts, spark_hosts
from sparkfleet.fleet.bench import parse_prefix_cache
from sparkfleet.fleet.front_door.commands import bench_target
from sparkfleet.fleet.front_door.runtime import FrontDoorRuntime
from sparkfleet.fleet.tls import guard_client
from sparkfleet.roles.front_door.records import BACKEND
from sparkfleet.roles.pki import hosts_ca

ROOT = Path(__file__).resolve().parents[1]
PYINFRA = str(ROOT / ".venv" / "bin" / "pyinfra")
MODES = ("roundrobin", "hash", "bounded")
SHARED_FIRST = "Please review the notes above and tell me what to do first."


def converge_doors(inventory: str, doors: list[str], mode: str | None) -> float:
    """Converge the front doors alone, with `mode` as their routing (None: the inventory's own); its seconds."""
    started = time.monotonic()
    data = ["--data", f"front_door_routing={mode}"] if mode else []
    limits = [arg for door in doors for arg in ("--limit", door)]  # one each: pyinfra reads "a,b" as one name
    proc = subprocess.run([PYINFRA, "-y", inventory, "deploy.py", *limits, *data], cwd=ROOT,
                          capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"converging {', '.join(doors)} ({mode or 'as the inventory says'}) failed "
                         f"(exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return time.monotonic() - started


def converge_all(inventory: str, data: list[str]) -> float:
    """Converge the whole inventory (engines and doors), with `--data` pairs; its seconds."""
    started = time.monotonic()
    proc = subprocess.run([PYINFRA, "-y", inventory, "deploy.py", *data], cwd=ROOT, capture_output=True, text=True,
                          timeout=1800, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"converging {inventory} {' '.join(data)} failed (exit {proc.returncode}):\n"
                         f"{(proc.stdout + proc.stderr)[-3000:]}")
    return time.monotonic() - started


def small_cache(blocks: int) -> list[str]:
    """The `--data` that restarts every engine with a prefix cache of `blocks` blocks."""
    return ["--data", "extra_engine_args=" + json.dumps(["--num-gpu-blocks-override", str(blocks)])]


def engine_hosts(inventory: str, model: str, guards) -> dict[str, tuple[str, str]]:
    """{host: (url, key)} of each engine serving `model`, as the controller reaches it (its guard: https with the
    controller's client certificate where the fleet's hops are TLS, `guards`)."""
    out = {}
    for name, data in spark_hosts(load_hosts(inventory)):
        s = parse_settings(name, data)
        url = guards.url(name, s, data)
        if s.served_model_name == model and url:
            out[name] = (url.rstrip("/"), s.api_key or "none")
    return out


def prefix_counters(engines: dict[str, tuple[str, str]], session) -> dict[str, dict | None]:
    """Each engine's prefix-cache counters ({"hits", "queries"}), None where its /metrics has none."""
    out = {}
    for host, (url, key) in engines.items():
        try:
            reply = session.get(f"{url}/metrics", headers={"Authorization": f"Bearer {key}"}, timeout=10)
            reply.raise_for_status()
            out[host] = parse_prefix_cache(reply.text)
        except requests.RequestException:
            out[host] = None
    return out


def door_requests(runtime: FrontDoorRuntime) -> dict[str, int]:
    """Requests each engine has had from the doors (HAProxy's stot of the chat backend's servers, summed)."""
    totals: dict[str, int] = {}
    for answer in runtime._run("show stat").values():
        for row in csv.DictReader(io.StringIO((answer or "").lstrip("# "))):
            if row.get("pxname") == BACKEND and row.get("svname") not in ("FRONTEND", "BACKEND"):
                totals[row["svname"]] = totals.get(row["svname"], 0) + int(row.get("stot") or 0)
    return totals


def conversations(n: int, prompts: int, words: int, tag: str) -> list[list[dict]]:
    """The opening messages of `n` conversations: a system prompt of `words` words (one of `prompts`, this run's
    `tag` in it), then a first user message, shared by every even conversation."""
    systems = [" ".join([f"{tag} policy {p}:"] + [f"rule{k}" for k in range(words)]) for p in range(prompts)]
    return [[{"role": "system", "content": systems[c % prompts]},
             {"role": "user", "content": SHARED_FIRST if c % 2 == 0 else f"{tag} question {c}: where do I start?"}]
            for c in range(n)]


def one_turn(url: str, key: str, model: str, messages: list, max_tokens: int) -> dict:
    """One streamed chat: its time to the first content chunk, the answer, and llama.cpp's timings if sent."""
    started = time.perf_counter()
    ttft, words, timings = None, [], None
    with requests.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, stream=True,
                       timeout=120, json={"model": model, "messages": messages, "max_tokens": max_tokens,
                                          "stream": True, "chat_template_kwargs": {"enable_thinking": False}}) as r:
        if r.status_code != 200:  # the engine's reason (a context overflow, say) in the report
            raise RuntimeError(f"{r.status_code}: {r.text[:300]}")
        for line in r.iter_lines():
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            timings = chunk.get("timings") or timings
            delta = chunk["choices"][0].get("delta") or {} if chunk.get("choices") else {}
            if delta.get("content"):
                ttft = ttft if ttft is not None else time.perf_counter() - started
                words.append(delta["content"])
    if ttft is None:
        raise RuntimeError(f"{url}: the stream ended without content")
    return {"ttft_s": ttft, "answer": "".join(words), "timings": timings}


def run_mode(mode: str, args, url: str, model: str, keys: list[str], engines: dict, runtime, session) -> dict:
    """One mode's conversations through the door, and what the engines and the door counted meanwhile."""
    tag = f"{mode}-{int(time.time())}"
    openings = conversations(args.conversations, args.system_prompts, args.system_words, tag)
    results: list[dict] = []
    errors: list[str] = []
    lock = threading.Lock()

    def conversation(c: int) -> None:
        messages = list(openings[c])
        key = keys[c % len(keys)]  # a person per conversation, in turn: the door's key tells them apart
        for t in range(args.turns):
            try:
                turn = one_turn(url, key, model, messages, args.max_tokens)
            except (requests.RequestException, RuntimeError) as e:
                with lock:
                    errors.append(f"conversation {c} turn {t}: {e}")
                return
            with lock:
                results.append(turn)
            messages += [{"role": "assistant", "content": turn["answer"]},
                         {"role": "user", "content": f"Turn {t + 2} of conversation {c}: and then?"}]

    cache_before, sent_before = prefix_counters(engines, session), door_requests(runtime)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        list(pool.map(conversation, range(args.conversations)))
    wall = time.monotonic() - started
    cache_after, sent_after = prefix_counters(engines, session), door_requests(runtime)
    ttfts = sorted(r["ttft_s"] * 1000 for r in results)
    sent = {h: sent_after.get(h, 0) - sent_before.get(h, 0) for h in sorted(set(sent_after) | set(sent_before))}
    total = sum(sent.values())
    hits = queries = 0.0
    counted = [h for h in engines if cache_before.get(h) and cache_after.get(h)]
    for h in counted:
        hits += cache_after[h]["hits"] - cache_before[h]["hits"]
        queries += cache_after[h]["queries"] - cache_before[h]["queries"]
    timed = [r["timings"] for r in results if r["timings"]]
    from_replies = None
    if timed:  # llama.cpp: prompt_n tokens evaluated, cache_n taken from its prompt cache
        cached = sum(t.get("cache_n", 0) for t in timed)
        from_replies = cached / max(1, cached + sum(t.get("prompt_n", 0) for t in timed))
    return {
        "mode": mode, "requests": len(results), "errors": errors, "wall_s": round(wall, 1),
        "requests_per_s": round(len(results) / wall, 2) if wall else None,
        "ttft_ms": {"p50": round(statistics.median(ttfts), 1) if ttfts else None,
                    "p95": round(ttfts[min(len(ttfts) - 1, int(0.95 * len(ttfts)))], 1) if ttfts else None},
        "prefix_cache": {"hits": hits, "queries": queries, "hit_rate": hits / queries if queries else None,
                         "engines_counted": counted, "from_replies": from_replies},
        "share": {h: round(n / total, 3) if total else None for h, n in sent.items()},
        "sent": sent,
    }


def print_table(rows: list[dict], setup: dict) -> None:
    print(f"front door affinity: {setup['conversations']} conversations x {setup['turns']} turns, "
          f"{setup['concurrency']} at once, {setup['system_prompts']} system prompts of {setup['system_words']} "
          f"words, half opening with one shared first message, {setup['max_tokens']} tokens an answer"
          + (f", a prefix cache of {setup['kv_blocks']} blocks an engine" if setup.get("kv_blocks") else ""))
    hosts = sorted({h for r in rows for h in r["share"]})
    print(f"{'routing':<11} {'TTFT p50 ms':>11} {'p95 ms':>8} {'req/s':>6} {'cache hits':>10} "
          + " ".join(f"{h:>8}" for h in hosts) + "  errors")
    def pct(value: float | None, digits: int) -> str:
        return "-" if value is None else f"{100 * value:.{digits}f} %"

    for r in rows:
        cache = r["prefix_cache"]
        rate = cache["hit_rate"] if cache["hit_rate"] is not None else cache["from_replies"]
        shares = " ".join(f"{pct(r['share'].get(h), 0):>8}" for h in hosts)
        print(f"{r['mode']:<11} {r['ttft_ms']['p50']:>11} {r['ttft_ms']['p95']:>8} {r['requests_per_s']:>6} "
              f"{pct(rate, 1):>10} {shares}  {len(r['errors'])}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inventory")
    parser.add_argument("--modes", default=",".join(MODES), help="routing modes, in order (default: all three)")
    parser.add_argument("--conversations", type=int, default=12)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=4, help="conversations at once (default 4)")
    parser.add_argument("--system-prompts", type=int, default=3)
    parser.add_argument("--system-words", type=int, default=700,
                        help="words a system prompt (default 700: the door reads the first message within the "
                             "first ~15 KB of a body)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--no-restore", action="store_true", help="leave the doors on the last mode")
    parser.add_argument("--kv-blocks", type=int, help="an eviction workload: each engine's prefix cache N blocks "
                                                      "(the whole inventory converged with it, then back)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - set(MODES):
        parser.error(f"--modes: a comma-separated list of {', '.join(MODES)}")
    if args.kv_blocks is not None and args.kv_blocks < 1:
        parser.error("--kv-blocks: 1 or more")
    runtime = FrontDoorRuntime.of(args.inventory)
    doors = [name for name, _ in runtime.doors]
    url, model, _ = bench_target(args.inventory)
    users = parse_settings(*runtime.doors[0]).front_door_users
    keys = [users[name].key for name in sorted(users)]
    guards = contextlib.ExitStack()
    client = guards.enter_context(guard_client(hosts_ca(load_hosts(args.inventory))))
    engines = engine_hosts(args.inventory, model, client)
    rows, converged = [], {}
    try:
        if args.kv_blocks:
            converged["small_cache"] = round(converge_all(args.inventory, small_cache(args.kv_blocks)), 1)
        for mode in modes:
            converged[mode] = round(converge_doors(args.inventory, doors, mode), 1)
            time.sleep(3)  # the reloaded door's first checks
            rows.append(run_mode(mode, args, url, model, keys, engines, runtime, client.session))
            print(f"{mode}: {json.dumps(rows[-1]['ttft_ms'])}, hit rate {rows[-1]['prefix_cache']['hit_rate']}, "
                  f"share {rows[-1]['share']} (door converged in {converged[mode]} s)", file=sys.stderr)
    finally:
        guards.close()
        if args.kv_blocks:  # the engines back on their own release, and the doors on the inventory's routing
            converged["restored"] = round(converge_all(args.inventory, []), 1)
        elif not args.no_restore:
            converged["restored"] = round(converge_doors(args.inventory, doors, None), 1)
    setup = {k: getattr(args, k) for k in ("conversations", "turns", "concurrency", "system_prompts",
                                           "system_words", "max_tokens", "kv_blocks")}
    if args.json:
        print(json.dumps({"setup": setup, "front_door": url, "converge_s": converged, "modes": rows}, indent=2))
    else:
        print_table(rows, setup)
    return 0


if __name__ == "__main__":
    sys.exit(main())
