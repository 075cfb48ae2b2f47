"""`python -m sparkfleet ...`: plan a fleet, run the simulated fleet."""

from __future__ import annotations

import argparse
import json
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


def _sim(args) -> int:
    from sim.fleet import main as sim_main

    return sim_main(args.sim_args) or 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparkfleet", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    plan = sub.add_parser("plan", help="print each host's release without connecting to anything")
    plan.add_argument("inventory")
    plan.add_argument("--host", help="one host (or group) of the inventory")
    plan.add_argument("--json", action="store_true")
    plan.set_defaults(func=_plan)

    sim = sub.add_parser("sim", help="the simulated fleet: up [--hosts N] | down | status", add_help=False)
    sim.add_argument("sim_args", nargs=argparse.REMAINDER)
    sim.set_defaults(func=_sim)

    args = parser.parse_args(argv)
    return args.func(args)
