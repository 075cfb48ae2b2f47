"""`sparkfleet bench (INVENTORY [--limit NAME] [--front-door] | --url URL)`: TTFT, TPOT and throughput at several
concurrencies (fleet/bench.py `run_bench`), written to bench.json and bench.png."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from sparkfleet.refused import FAILED, Refused

NAME = "bench"
HELP = "measure TTFT, TPOT and throughput at several concurrencies"
# fleet/bench.py's defaults, written here so that building the parser imports no HTTP client (pyinfra's CLI patches
# the stdlib with gevent when a command first needs it; requests imported before that warns):
# tests/unit/test_commands.py checks that they agree.
DEFAULT_MODEL = "Qwen3.5-35B-A3B"
API_KEY_VARIABLE = "SPARKFLEET_API_KEY"
DEFAULT_CONCURRENCY = (1, 4, 8, 16)
DEFAULT_MAX_TOKENS = 512
DEFAULT_TIMEOUT_S = 300.0


def levels(text: str) -> list[int]:
    try:
        found = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 1,4,8,16, not {text!r}") from None
    if not found or any(c < 1 for c in found):
        raise argparse.ArgumentTypeError(f"concurrency levels must be positive integers, not {text!r}")
    return found


def tokens(text: str) -> int:
    """`--max-tokens`: decode speed needs two tokens (fleet/bench.py `run_bench`'s rule), checked before any request."""
    try:
        found = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}") from None
    if found < 2:
        raise argparse.ArgumentTypeError(f"{found}: give at least 2 (decode speed needs two tokens)")
    return found


def arguments(parser: argparse.ArgumentParser) -> None:
    """The `bench` subcommand's arguments."""
    parser.add_argument("target", nargs="?", help="an inventory: benchmark its first host (or --host)")
    parser.add_argument("--url", help="the server's URL (http://host:8000), instead of an inventory")
    parser.add_argument("--front-door", action="store_true",
                        help="with an inventory: through its front door, as its first user "
                             "(or $SPARKFLEET_API_KEY's)")
    parser.add_argument("--limit", help="with an inventory: which host (or group: its first host)")
    parser.add_argument("--host", dest="limit", help=argparse.SUPPRESS)  # the old name of --limit
    parser.add_argument("--model", help=f"served model name (default: the host's served_model_name, "
                                        f"or {DEFAULT_MODEL!r} with --url)")
    # Refused in run: a key on the command line is in `ps` and the shell's history.
    parser.add_argument("--api-key", dest="api_key_argument", help=argparse.SUPPRESS)
    parser.add_argument("--concurrency", type=levels, default=list(DEFAULT_CONCURRENCY),
                        help="comma-separated levels (default 1,4,8,16)")
    parser.add_argument("--max-tokens", type=tokens, default=DEFAULT_MAX_TOKENS,
                        help=f"tokens per request (default {DEFAULT_MAX_TOKENS})")
    parser.add_argument("--think", action=argparse.BooleanOptionalAction, default=False,
                        help="let the model think (default --no-think)")
    parser.add_argument("--requests", type=int, help="requests per level (default: 2 x level, at least 4)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help=f"seconds per request (default {DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--roofline", type=float,
                        help="decode roofline in tokens/s (default: from the inventory's model, when given)")
    parser.add_argument("--out", type=Path, default=Path("bench-results"),
                        help="where bench.json and bench.png go (default bench-results/)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON instead of the table")


def target(args) -> tuple[str, str, str | None, float | None, str | None]:
    """(url, model, api key, roofline, engine) from --url or the inventory's host (the engine None where only its
    /metrics can tell); refused (exit 2) when neither or both are given, or the host cannot be benchmarked so."""
    from sparkfleet.fleet import bench

    if bool(args.url) == bool(args.target):
        raise Refused("give an inventory or --url (one of them)")
    api_key = os.environ.get(API_KEY_VARIABLE) or None
    if args.url:
        return args.url, args.model or DEFAULT_MODEL, api_key, args.roofline, None
    if args.front_door:
        from sparkfleet.fleet.front_door.commands import bench_target

        url, model, key = bench_target(args.target)
        return url, args.model or model, api_key or key, args.roofline, None
    from sparkfleet.contract import paths
    from sparkfleet.contract.reach import api_url
    from sparkfleet.contract.settings import parse_settings
    from sparkfleet.controller.inventory import load_hosts, spark_hosts

    hosts = spark_hosts(load_hosts(args.target, args.limit))
    if not hosts:
        raise Refused(f"no Spark in {args.limit or args.target}: a service host serves no engine; bench a "
                      "Spark, or its front door with --front-door")
    name, data = hosts[0]
    s = parse_settings(name, data)
    if s.fleet_ca_cert and not s.backend_key_in_clear:  # its guard may answer only the fleet's certificates
        raise Refused(f"{name}: its guard serves the fleet's TLS only (a client certificate of the fleet CA): "
                      f"bench its front door with --front-door, or its engine through an SSH tunnel (ssh -L "
                      f"{s.api_port}:127.0.0.1:{paths.engine_port(s.api_port)} ...) and pass --url")
    url = api_url(name, s, data)
    if url is None:
        raise Refused(f"{name}: its API listens on loopback only: reach it through an SSH tunnel "
                      f"(ssh -L {s.api_port}:127.0.0.1:{s.api_port} ...) and pass --url")
    roofline = args.roofline if args.roofline is not None else bench._roofline(name, data, args.max_tokens)
    return url, args.model or s.served_model_name, api_key or s.api_key, roofline, s.engine


def run(args) -> int:
    """0 when every request succeeded, 1 otherwise; refused (2) on bad input, (1) when the server cannot be
    benchmarked (BenchError: the warm-up request failed)."""
    from sparkfleet.fleet import bench

    if args.api_key_argument is not None:
        raise Refused(f"--api-key is refused: a key on the command line is seen by every user of this machine (ps, "
                      f"shell history); set {API_KEY_VARIABLE}, or give an inventory (its api_key)")
    url, model, api_key, roofline, engine = target(args)
    try:
        result = bench.run_bench(url, model, api_key, args.concurrency, args.max_tokens, args.think,
                                 args.requests, roofline=roofline, timeout_s=args.timeout, engine=engine)
    except bench.BenchError as exc:
        raise Refused(str(exc), FAILED) from exc
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        bench.print_table(result)
    json_path, png_path = bench.write_outputs(result, args.out)
    print(f"wrote {json_path} and {png_path}", file=sys.stderr if args.json else sys.stdout)
    return 0 if result["errors"] == 0 else 1
