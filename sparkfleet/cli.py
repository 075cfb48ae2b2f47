"""`sparkfleet ...` (or `python -m sparkfleet ...`): set up an office, plan, roll out, check and measure a fleet."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from rich.syntax import Syntax

from sparkfleet import __version__
from sparkfleet.fleet.inventory import InventoryError, load_hosts, locked, spark_hosts
from sparkfleet.fleet.users import SecretsError
from sparkfleet.model.hubs import hub_resolver
from sparkfleet.contract.recipes import catalogue
from sparkfleet.release.image import image_resolver
from sparkfleet.release.lock import LockError
from sparkfleet.release.plan import plan_hosts
from sparkfleet.release.services import plan_rows
from sparkfleet.contract.settings import GROUPS_KEY, USER_SET_KEY, SettingsError
from sparkfleet.tables import console, literal, print_table

EXIT_INVALID = 2
# bad inventory, settings or secrets file: exit 2, nothing touched
INVALID = (SettingsError, FileNotFoundError, KeyError, SecretsError)


def _invalid(exc: Exception) -> int:
    if isinstance(exc, (InventoryError, LockError)):  # one line: the file and its own error
        print(f"sparkfleet: {exc}", file=sys.stderr)
        return EXIT_INVALID
    print(f"sparkfleet: invalid settings:\n{exc}", file=sys.stderr)
    return EXIT_INVALID


def _refuse(problem: Exception | str) -> int:
    """Bad input that is not a setting (a path, a name, a missing file): its one line, exit 2."""
    if isinstance(problem, KeyError) and problem.args:  # str(KeyError) is the repr of its message
        problem = problem.args[0]
    print(f"sparkfleet: {problem}", file=sys.stderr)
    return EXIT_INVALID


def _with_data(hosts: list[tuple[str, dict]], items: list[str]) -> list[tuple[str, dict]]:
    """`--data KEY=VALUE` over each host's data, as pyinfra's --data does: the keys count as set by the user."""
    data = _parse_data(items)
    return [(name, {**d, **data, USER_SET_KEY: sorted({*d.get(USER_SET_KEY, ()), *data})}) for name, d in hosts]


def _locked_plans(hosts: list[tuple[str, dict]], images: bool = True) -> list:
    """plan_hosts from the project's lock (what it lacks is resolved and added: fleet/inventory.py `locked`)."""
    with locked(hub_resolver, image_resolver) as lock:
        return plan_hosts(hosts, resolve=lock.model, resolve_image=lock.image if images else None)


def _plan(args) -> int:
    from sparkfleet.fleet.front_door.plan import door_rows, door_summary

    try:
        hosts = _with_data(load_hosts(args.inventory, args.limit), args.data)
        plans = plan_hosts(hosts) if args.offline else _locked_plans(hosts)
        doors = [door_summary(door) for door in _front_doors(args, plans)]
    except INVALID as exc:
        return _invalid(exc)
    topology = _topology(plans)
    if args.json:
        print(json.dumps({"hosts": [p.to_dict() for p in plans], **({"front_doors": doors} if doors else {}),
                          **({"topology": topology} if topology else {})}, indent=2))
        return 0
    out = console()
    for plan in plans:
        if plan.is_service:
            print_table(f"{plan.name}: service host", ("key", "value"), [("role", _service_roles(args, plan.name))],
                        header=False, out=out)
            continue
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
    for door in doors:
        print_table(f"{door['host']}: front door", ("key", "value"), door_rows(door), header=False, out=out)
        out.print(Syntax(door["config"], "text", word_wrap=True))
    for advice in topology:
        rows = [("advice", f"{advice['choice']} for {advice['expected_concurrency']} users (expected_concurrency)")]
        rows += [("why", literal(line)) for line in advice["reasons"]]
        rows += [("source", literal(source)) for source in advice["sources"]]
        which = " (any two of them)" if len(advice["hosts"]) > 2 else ""
        print_table(f"{', '.join(advice['hosts'])}: topology of {advice['model_repo']}{which}", ("key", "value"),
                    rows, header=False, out=out)
    return 0


def _recipe_summary(r) -> dict:
    """One catalogue entry as `sparkfleet recipes` shows it: the planner's fit on one Spark at the recipe's
    settings over group_data's defaults, and the measured speed with its source."""
    from sparkfleet.contract.formats import host_memory_bytes
    from sparkfleet.contract.settings import defaults
    from sparkfleet.model.fit import fit_report

    s = {**defaults(), **r.settings}
    entry = {"name": r.name, "kind": r.kind, "engine": r.engine, "model_repo": r.model.repo,
             "weights_gb": round(r.model.weight_bytes / 1e9, 2), "summary": r.summary}
    if r.kind != "chat":
        entry.update(sparks_needed=None, fit_problem="a service beside the chat model: `plan` sizes its share")
        return _with_measured(entry, r)
    try:
        max_pos = int((r.model.config.get("text_config") or r.model.config)["max_position_embeddings"])
        report = fit_report(r.model.config, r.model.weight_bytes, memory_bytes=host_memory_bytes(s["host_memory_gb"]),
                            gpu_memory_utilization=s["gpu_memory_utilization"],
                            max_model_len=min(s["max_model_len"], max_pos), kv_cache_dtype=s["kv_cache_dtype"],
                            bandwidth=s["memory_bandwidth_gbs"] * 1e9)
        entry["sparks_needed"] = 1 if report.fits else report.sparks_needed
        # The roofline reads the active weights' bytes from the parameter count: where that count's estimate
        # of all the weights is far from the recipe's bytes, fit.py does not read this checkpoint's format.
        if 0.8 <= report.estimated_weights_bytes / r.model.weight_bytes <= 1.25:
            entry["roofline_tokens_per_s"] = round(report.decode_tokens_per_s_at_0, 1)
        else:
            entry["roofline_problem"] = (f"the planner estimates {report.estimated_weights_bytes / 1e9:.1f} GB of "
                                         f"weights from the config, not {entry['weights_gb']:g}: it does not read "
                                         f"this format's layers or quantization yet")
    except (KeyError, TypeError, ValueError) as exc:
        entry.update(sparks_needed=None, fit_problem=str(exc))
    return _with_measured(entry, r)


def _with_measured(entry: dict, r) -> dict:
    if "decode_tokens_per_s" in r.measured:
        entry["measured"] = {"decode_tokens_per_s": r.measured["decode_tokens_per_s"],
                             "concurrency": r.measured.get("concurrency", 1),
                             "source": r.measured.get("source", "no source given")}
    return entry


def _recipes(args) -> int:
    try:
        entries = [_recipe_summary(r) for r in catalogue().values()]
    except ValueError as exc:  # a recipe file that cannot be read: its one line
        return _refuse(exc)
    if args.json:
        print(json.dumps({"recipes": entries}, indent=2))
        return 0

    def fits(e: dict) -> str:
        n = e["sparks_needed"]
        if e["kind"] != "chat":
            return "beside a chat model"
        return "one Spark" if n == 1 else f"needs {n} Sparks" if n else f"[yellow]unknown: {literal(e['fit_problem'])}[/]"

    def speed(e: dict) -> str:
        m = e.get("measured")
        bound = (f"roofline <= {e['roofline_tokens_per_s']:g}" if "roofline_tokens_per_s" in e
                 else "roofline n/a (--json says why)" if "roofline_problem" in e else "")
        if not m:
            return bound or "-"
        return f"{m['decode_tokens_per_s']:g} tokens/s ({literal(m['source'])}); {bound}".rstrip("; ")

    print_table("recipes (sparkfleet plan ... --data recipe=NAME)",
                ("recipe", "kind", "engine", "model", "weights", "fits", "decode, 1 stream"),
                [(e["name"], e["kind"], e["engine"], literal(e["model_repo"]), f"{e['weights_gb']:.1f} GB", fits(e),
                  speed(e)) for e in entries], out=console())
    return 0


def _topology(plans) -> list[dict]:
    """Advice for each model that fits one Spark where the inventory offers a pair: a tensor-parallel group of
    two, or two hosts (outside groups) serving the same model; only where `expected_concurrency` is set."""
    import dataclasses

    from sparkfleet.model.topology import advise

    def at(plan, n: int):
        return dataclasses.replace(plan, settings=plan.settings.model_copy(update={"tensor_parallel_size": n})).fit

    found, by_model = [], {}
    for plan in plans:
        if plan.is_service or not plan.runs_engine or plan.settings.expected_concurrency is None:
            continue
        if plan.group and plan.group.size == 2:
            found.append((list(plan.group.members), plan, at(plan, 1), plan.fit))
        elif not plan.group:
            by_model.setdefault((plan.settings.model_repo, plan.settings.engine), []).append(plan)
    found += [([p.name for p in same], same[0], same[0].fit, at(same[0], 2)) for same in by_model.values()
              if len(same) >= 2]
    out = []
    for hosts, plan, one, pair in found:
        advice = one and pair and advise(one, pair, plan.settings.expected_concurrency, plan.settings.engine)
        if advice:
            out.append({"hosts": hosts, "model_repo": plan.settings.model_repo, **advice.to_dict()})
    return out


def _service_roles(args, name: str) -> str:
    """What a service host serves, in words: its groups (front door, monitoring), no engine."""
    groups = dict(load_hosts(args.inventory, name))[name].get(GROUPS_KEY, [])
    return f"{', '.join(g for g in groups if g != 'all')}: no GPU, model or engine; its own preflight"


def _front_doors(args, plans) -> list:
    """The front doors among the planned hosts (group `front_door`), as the front door stage builds them: from
    the whole inventory's plans (under a `--limit`, the rest planned offline: a door's engines need no manifest)."""
    from sparkfleet.fleet.front_door.plan import planned_front_doors
    from sparkfleet.fleet.inventory import group_hosts
    from sparkfleet.contract import monitoring

    planned = {p.name: p for p in plans}
    names = [name for name, _ in group_hosts(args.inventory, monitoring.FRONT_DOOR_GROUP) if name in planned]
    if names and args.limit:
        planned = {p.name: p for p in plan_hosts(_with_data(load_hosts(args.inventory), args.data))}
    monitoring_hosts = frozenset(name for name, _ in group_hosts(args.inventory, monitoring.GROUP))
    return planned_front_doors(names, planned, monitoring_hosts)


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
    from sparkfleet.fleet.alerts import alerts_ok, fleet_alerts
    from sparkfleet.fleet.converge import read_hosts
    from sparkfleet.fleet.front_door.commands import front_door_status, status_rows
    from sparkfleet.fleet.front_door.holds import door_ok
    from sparkfleet.fleet.rollout import load_whole_groups
    from sparkfleet.fleet.status import fleet_rows, host_row, ssh_facts, status_table
    from sparkfleet.release.group import plan_groups
    from sparkfleet.contract.settings import parse_settings
    from sparkfleet.tables import narrow

    try:
        hosts = dict(spark_hosts(load_whole_groups(args.inventory, args.limit)))
        settings = {name: parse_settings(name, data) for name, data in hosts.items()}
        groups, problems = plan_groups(settings)
        if problems:
            raise SettingsError(problems)
    except INVALID as exc:
        return _invalid(exc)
    facts = read_hosts(args.inventory, list(hosts),
                       lambda h: ssh_facts(h, groups.get(h.name), settings[h.name]))
    rows = fleet_rows(list(hosts), groups, facts,
                      lambda name: host_row(name, settings[name], hosts[name], facts[name], chat=args.chat))
    door = front_door_status(args.inventory)  # None: the inventory has no front door
    alerts = fleet_alerts(args.inventory)  # None: the inventory has no monitoring host
    if args.json:
        print(json.dumps({"hosts": rows, **({"front_door": door} if door else {}),
                          **({"alerts": alerts} if alerts else {})}, indent=2))
    else:
        out = console()
        columns, cells = status_table(rows, wide=not narrow(out))
        print_table("sparkfleet status", columns, cells, out=out)
        for row in rows:
            if row.get("chat"):
                out.print(f"[bold]{literal(row['host'])}[/] answers: {literal(row['chat'])}")
        if door:
            print_table("front door", ("front door / backend", "url", "state"), status_rows(door), out=out)
        if alerts:
            for problem in alerts["problems"]:
                out.print(f"[red]{literal(problem)}[/]")
            if alerts["firing"]:
                print_table("alerts firing", ("alert", "host", "summary"),
                            [(literal(a["alert"]), literal(a["host"]), literal(a["summary"])) for a in alerts["firing"]],
                            out=out)
            elif not alerts["problems"]:
                out.print("alerts: none firing")
    healthy = all(row["healthy"] for row in rows) and (door is None or door_ok(door))
    return 0 if healthy and alerts_ok(alerts) else 1


def _usage(args) -> int:
    from sparkfleet.fleet.usage import HEADERS, fleet_usage, usage_rows

    if args.since:
        return _refuse("--since is not read by this sparkfleet yet: without it, usage counts since each front "
                       "door's last start or reload; for a window, ask Prometheus on the monitoring host "
                       "(sparkfleet_user_* series, docs/monitoring.md) or open the status page")
    try:
        found = fleet_usage(args.inventory)
    except KeyError as exc:
        return _refuse(exc)
    except INVALID as exc:
        return _invalid(exc)
    if args.json:
        print(json.dumps(found, indent=2))
    else:
        out = console()
        print_table("sparkfleet usage (since each front door's last start or reload)", HEADERS,
                    usage_rows(found["users"]), out=out)
        for door in found["doors"]:
            if not door["ok"]:
                out.print(f"[red]front door {literal(door['host'])} ({literal(door['url'])}): "
                          f"{literal(door['problem'])}[/]")
    return 0 if all(d["ok"] for d in found["doors"]) else 1


def _print_reports(reports, as_json: bool, speed_skipped: bool | None = None) -> None:
    """The rollout's (or rollback's) table and phases; for a rollout (`speed_skipped` not None) its speed gate."""
    from sparkfleet.fleet.rollout import phases, report_json

    if as_json:
        found = report_json(reports, bool(speed_skipped))
        if speed_skipped is None:
            del found["speed_gate"]
        print(json.dumps(found, indent=2))
        return
    rows = []
    for r in reports:
        color = {"converged": "green", "unchanged": "green", "rolled back": "yellow"}.get(r.result, "red")
        out = "-" if r.out_of_rotation_s is None else f"{r.out_of_rotation_s:g}"
        rows.append((r.host, literal(r.old_release or "-"), literal(r.new_release or "-"),
                     f"[{color}]{literal(r.result)}[/]", f"{r.seconds:g}", out, literal(r.detail)))
    print_table("sparkfleet rollout", ("host", "old release", "new release", "result", "seconds",
                                       "out of rotation s", "detail"), rows, stderr=True)
    found = phases(reports)
    stage, switch = found["stage"], found["switch"]
    if stage["hosts"] or switch["batches"]:
        print(f"phases: stage {len(stage['hosts'])} hosts in {stage['seconds']:g} s (all at once, before any drain), "
              f"switch {switch['batches']} batches in {switch['seconds']:g} s", file=sys.stderr)
    if speed_skipped is not None:
        _print_speed(reports, speed_skipped)


def _print_speed(reports, skipped: bool) -> None:
    """The speed gate's lines after a rollout's or an upgrade's table."""
    from sparkfleet.fleet.rollout import speed_summary

    gate = speed_summary(reports, skipped)
    lines = ["skipped (--no-speed-gate)"] if gate["skipped"] else \
        [f"{c['verdict']}: {c['line']}" for c in gate["checks"]] or ["nothing measured (no host changed)"]
    for line in lines:
        print(f"speed gate: {literal(line)}", file=sys.stderr)


def _parse_data(items: list[str]) -> dict:
    from pyinfra_cli.util import parse_cli_arg

    return {k: parse_cli_arg(v) for k, _, v in (item.partition("=") for item in items)}


def _rollout(args) -> int:
    from sparkfleet.fleet.converge import read_hosts
    from sparkfleet.fleet.rollout import (
        batches,
        holds_what_it_needs,
        load_whole_groups,
        members_of,
        report_json,
        rollout,
        service_hosts_last,
        units,
    )
    from sparkfleet.fleet.speed import SpeedGate
    from sparkfleet.host.facts import read_json_object
    from sparkfleet.contract.paths import RELEASE_FILE, SPEED_FILE

    data = _parse_data(args.data)
    try:
        hosts = dict(_with_data(load_whole_groups(args.inventory, args.limit), args.data))
        plans = _locked_plans(list(hosts.items()))
    except INVALID as exc:
        return _invalid(exc)
    service_names = [p.name for p in plans if p.is_service]  # converged after the batches, never drained
    plans = [p for p in plans if not p.is_service]
    names = [p.name for p in plans]
    groups = members_of(plans)
    try:
        batches(units(names, groups), args.batch, args.canary)
    except ValueError as exc:
        return _invalid(exc)
    found = read_hosts(args.inventory, names, lambda h: {
        "release": read_json_object(h, RELEASE_FILE).value or {},
        "speed": None if args.no_speed_gate else read_json_object(h, SPEED_FILE).value})
    installed = {name: (read or {}).get("release") for name, read in found.items()}
    releases = {p.name: ((installed[p.name] or {}).get("release_id"), p.release_id) for p in plans}
    prepared = {p.name for p in plans if holds_what_it_needs(p, installed[p.name] or {})}
    speed = None if args.no_speed_gate else SpeedGate(
        args.inventory, {p.name: (p.settings, hosts[p.name]) for p in plans},
        {name: (read or {}).get("speed") for name, read in found.items()}, installed)
    reports = rollout(args.inventory, names, releases, batch=args.batch, canary=args.canary,
                      max_fail=args.max_fail, data=data, groups=groups, prepared=prepared, speed=speed,
                      log=lambda m: print(m, file=sys.stderr))
    if report_json(reports)["ok"]:
        reports += service_hosts_last(args.inventory, service_names, data, log=lambda m: print(m, file=sys.stderr))
    _print_reports(reports, args.json, speed_skipped=args.no_speed_gate)
    return 0 if report_json(reports)["ok"] else 1


def _upgrade(args) -> int:
    from sparkfleet.fleet.rollout import batches, load_whole_groups, members_of, units
    from sparkfleet.contract.paths import RELEASE_FILE, SPEED_FILE
    from sparkfleet.fleet.converge import read_hosts
    from sparkfleet.fleet.speed import SpeedGate
    from sparkfleet.fleet.upgrade import report_json, survey, survey_json, upgrade
    from sparkfleet.host.facts import read_json_object
    from sparkfleet.host.pins import render_pins
    from sparkfleet.host.upgrade import refused_changes

    try:
        hosts = spark_hosts(load_whole_groups(args.inventory, args.limit))  # DGX OS updates: the Sparks'
        plans = _locked_plans(_with_data(hosts, args.data))
    except INVALID as exc:
        return _invalid(exc)
    names, groups = [p.name for p in plans], members_of(plans)
    try:
        batches(units(names, groups), args.batch, args.canary)
    except ValueError as exc:
        return _invalid(exc)
    refusals = {p.name: (lambda sim, p=p: refused_changes(p.name, p.settings, sim.changes, p.group is not None))
                for p in plans}
    found = survey(args.inventory, names, {p.name: render_pins(p.settings.platform_pins) for p in plans}, refusals)
    if args.dry:
        if args.json:
            print(json.dumps(survey_json(found), indent=2))
        else:
            rows = [(s.host, literal("\n".join(s.changes) or "-"), "yes" if s.reboot else "no",
                     literal("\n".join(([s.problem] if s.problem else []) + s.refused))) for s in found]
            print_table("sparkfleet upgrade --dry", ("host", "would change", "would reboot", "problem"), rows,
                        stderr=True)
        return 0 if survey_json(found)["ok"] else 1
    speed, releases = None, {}
    if not args.no_speed_gate:
        read = read_hosts(args.inventory, names, lambda h: {
            "release": read_json_object(h, RELEASE_FILE).value or {}, "speed": read_json_object(h, SPEED_FILE).value})
        installed = {name: (r or {}).get("release") for name, r in read.items()}
        releases = {name: (r or {}).get("release_id") for name, r in installed.items()}
        data_of = dict(_with_data(hosts, args.data))
        speed = SpeedGate(args.inventory, {p.name: (p.settings, data_of[p.name]) for p in plans},
                          {name: (r or {}).get("speed") for name, r in read.items()}, installed)
    reports = upgrade(args.inventory, found, batch=args.batch, canary=args.canary, max_fail=args.max_fail,
                      data=_parse_data(args.data), groups=groups, speed=speed, releases=releases,
                      log=lambda m: print(m, file=sys.stderr))
    if args.json:
        print(json.dumps(report_json(reports, args.no_speed_gate), indent=2))
    else:
        rows = [(r.host, f"[{'green' if r.ok else 'red'}]{literal(r.result)}[/]", literal("\n".join(r.changes) or "-"),
                 "yes" if r.rebooted else "no", f"{r.seconds:g}",
                 "-" if r.out_of_rotation_s is None else f"{r.out_of_rotation_s:g}", literal(r.detail)) for r in reports]
        print_table("sparkfleet upgrade", ("host", "result", "changed", "rebooted", "seconds", "out of rotation s",
                                           "detail"), rows, stderr=True)
        _print_speed(reports, args.no_speed_gate)
    return 0 if report_json(reports)["ok"] else 1


def _rollback(args) -> int:
    from sparkfleet.fleet.converge import run_deploy
    from sparkfleet.fleet.front_door.runtime import FrontDoorRuntime
    from sparkfleet.fleet.rollout import (
        HostReport,
        load_whole_groups,
        members_in_data,
        units,
    )

    try:
        hosts = spark_hosts(load_whole_groups(args.inventory, args.limit))  # a group rolls back whole
        names = [name for name, _ in hosts]
        found = units(names, members_in_data(hosts))
    except (*INVALID, ValueError) as exc:
        return _invalid(exc)
    door = FrontDoorRuntime.of(args.inventory)  # none: no drain; a group's backend is its head
    door.drain([unit[0] for unit in found], log=lambda m: print(m, file=sys.stderr), operation="rollback")
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
        plans = _locked_plans(spark_hosts(load_hosts(args.inventory, args.limit)), images=False)
    except INVALID as exc:
        return _invalid(exc)
    done, copies = set(), []
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
        copies.append({"repo": plan.manifest.repo, "pin": plan.manifest.pin, "files": len(plan.manifest.files),
                       "path": str(path)})
        if not args.json:
            print(f"{plan.manifest.repo}@{plan.manifest.pin}: {len(plan.manifest.files)} files verified in {path}")
    if args.json:
        print(json.dumps({"copies": copies}, indent=2))
    return 0


def _init(args) -> int:
    from sparkfleet.fleet.project import ProjectError, host_key_lines, init_project, parse_host

    try:
        sparks = [parse_host(text) for text in args.host]
        report = init_project(Path(args.dir), sparks, ssh_user=args.ssh_user,
                              secrets=Path(args.secrets) if args.secrets else None, force=args.force)
    except (ProjectError, SecretsError) as exc:
        return _refuse(exc)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
        return 0
    inventory = report.project / "inventory.py"
    print(f"wrote {report.project}/: inventory.py, deploy.py, group_data/all.py, known_hosts")
    print(f"secrets: {report.secrets} (0600, outside the project): "
          + ("kept as it was" if report.secrets_reused else "a new api_key, no users yet"))
    if report.tls:
        print(f"front door TLS: a self-signed certificate, {report.tls[0]}: clients trust that file "
              f"(e.g. SSL_CERT_FILE={report.tls[0]})")
    else:
        print("front door TLS: none (no openssl here): set front_door_tls_cert and front_door_tls_key in "
              f"{inventory} before adding users")
    print(f"SSH host keys ({report.project / 'known_hosts'}):")
    print("\n".join(host_key_lines(report.hosts)))
    print(f"next: sparkfleet users add {inventory} NAME; sparkfleet plan {inventory}")
    return 0


def _hostkeys(args) -> int:
    from sparkfleet.fleet.project import collect_host_keys, host_key_lines, host_key_targets

    try:
        targets, unchecked = host_key_targets(load_hosts(args.inventory, args.limit))
    except INVALID as exc:
        return _refuse(exc)
    if unchecked:
        return _refuse(f"{', '.join(unchecked)}: no ssh_known_hosts_file in {args.inventory}: set it (with "
                       "ssh_strict_host_key_checking = \"yes\"), so that a host's key has one place to go")
    results = {path: collect_host_keys(path, sparks) for path, sparks in targets.items()}
    if args.json:
        print(json.dumps({"known_hosts": {str(p): [r.to_dict() for r in rs] for p, rs in results.items()}},
                         indent=2))
    else:
        for path, found in results.items():
            print(f"SSH host keys ({path}):")
            print("\n".join(host_key_lines(found)))
    return 0 if all(r.state != "no answer" for rs in results.values() for r in rs) else 1


def _users(args) -> int:
    from sparkfleet.fleet import users

    try:
        path = users.secrets_path_of(args.inventory)
        doc = users.read_secrets(path)
        if args.action == "list":
            names = users.names(doc)
            print(json.dumps({"users": names}) if args.json else "\n".join(names), end="\n" if names or args.json else "")
            return 0
        if args.action == "limit":
            return _user_limit(args, users, path, doc)
        if args.action == "remove":
            new, key = users.remove(doc, args.name), None
        else:
            new, key = getattr(users, args.action)(doc, args.name)
        users.write_secrets(path, new)
    except SecretsError as exc:
        return _refuse(exc)
    converge = f"the next converge (sparkfleet rollout {args.inventory}, or pyinfra {args.inventory} deploy.py)"
    if args.json:
        print(json.dumps({"user": args.name, "action": args.action, **({"key": key} if key else {})}))
    elif key:
        print(key)
    if key:
        old = "; the old key works until then" if args.action == "rotate" else ""
        print(f"{args.name}'s key is shown once (above): give it to {args.name}; {converge} puts it on the front "
              f"door{old}", file=sys.stderr)
    else:
        print(f"removed {args.name} from {path}: their key answers 401 after {converge}", file=sys.stderr)
    return 0


def _user_limit(args, users, path, doc: dict) -> int:
    """`users limit`: a user's own limits in the secrets file (an option left out keeps its value; 0: the
    fleet-wide default)."""
    name = users.check_name(args.name)
    now = users.limits_of(doc).get(name, {})
    given = {"requests_per_minute": args.requests_per_minute, "max_concurrent": args.max_concurrent}
    wanted = {k: now.get(k) if v is None else (v or None) for k, v in given.items()}
    new = users.limit(doc, name, **wanted)
    users.write_secrets(path, new)
    if args.json:
        print(json.dumps({"user": name, "action": "limit", **wanted}))
    else:
        shown = {k: "the fleet default" if v is None else str(v) for k, v in wanted.items()}
        print(f"{name}: requests a minute {shown['requests_per_minute']}, at once {shown['max_concurrent']}; "
              f"the next converge (sparkfleet rollout {args.inventory}) puts it on the front door", file=sys.stderr)
    return 0


def _count(value: str) -> int:
    """A limit on the command line: a whole number >= 0 (0: back to the fleet-wide default)."""
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number >= 0")
    return int(value)


def _logs(args) -> int:
    import shutil

    from sparkfleet.contract.settings import parse_settings
    from sparkfleet.fleet.logs import UNITS, LogsError, logs_argv, pick_host

    try:
        data = pick_host(load_hosts(args.inventory), args.host)
        services = [] if args.unit in UNITS else sorted(parse_settings(args.host, data).services)
        argv = logs_argv(args.host, data, args.unit, services, lines=args.lines, follow=args.follow,
                         as_json=args.json)
    except SettingsError as exc:
        return _invalid(exc)
    except (*INVALID, LogsError) as exc:
        return _refuse(exc)
    if not shutil.which(argv[0]):
        return _refuse("no `ssh` on this machine: install OpenSSH's client")
    sys.stdout.flush()
    os.execvp(argv[0], argv)  # the journal streams straight to this terminal; Ctrl-C ends --follow


def _drain(args) -> int:
    """drain / undrain: a thin wrapper over fleet/front_door/commands.py's drain_host and undrain_host."""
    from sparkfleet.fleet.front_door.commands import DoorUnreachable, DrainRefused, drain_host, undrain_host

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


def _limit(parser: argparse.ArgumentParser) -> None:
    """`--limit` (pyinfra's word) for a host subset; `--host`, its old name, still accepted."""
    parser.add_argument("--limit", help="one host (or group) of the inventory")
    parser.add_argument("--host", dest="limit", help=argparse.SUPPRESS)


def _json(parser: argparse.ArgumentParser, help: str = "print JSON instead of the table") -> None:
    parser.add_argument("--json", action="store_true", help=help)


def _batched(parser: argparse.ArgumentParser) -> None:
    """A command that changes the fleet batch by batch (rollout, upgrade): the same batches, canary and halt rule."""
    parser.add_argument("inventory")
    parser.add_argument("--batch", default="1", help="hosts per batch: a number or a percentage (default 1)")
    parser.add_argument("--canary", action="store_true", help="the first host alone first")
    parser.add_argument("--max-fail", type=int, default=0, help="halt once more than K hosts failed (default 0)")
    parser.add_argument("--no-speed-gate", action="store_true",
                        help="measure nothing: the canary is not held to its previous decode rate and TTFT")
    _limit(parser)
    parser.add_argument("--data", action="append", default=[], metavar="KEY=VALUE", help="override a setting")
    _json(parser, "print the report as JSON")


def parser() -> argparse.ArgumentParser:
    from sparkfleet.fleet import bench
    from sparkfleet.fleet import update as lock_update
    from sparkfleet.fleet.logs import DEFAULT_LINES, UNITS

    top = argparse.ArgumentParser(prog="sparkfleet", description=__doc__)
    top.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = top.add_subparsers(dest="command", required=True)

    init = sub.add_parser("init", help="write a ready office project: inventory, deploy.py, secrets, host keys")
    init.add_argument("dir", help="the project directory (new or empty)")
    init.add_argument("--host", action="append", default=[], required=True, metavar="NAME=ADDRESS",
                      help="a Spark: its inventory name and address (once per Spark; the first runs the front door)")
    init.add_argument("--ssh-user", default="root", help="the SSH user on the Sparks (default root)")
    init.add_argument("--secrets", help="the keys file, outside the project and any git work tree "
                                        "(default ~/.config/sparkfleet/<dir name>.json)")
    init.add_argument("--force", action="store_true",
                      help="in a non-empty directory: rewrite inventory.py, deploy.py and group_data/all.py; "
                           "an existing secrets file is kept")
    _json(init, "print what was written as JSON")
    init.set_defaults(func=_init)

    keys = sub.add_parser("hostkeys", help="add the SSH host keys the inventory's known_hosts lacks; print them")
    keys.add_argument("inventory")
    _limit(keys)
    _json(keys)
    keys.set_defaults(func=_hostkeys)

    recipes = sub.add_parser("recipes", help="list the recipe catalogue: model, engine, weights, fit, measured speed")
    _json(recipes)
    recipes.set_defaults(func=_recipes)

    plan = sub.add_parser("plan", help="print each host's release without connecting to anything")
    plan.add_argument("inventory")
    _limit(plan)
    plan.add_argument("--data", action="append", default=[], metavar="KEY=VALUE", help="override a setting")
    _json(plan)
    plan.add_argument("--offline", action="store_true",
                      help="ask no hub: the recipe catalogue's model facts stand in for the manifest")
    plan.set_defaults(func=_plan)

    status = sub.add_parser("status", help="each host's health, served model and load; non-zero if any is down")
    status.add_argument("inventory")
    _limit(status)
    _json(status)
    status.add_argument("--chat", action="store_true", help="also ask each host one chat completion")
    status.set_defaults(func=_status)

    use = sub.add_parser("usage", help="per user and model at the front door: requests, errors, bytes, in flight, "
                                       "tokens, refusals")
    use.add_argument("inventory")
    _json(use)
    use.add_argument("--since", metavar="DURATION", help="a window of history (not read yet: refused)")
    use.set_defaults(func=_usage)

    roll = sub.add_parser("rollout", help="converge the fleet batch by batch; halt on failures, undo failed releases")
    _batched(roll)
    roll.set_defaults(func=_rollout)

    up = sub.add_parser("upgrade", help="upgrade the hosts' platform packages within the apt pins batch by batch, "
                                        "rebooting where needed; halt on the first failure")
    _batched(up)
    up.add_argument("--dry", action="store_true",
                    help="touch nothing: per host, the packages that would change and whether it would reboot")
    up.set_defaults(func=_upgrade)

    back = sub.add_parser("rollback", help="switch hosts to their previous release (no download)")
    back.add_argument("inventory")
    _limit(back)
    _json(back, "print the report as JSON")
    back.set_defaults(func=_rollback)

    fetch = sub.add_parser("fetch", help="make the controller's verified copy of each host's model "
                                          "(for model_source = \"controller\": air-gapped offices)")
    fetch.add_argument("inventory")
    _limit(fetch)
    _json(fetch, "print the copies made as JSON")
    fetch.set_defaults(func=_fetch)

    users = sub.add_parser("users", help="the front door's users: add, list, rotate or remove a key, set limits")
    actions = users.add_subparsers(dest="action", required=True)
    for action, text in (("add", "a new user: prints their key once"),
                         ("list", "the users' names (never their keys)"),
                         ("rotate", "a new key for a user: prints it once"),
                         ("remove", "take a user's key away"),
                         ("limit", "a user's own fair share at the front door (429 past it)")):
        one = actions.add_parser(action, help=text)
        one.add_argument("inventory")
        if action != "list":
            one.add_argument("name")
        if action == "limit":
            one.add_argument("--requests-per-minute", type=_count, metavar="N",
                             help="requests a minute before 429 (0: the fleet's front_door_requests_per_minute)")
            one.add_argument("--max-concurrent", type=_count, metavar="M",
                             help="requests at once before 429 (0: the fleet's front_door_max_concurrent)")
        _json(one, "print JSON")
        one.set_defaults(func=_users)

    logs = sub.add_parser("logs", help="a unit's journal on one host, over SSH")
    logs.add_argument("inventory")
    logs.add_argument("host", help="the inventory's name of the host")
    logs.add_argument("--unit", default="engine", metavar="|".join([*UNITS, "SERVICE"]),
                      help="which unit: the engine (default), watchdog, front-door, ray, guard, share, "
                           "or a RAG service's name")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines (Ctrl-C ends)")
    logs.add_argument("-n", "--lines", type=int, default=DEFAULT_LINES,
                      help=f"how many of the last lines (default {DEFAULT_LINES})")
    _json(logs, "journal entries as JSON, one per line (journalctl --output json)")
    logs.set_defaults(func=_logs)

    for name, drained, what in (("drain", True, "set HOST aside on every front door (its requests finish first) "
                                                 "and keep it out until undrained"),
                                ("undrain", False, "put a drained HOST back on every front door")):
        door = sub.add_parser(name, help=what)
        door.add_argument("inventory")
        door.add_argument("host", help="a host of the inventory that serves behind the front door")
        _json(door)
        door.set_defaults(func=_drain, drained=drained)

    update = sub.add_parser("update", help="re-resolve the lock's models and images: show what moves, write it")
    lock_update.add_arguments(update)
    update.set_defaults(func=lock_update.main)

    measure = sub.add_parser("bench", help="measure TTFT, TPOT and throughput at several concurrencies")
    bench.add_arguments(measure)
    measure.set_defaults(func=bench.main)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        code = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:  # `sparkfleet plan --json | head -1`: the reader has gone, so has our output
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's last flush, too
        return 1
    return code
