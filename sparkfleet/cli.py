"""`sparkfleet ...` (or `python -m sparkfleet ...`): plan, roll out, check and measure a fleet."""

from __future__ import annotations

import argparse
import json
import sys

from rich.syntax import Syntax

from sparkfleet.fleet.inventory import load_hosts
from sparkfleet.model.hubs import hub_resolver
from sparkfleet.contract.recipes import catalogue
from sparkfleet.release.image import image_resolver
from sparkfleet.release.plan import plan_hosts
from sparkfleet.release.services import plan_rows
from sparkfleet.contract.settings import USER_SET_KEY, SettingsError
from sparkfleet.tables import console, literal, print_table

EXIT_INVALID = 2
INVALID = (SettingsError, FileNotFoundError, KeyError)  # bad inventory or settings: exit 2, nothing touched


def _invalid(exc: Exception) -> int:
    print(f"sparkfleet: invalid settings:\n{exc}", file=sys.stderr)
    return EXIT_INVALID


def _with_data(hosts: list[tuple[str, dict]], items: list[str]) -> list[tuple[str, dict]]:
    """`--data KEY=VALUE` over each host's data, as pyinfra's --data does: the keys count as set by the user."""
    data = _parse_data(items)
    return [(name, {**d, **data, USER_SET_KEY: sorted({*d.get(USER_SET_KEY, ()), *data})}) for name, d in hosts]


def _plan(args) -> int:
    try:
        plans = plan_hosts(_with_data(load_hosts(args.inventory, args.host), args.data),
                           resolve=None if args.offline else hub_resolver,
                           resolve_image=None if args.offline else image_resolver)
    except INVALID as exc:
        return _invalid(exc)
    if args.json:
        print(json.dumps({"hosts": [p.to_dict() for p in plans]}, indent=2))
        return 0
    out = console()
    for plan in plans:
        rows = [("recipe", plan.settings.recipe), ("image", plan.settings.engine_image),
                ("image pin", plan.image_pin.ref if plan.image_pin else f"[yellow]{literal(plan.image_error)}[/]"),
                ("engine args", literal(" ".join(plan.engine_args))), ("model dir", literal(plan.model_dir))] \
            + _group_rows(plan)
        if plan.manifest:
            m = plan.manifest.summary()
            model = f"{m['hub']}:{m['repo']}@{m['revision']} -> {m['commit'] or m['digest'][:16]}"
            rows += [("model", literal(model)),
                     ("files", f"{m['files']} files, {m['bytes'] / 1e9:.2f} GB")]
        else:
            rows.append(("model", f"[yellow]hub unreachable: {literal(plan.hub_error)}[/]"))
        rows += _fit_rows(plan) + plan_rows(plan)
        print_table(f"{plan.name}: release {plan.release_id or 'unresolved'}", ("key", "value"), rows,
                    header=False, out=out)
        units = ([plan.render_unit()] if plan.runs_engine else []) + ([plan.render_ray_unit()] if plan.group else [])
        for text in units:
            out.print(Syntax(text, "ini", word_wrap=True))
    return 0


def _group_rows(plan) -> list[tuple[str, str]]:
    """A group member's rows: its group, role and place on the fabric."""
    group = plan.group
    if not group:
        return []
    role = {"head": "head: Ray head and the group's vLLM", "worker": "worker: a Ray node; the head serves"}[plan.role]
    return [("group", f"{group.name} ({group.size} Sparks, tensor parallel over Ray)"), ("role", role),
            ("fabric", f"{group.address_of(plan.name)} on {group.interface} (MTU {group.mtu}); "
                       f"Ray at {group.ray_address}")]


def _fit_rows(plan) -> list[tuple[str, str]]:
    """The plan's memory and speed rows; what it cannot know when neither the hub nor a recipe has the model."""
    fit = plan.fit
    if not fit:
        return [("fit", f"[yellow]unknown: {literal(plan.unknown)}[/]")]
    gib = 1024**3
    source = {"manifest": "the hub's manifest", "recipe": f"recipe {plan.settings.recipe}, offline"}
    n = fit.tensor_parallel_size
    split = f"{fit.weights_bytes / gib:.1f} / {n} GPUs; " if n > 1 else ""
    weights = f"weights {fit.weights_per_gpu_bytes / gib:.1f} ({split}{source[plan.weights_source]})"
    rows = [
        ("memory" + (" per member" if n > 1 else ""),
         f"budget {fit.budget_bytes / gib:.1f} GiB = {weights} + reserve {fit.reserve_bytes / gib:.1f}"
         f" + KV {fit.kv_memory_bytes / gib:.1f} GiB"),
        ("KV cache" + (" per GPU" if n > 1 else ""), f"{fit.kv_bytes_per_token:,} B/token, linear state "
                     f"{fit.linear_state_bytes / 2**20:.1f} MiB/sequence; largest context "
                     f"{fit.largest_context:,}; {fit.seqs_at_max_model_len} sequences at "
                     f"{fit.max_model_len:,}, {fit.seqs_at_8192} at 8K"),
    ]
    if fit.num_speculative_tokens:
        rows.append(("draft (MTP)", f"{fit.draft_layers} MTP layer(s), {fit.num_speculative_tokens} draft tokens/step: "
                                    f"weights {fit.draft_weights_bytes / gib:.2f} GiB (inside the checkpoint's), "
                                    f"KV +{fit.draft_kv_bytes_per_token:,} B/token "
                                    f"({fit.max_model_len * fit.draft_kv_bytes_per_token / gib:.2f} GiB at "
                                    f"{fit.max_model_len:,}), linear state x{1 + fit.num_speculative_tokens}"))
    decode = f"<= {fit.decode_tokens_per_s_at_0:.1f} tokens/s (roofline at {fit.bandwidth_bytes_per_s / 1e9:g} GB/s)"
    chosen = catalogue().get(plan.settings.recipe)
    if chosen and chosen.model.repo == plan.settings.model_repo and "decode_tokens_per_s" in chosen.measured:
        decode += (f"; measured with this recipe: {chosen.measured['decode_tokens_per_s']} tokens/s "
                   f"({chosen.measured.get('source', 'no source given')})")
    if fit.num_speculative_tokens:
        decode += (f"; speculative decoding emits up to {1 + fit.num_speculative_tokens} tokens per step, "
                   f"so it may exceed this plain roofline")
    return rows + [("decode", decode)]


def _status(args) -> int:
    from sparkfleet.fleet.converge import read_hosts
    from sparkfleet.fleet.front_door import front_door_status, status_rows
    from sparkfleet.fleet.rollout import load_whole_groups
    from sparkfleet.fleet.status import (
        fleet_rows,
        host_cell,
        host_row,
        services_cell,
        ssh_facts,
    )
    from sparkfleet.host.serving import watchdog_cell
    from sparkfleet.release.group import plan_groups
    from sparkfleet.contract.settings import parse_settings

    try:
        hosts = dict(load_whole_groups(args.inventory, args.host))
        settings = {name: parse_settings(name, data) for name, data in hosts.items()}
        groups, problems = plan_groups(settings)
        if problems:
            raise SettingsError(problems)
    except INVALID as exc:
        return _invalid(exc)
    facts = read_hosts(args.inventory, list(hosts),
                       lambda h: ssh_facts(h, groups.get(h.name)))
    rows = fleet_rows(list(hosts), groups, facts,
                       lambda name: host_row(name, settings[name], hosts[name], facts[name], chat=args.chat))
    door = front_door_status(args.inventory)  # None: the inventory has no front door
    if args.json:
        print(json.dumps({"hosts": rows, **({"front_door": door} if door else {})}, indent=2))
    else:
        table = []
        for row in rows:
            m, f = row["metrics"], row["ssh"] or {}
            table.append((
                literal(host_cell(row)), *(literal(f.get(key) or "-") for key in ("driver", "cuda", "toolkit",
                                                                                  "release_id")),
                {True: "verified", False: "[red]NOT verified[/]"}.get(
                    f.get("model_verified"), "-"), "active" if f.get("unit_active") else "[red]inactive[/]",
                "[green]healthy[/]" if row["healthy"] else "[red]unhealthy[/]", watchdog_cell(f.get("watchdog")),
                literal(", ".join(map(str, row["served"] or []))), services_cell(f.get("services") or {}),
                f"{m.get('vllm:num_requests_running', 0):g}", f"{m.get('vllm:num_requests_waiting', 0):g}",
                f"{m.get('vllm:kv_cache_usage_perc', 0):.0%}", literal(row["error"] or ""),
            ))
        out = console()
        print_table("sparkfleet status", ("host", "driver", "CUDA", "toolkit", "release", "model", "unit", "health",
                                          "watchdog", "served", "services", "run", "wait", "KV", "detail"), table,
                    out=out)
        for row in rows:
            if row.get("chat"):
                out.print(f"[bold]{literal(row['host'])}[/] answers: {literal(row['chat'])}")
        if door:
            print_table("front door", ("front door / backend", "url", "state"), status_rows(door), out=out)
    return 0 if all(row["healthy"] for row in rows) and (door is None or door["up"]) else 1


def _print_reports(reports, as_json: bool) -> None:
    from sparkfleet.fleet.rollout import report_json

    if as_json:
        print(json.dumps(report_json(reports), indent=2))
        return
    rows = []
    for r in reports:
        color = {"converged": "green", "unchanged": "green", "rolled back": "yellow"}.get(r.result, "red")
        rows.append((r.host, literal(r.old_release or "-"), literal(r.new_release or "-"),
                     f"[{color}]{literal(r.result)}[/]", f"{r.seconds:g}", literal(r.detail)))
    print_table("sparkfleet rollout", ("host", "old release", "new release", "result", "seconds", "detail"), rows,
                stderr=True)


def _parse_data(items: list[str]) -> dict:
    from pyinfra_cli.util import parse_cli_arg

    return {k: parse_cli_arg(v) for k, _, v in (item.partition("=") for item in items)}


def _rollout(args) -> int:
    from sparkfleet.fleet.converge import read_hosts
    from sparkfleet.fleet.rollout import (
        batches,
        load_whole_groups,
        members_of,
        report_json,
        rollout,
        units,
    )
    from sparkfleet.host.facts import read_json_object
    from sparkfleet.contract.paths import RELEASE_FILE

    data = _parse_data(args.data)
    try:
        hosts = load_whole_groups(args.inventory, args.limit)
        plans = plan_hosts(_with_data(hosts, args.data), resolve=hub_resolver, resolve_image=image_resolver)
    except INVALID as exc:
        return _invalid(exc)
    names = [p.name for p in plans]
    groups = members_of(plans)
    try:
        batches(units(names, groups), args.batch, args.canary)
    except ValueError as exc:
        return _invalid(exc)
    installed = read_hosts(args.inventory, names, lambda h: read_json_object(h, RELEASE_FILE).value or {})
    releases = {p.name: ((installed[p.name] or {}).get("release_id"), p.release_id) for p in plans}
    reports = rollout(args.inventory, names, releases, batch=args.batch, canary=args.canary,
                      max_fail=args.max_fail, data=data, groups=groups, log=lambda m: print(m, file=sys.stderr))
    _print_reports(reports, args.json)
    return 0 if report_json(reports)["ok"] else 1


def _rollback(args) -> int:
    from sparkfleet.fleet.converge import run_deploy
    from sparkfleet.fleet.front_door import FrontDoorRuntime
    from sparkfleet.fleet.rollout import (
        HostReport,
        load_whole_groups,
        members_in_data,
        units,
    )

    try:
        hosts = load_whole_groups(args.inventory, args.limit)  # a group rolls back whole
        names = [name for name, _ in hosts]
        found = units(names, members_in_data(hosts))
    except (*INVALID, ValueError) as exc:
        return _invalid(exc)
    door = FrontDoorRuntime.of(args.inventory)  # none: no drain; a group's backend is its head
    door.drain([unit[0] for unit in found], log=lambda m: print(m, file=sys.stderr))
    results = run_deploy(args.inventory, names, deploy_file="rollback.py")
    door.ready([unit[0] for unit in found if all(results[h].ok for h in unit)],
               log=lambda m: print(m, file=sys.stderr))
    reports = [HostReport(n, None, None, "rolled back" if r.ok else "failed", detail="; ".join(r.failed))
               for n, r in results.items()]
    _print_reports(reports, args.json)
    return 0 if all(r.ok for r in results.values()) else 1


def _fetch(args) -> int:
    from sparkfleet.controller.copy import ControllerCopyError, controller_copy

    try:
        plans = plan_hosts(load_hosts(args.inventory, args.host), resolve=hub_resolver)
    except INVALID as exc:
        return _invalid(exc)
    done = set()
    for plan in plans:
        s = plan.settings
        if plan.manifest is None:
            print(f"sparkfleet: {plan.name}: {plan.hub_error}", file=sys.stderr)
            return 1
        if plan.manifest.digest in done:
            continue
        try:
            path = controller_copy(plan.manifest, s.controller_model_dir, s.controller_endpoint, token=s.hub_token)
        except ControllerCopyError as exc:
            print(f"sparkfleet: {exc}", file=sys.stderr)
            return 1
        done.add(plan.manifest.digest)
        print(f"{plan.manifest.repo}@{plan.manifest.pin}: {len(plan.manifest.files)} files verified in {path}")
    return 0


def _drain(args) -> int:
    """drain / undrain: a thin wrapper over fleet/front_door.py's drain_host and undrain_host."""
    from sparkfleet.fleet.front_door import DoorUnreachable, DrainRefused, drain_host, undrain_host

    act = drain_host if args.drained else undrain_host
    try:
        report = act(args.inventory, args.host, log=lambda m: print(m, file=sys.stderr))
    except SettingsError as exc:
        return _invalid(exc)
    except (DrainRefused, FileNotFoundError) as exc:
        print(f"sparkfleet: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except DoorUnreachable as exc:
        print(f"sparkfleet: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        doors = ", ".join(f"{d['host']} ({d['state']})" for d in report["front_doors"])
        kept = (f"kept out across reloads, converges and rollouts until `sparkfleet undrain {args.inventory} "
                f"{args.host}`" if args.drained else "it takes requests once its health checks pass")
        print(f"{args.host}: {'drained' if args.drained else 'undrained'} on front door {doors}; {kept}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparkfleet", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    plan = sub.add_parser("plan", help="print each host's release without connecting to anything")
    plan.add_argument("inventory")
    plan.add_argument("--host", help="one host (or group) of the inventory")
    plan.add_argument("--data", action="append", default=[], metavar="KEY=VALUE", help="override a setting")
    plan.add_argument("--json", action="store_true")
    plan.add_argument("--offline", action="store_true",
                      help="ask no hub: the recipe catalogue's model facts stand in for the manifest")
    plan.set_defaults(func=_plan)

    status = sub.add_parser("status", help="each host's health, served model and load; non-zero if any is down")
    status.add_argument("inventory")
    status.add_argument("--host", help="one host (or group) of the inventory")
    status.add_argument("--json", action="store_true")
    status.add_argument("--chat", action="store_true", help="also ask each host one chat completion")
    status.set_defaults(func=_status)

    roll = sub.add_parser("rollout", help="converge the fleet batch by batch; halt on failures, undo failed releases")
    roll.add_argument("inventory")
    roll.add_argument("--batch", default="1", help="hosts per batch: a number or a percentage (default 1)")
    roll.add_argument("--canary", action="store_true", help="the first host alone first")
    roll.add_argument("--max-fail", type=int, default=0, help="halt once more than K hosts failed (default 0)")
    roll.add_argument("--limit", help="one host or group of the inventory")
    roll.add_argument("--data", action="append", default=[], metavar="KEY=VALUE", help="override a setting")
    roll.add_argument("--json", action="store_true", help="print the report as JSON")
    roll.set_defaults(func=_rollout)

    back = sub.add_parser("rollback", help="switch hosts to their previous release (no download)")
    back.add_argument("inventory")
    back.add_argument("--limit", help="one host or group of the inventory")
    back.add_argument("--json", action="store_true")
    back.set_defaults(func=_rollback)

    fetch = sub.add_parser("fetch", help="make the controller's verified copy of each host's model "
                                          "(for model_source = \"controller\": air-gapped offices)")
    fetch.add_argument("inventory")
    fetch.add_argument("--host", help="one host (or group) of the inventory")
    fetch.set_defaults(func=_fetch)

    for name, drained, what in (("drain", True, "set HOST aside on every front door (its requests finish first) "
                                                 "and keep it out until undrained"),
                                ("undrain", False, "put a drained HOST back on every front door")):
        door = sub.add_parser(name, help=what)
        door.add_argument("inventory")
        door.add_argument("host", help="a host of the inventory that serves behind the front door")
        door.add_argument("--json", action="store_true")
        door.set_defaults(func=_drain, drained=drained)

    from sparkfleet.fleet import bench

    measure = sub.add_parser("bench", help="measure TTFT, TPOT and throughput at several concurrencies")
    bench.add_arguments(measure)
    measure.set_defaults(func=bench.main)

    args = parser.parse_args(argv)
    return args.func(args)
