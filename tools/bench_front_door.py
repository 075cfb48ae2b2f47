"""What the front door adds to time-to-first-token: the same streamed chat through it and straight to an engine.

    python -m tools.bench_front_door INVENTORY [--requests N] [--user NAME] [--json]
    python -m tools.bench_front_door INVENTORY --chat     # one chat through the front door (make demo)

Requests alternate between the front door (with a user's key) and the engines behind it (round robin, with
the engines' key), one at a time, each with its own prompt; TTFT is the time to the first streamed token.
This is a benchmark, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import pyinfra_cli  # noqa: F401  (first, as sparkfleet's main() does: gevent patches ssl before requests imports it)
import requests

from sparkfleet.fleet.front_door.commands import bench_target
from sparkfleet.controller.inventory import load_hosts, spark_hosts
from sparkfleet.contract.reach import api_url
from sparkfleet.contract.settings import parse_settings


def ttft_ms(url: str, key: str, model: str, prompt: str) -> float:
    """Milliseconds from sending a streamed chat completion to its first token (answer or reasoning)."""
    started = time.perf_counter()
    with requests.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, stream=True,
                       timeout=60, json={"model": model, "max_tokens": 4, "stream": True,
                                         "messages": [{"role": "user", "content": prompt}]}) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            delta = json.loads(line[6:])["choices"][0]["delta"] if line.startswith(b"data: {") else {}
            if any(delta.get(field) for field in ("content", "reasoning", "reasoning_content")):
                return (time.perf_counter() - started) * 1000
    raise RuntimeError(f"{url}: the stream ended without a token")


def engines(inventory: str, model: str) -> list[tuple[str, str]]:
    """(url, key) of each engine serving `model`, as the controller reaches it."""
    out = []
    for name, data in spark_hosts(load_hosts(inventory)):  # a service host serves no engine
        s = parse_settings(name, data)
        url = api_url(name, s, data)
        if s.served_model_name == model and url:
            out.append((url, s.api_key or "none"))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inventory")
    parser.add_argument("--requests", type=int, default=60, help="requests each way (default 60)")
    parser.add_argument("--user", help="front_door_users name (default: the first)")
    parser.add_argument("--chat", action="store_true", help="ask one question through the front door and stop")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    url, model, key = bench_target(args.inventory, args.user)
    if args.chat:
        reply = requests.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=60,
                              json={"model": model, "max_tokens": 24,
                                    "messages": [{"role": "user", "content": "Say hello from the front door."}]})
        reply.raise_for_status()
        print(f"front door {url} answers: {reply.json()['choices'][0]['message']['content']}")
        return 0
    direct = engines(args.inventory, model)
    door_ms, direct_ms = [], []
    for n in range(args.requests):
        engine_url, engine_key = direct[n % len(direct)]
        door_ms.append(ttft_ms(url, key, model, f"front door request {n} at {time.time()}"))
        direct_ms.append(ttft_ms(engine_url, engine_key, model, f"direct request {n} at {time.time()}"))
    result = {"front_door": url, "requests": args.requests, "ttft_p50_ms_front_door": statistics.median(door_ms),
              "ttft_p50_ms_direct": statistics.median(direct_ms)}
    result["added_ttft_p50_ms"] = result["ttft_p50_ms_front_door"] - result["ttft_p50_ms_direct"]
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"TTFT p50 over {args.requests} streamed requests each: front door "
              f"{result['ttft_p50_ms_front_door']:.1f} ms, direct {result['ttft_p50_ms_direct']:.1f} ms: "
              f"the front door adds {result['added_ttft_p50_ms']:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
