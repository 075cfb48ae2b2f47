"""`python -m sparkfleet ...`: plan a fleet, run the simulated fleet."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from rich.console import Console
from rich.syntax import Syntax
from rich.table import Table

from .inventory import load_hosts
from .plan import plan_hosts
from .settings import SettingsError

EXIT_INVALID = 2


def _plan(args) -> int:
    try:
        plans = plan_hosts(load_hosts(args.inventory, args.host))
    except (SettingsError, FileNotFoundError, KeyError) as exc:
        print(f"sparkfleet: invalid settings:\n{exc}", file=sys.stderr)
        return EXIT_INVALID
    if args.json:
        print(json.dumps({"hosts": [p.to_dict() for p in plans]}, indent=2))
        return 0
    console = Console()
    for plan in plans:
        table = Table(title=f"{plan.name}: release {plan.release_id or 'unresolved'}", show_header=False)
        table.add_row("image", plan.settings.engine_image)
        table.add_row("engine args", " ".join(plan.engine_args))
        table.add_row("model dir", plan.model_dir)
        if plan.manifest:
            m = plan.manifest.summary()
            table.add_row("model", f"{m['hub']}:{m['repo']}@{m['revision']} -> {m['commit'] or m['digest'][:16]}")
            table.add_row("files", f"{m['files']} files, {m['bytes'] / 1e9:.2f} GB")
        else:
            table.add_row("model", f"[yellow]hub unreachable: {plan.hub_error}[/]")
        console.print(table)
        console.print(Syntax(plan.render_unit(), "ini", word_wrap=True))
    return 0


def _status(args) -> int:
    from .settings import parse_settings
    from .status import host_status

    try:
        hosts = load_hosts(args.inventory, args.host)
        rows = [host_status(name, parse_settings(name, data), data, chat=args.chat) for name, data in hosts]
    except (SettingsError, FileNotFoundError, KeyError) as exc:
        print(f"sparkfleet: invalid settings:\n{exc}", file=sys.stderr)
        return EXIT_INVALID
    if args.json:
        print(json.dumps({"hosts": rows}, indent=2))
    else:
        table = Table(title="sparkfleet status")
        for column in ("host", "health", "served", "running", "waiting", "KV cache", "detail"):
            table.add_column(column)
        for row in rows:
            m = row["metrics"]
            table.add_row(
                row["host"], "[green]healthy[/]" if row["healthy"] else "[red]unhealthy[/]",
                ", ".join(row["served"] or []), f"{m.get('vllm:num_requests_running', 0):g}",
                f"{m.get('vllm:num_requests_waiting', 0):g}", f"{m.get('vllm:kv_cache_usage_perc', 0):.1%}",
                row["error"] or row["url"],
            )
        console = Console()
        console.print(table)
        for row in rows:
            if row.get("chat"):
                console.print(f"[bold]{row['host']}[/] answers: {row['chat']}")
    return 0 if all(row["healthy"] for row in rows) else 1


def _fetch(args) -> int:
    from .controller_copy import ControllerCopyError, controller_copy

    try:
        plans = plan_hosts(load_hosts(args.inventory, args.host))
    except (SettingsError, FileNotFoundError, KeyError) as exc:
        print(f"sparkfleet: invalid settings:\n{exc}", file=sys.stderr)
        return EXIT_INVALID
    done = set()
    for plan in plans:
        s = plan.settings
        if plan.manifest is None:
            print(f"sparkfleet: {plan.name}: {plan.hub_error}", file=sys.stderr)
            return 1
        if plan.manifest.digest in done:
            continue
        try:
            path = controller_copy(plan.manifest, s.controller_model_dir, s.controller_endpoint)
        except ControllerCopyError as exc:
            print(f"sparkfleet: {exc}", file=sys.stderr)
            return 1
        done.add(plan.manifest.digest)
        print(f"{plan.manifest.repo}@{plan.manifest.pin}: {len(plan.manifest.files)} files verified in {path}")
    return 0


def _sim(args) -> int:
    from sim.fleet import main as sim_main

    return sim_main(args.sim_args) or 0


def main(argv: list[str] | None = None) -> int:
    logging.getLogger("modelscope_hub").setLevel(logging.ERROR)  # we report hub failures ourselves
    parser = argparse.ArgumentParser(prog="python -m sparkfleet", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    plan = sub.add_parser("plan", help="print each host's release without connecting to anything")
    plan.add_argument("inventory")
    plan.add_argument("--host", help="one host (or group) of the inventory")
    plan.add_argument("--json", action="store_true")
    plan.set_defaults(func=_plan)

    status = sub.add_parser("status", help="each host's health, served model and load; non-zero if any is down")
    status.add_argument("inventory")
    status.add_argument("--host", help="one host (or group) of the inventory")
    status.add_argument("--json", action="store_true")
    status.add_argument("--chat", action="store_true", help="also ask each host one chat completion")
    status.set_defaults(func=_status)

    fetch = sub.add_parser("fetch", help="make the controller's verified copy of each host's model "
                                          "(for model_source = \"controller\": air-gapped offices)")
    fetch.add_argument("inventory")
    fetch.add_argument("--host", help="one host (or group) of the inventory")
    fetch.set_defaults(func=_fetch)

    sim = sub.add_parser("sim", help="the simulated fleet: up [--hosts N] | down | status", add_help=False)
    sim.add_argument("sim_args", nargs=argparse.REMAINDER)
    sim.set_defaults(func=_sim)

    args = parser.parse_args(argv)
    return args.func(args)
