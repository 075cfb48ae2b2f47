"""`sparkfleet plan INVENTORY`: each host's release, memory fit, units, front doors and topology advice, without
connecting to any host (the hubs are asked for what the lock lacks, unless `--offline`)."""

from __future__ import annotations

import json

from sparkfleet.commands import common

NAME = "plan"
HELP = "print each host's release without connecting to anything"


def arguments(parser) -> None:
    parser.add_argument("inventory")
    common.limit(parser)
    common.data(parser)
    common.as_json(parser)
    parser.add_argument("--offline", action="store_true",
                        help="ask no hub: the recipe catalogue's model facts stand in for the manifest")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also print the rendered files (the units, the front door's config); --json has them")


def run(args) -> int:
    from rich.syntax import Syntax

    from sparkfleet.roles.front_door.plan import door_rows, door_summary
    from sparkfleet.controller.inventory import load_hosts, locked_plans, with_data
    from sparkfleet.roles.pki import plans_ca
    from sparkfleet.release.plan import plan_hosts
    from sparkfleet.release.services import plan_rows
    from sparkfleet.tables import console, literal, print_table

    hosts = with_data(load_hosts(args.inventory, args.limit), args.data)
    plans = plan_hosts(hosts) if args.offline else locked_plans(hosts)
    plans_ca(plans)  # offline too: the fleet CA's files are the controller's
    checked = inventory_checks(args, hosts, plans)  # what the deploy would refuse, refused here first
    doors = [door_summary(door) for door in checked.doors if door.host in {p.name for p in plans}]
    ui = chat_ui_summary(checked.ui)
    found = topology(plans)
    if args.json:
        print(json.dumps({"hosts": [p.to_dict() for p in plans], **({"front_doors": doors} if doors else {}),
                          **({"chat_ui": ui} if ui else {}), **({"topology": found} if found else {})}, indent=2))
        return 0
    out = console()
    for plan in plans:
        if plan.is_service:
            print_table(f"{plan.name}: service host", ("key", "value"), [("role", service_roles(args, plan.name))],
                        header=False, out=out)
            continue
        rows = [("recipe", plan.settings.recipe), ("image", plan.settings.engine_image),
                ("image pin", plan.image_pin.ref if plan.image_pin else f"[yellow]{literal(plan.image_error)}[/]"),
                ("engine args", literal(" ".join(plan.engine_args))), ("model dir", literal(plan.model_dir))] \
            + group_rows(plan)
        if plan.manifest:
            m = plan.manifest.summary()
            model = f"{m['hub']}:{m['repo']}@{m['revision']} -> {m['commit'] or m['digest'][:16]}"
            rows += [("model", literal(model)),
                     ("files", f"{m['files']} files, {m['bytes'] / 1e9:.2f} GB")]
        else:
            rows.append(("model", f"[yellow]hub unreachable: {literal(plan.hub_error)}[/]"))
        rows += fit_rows(plan) + plan_rows(plan)
        print_table(f"{plan.name}: release {plan.release_id or 'unresolved'}", ("key", "value"), rows,
                    header=False, out=out)
        units = ([plan.render_unit()] if plan.runs_engine else []) + ([plan.render_ray_unit()] if plan.group else [])
        for text in units if args.verbose else ():
            out.print(Syntax(text, "ini", word_wrap=True))
    for door in doors:
        print_table(f"{door['host']}: front door", ("key", "value"), door_rows(door), header=False, out=out)
        if args.verbose:
            out.print(Syntax(door["config"], "text", word_wrap=True))
    if ui:
        print_table(f"{ui['host']}: chat UI (Open WebUI)", ("key", "value"), chat_ui_rows(ui), header=False, out=out)
    for advice in found:
        rows = [("advice", f"{advice['choice']} for {advice['expected_concurrency']} users (expected_concurrency)")]
        rows += [("why", literal(line)) for line in advice["reasons"]]
        rows += [("source", literal(source)) for source in advice["sources"]]
        which = " (any two of them)" if len(advice["hosts"]) > 2 else ""
        print_table(f"{', '.join(advice['hosts'])}: topology of {advice['model_repo']}{which}", ("key", "value"),
                    rows, header=False, out=out)
    out.print("summary" + ("" if args.verbose else " (the rendered units and configs: --verbose, or --json)") + ":")
    for plan in plans:
        out.print(literal(summary_line(plan, service_roles(args, plan.name) if plan.is_service else "")))
    return 0


def summary_line(plan, roles: str = "") -> str:
    """One line a host: whether the release fits its memory, the engine, whether its image is pinned by content,
    the names it serves (text, not markup)."""
    if plan.is_service:
        return f"{plan.name}: service host ({roles.split(':')[0] or 'no role'})"
    if plan.role == "worker":
        return f"{plan.name}: worker of {plan.group.name}, its head {plan.group.head} serves"
    fit = plan.fit
    fits = (f"fits ({fit.budget_bytes / 1024**3:.1f} GiB budget, largest context {fit.largest_context:,})" if fit
            else "fit unknown (no manifest or recipe for the model)")
    engine = f"{plan.engine.label} {plan.engine.version(plan.settings)}"
    image = "image pinned" if plan.image_pin else "image NOT pinned (its `image pin` row says why)"
    names = [plan.settings.served_model_name] + [svc.service.served_model_name for svc in plan.services]
    return f"{plan.name}: {fits}; {engine}; {image}; serves {', '.join(str(n) for n in names if n)}"


def topology(plans) -> list[dict]:
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


def service_roles(args, name: str) -> str:
    """What a service host serves, in words: its groups (front door, monitoring), no engine."""
    from sparkfleet.contract.settings import GROUPS_KEY
    from sparkfleet.controller.inventory import load_hosts

    groups = dict(load_hosts(args.inventory, name))[name].get(GROUPS_KEY, [])
    return f"{', '.join(g for g in groups if g != 'all')}: no GPU, model or engine; its own preflight"


def inventory_checks(args, hosts, plans):
    """The checks across hosts the deploy makes (controller/checks.py `check_inventory`: the chat UI, the front
    doors, the monitoring hosts, every host's guard and ports, the inventory's shape), on the whole inventory's plans
    (under a `--limit`, the rest planned as the selected hosts are)."""
    from sparkfleet.controller.checks import check_inventory
    from sparkfleet.controller.inventory import load_hosts, locked_plans, with_data
    from sparkfleet.release.plan import plan_hosts

    if args.limit:
        everyone = with_data(load_hosts(args.inventory), args.data)
        mine = {p.name: p for p in plans}
        # planned as the selected hosts are (offline only with --offline): an offline plan of a host whose recipe
        # brings the model's facts fits it against the recipe's checkpoint, not the one its hub serves
        rest = plan_hosts(everyone) if args.offline else locked_plans(everyone)
        return check_inventory(everyone, [mine.get(p.name, p) for p in rest])
    return check_inventory(hosts, plans)


def chat_ui_summary(ui) -> dict | None:
    """What `plan` shows of the chat UI: its host, its image (pinned from the lock at the deploy) and its ports:
    the doors' chat port people open, its host guard's listener the doors reach (Open WebUI itself on a socket)."""
    if ui is None:
        return None
    s = ui.settings
    return {"host": ui.host, "image": s.chat_ui_image, "door_port": s.chat_ui_port,
            "guard": ui.target, "tls": ui.tls}


def chat_ui_rows(ui: dict) -> list[tuple[str, str]]:
    from sparkfleet.tables import literal

    return [("image", literal(ui["image"])),
            ("people open", f"port {ui['door_port']} of each front door (chat_ui_port), signed in with their key"),
            ("doors reach", f"{literal(ui['guard'])} (chat_ui_host_port, its host's guard"
                            f"{', TLS' if ui['tls'] else ''}); Open WebUI listens on a unix socket only")]


def group_rows(plan) -> list[tuple[str, str]]:
    """A group member's rows: its group, role and place on the fabric."""
    group = plan.group
    if not group:
        return []
    role = {"head": f"head: Ray head and the group's {plan.engine.label}",
            "worker": "worker: a Ray node; the head serves"}[plan.role]
    return [("group", f"{group.name} ({group.size} Sparks, tensor parallel over Ray)"), ("role", role),
            ("fabric", f"{group.address_of(plan.name)} on {group.interface} (MTU {group.mtu}); "
                       f"Ray at {group.ray_address}")]


def fit_rows(plan) -> list[tuple[str, str]]:
    """The plan's memory and speed rows; what it cannot know when neither the hub nor a recipe has the model."""
    from sparkfleet.contract.recipes import catalogue
    from sparkfleet.tables import literal

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
