"""`sparkfleet recipes`: the recipe catalogue, each with the planner's fit on one Spark and its measured speed."""

from __future__ import annotations

import json

from sparkfleet.commands import common

NAME = "recipes"
HELP = "list the recipe catalogue: model, engine, weights, fit, measured speed"


def arguments(parser) -> None:
    common.as_json(parser)


def run(args) -> int:
    from sparkfleet.contract.recipes import catalogue
    from sparkfleet.tables import console, literal, print_table

    entries = [summary(r) for r in catalogue().values()]  # a recipe file that cannot be read: RecipeError, one line
    if args.json:
        print(json.dumps({"recipes": entries}, indent=2))
        return 0

    def fits(e: dict) -> str:
        n = e["sparks_needed"]
        if e["kind"] != "chat":
            return "beside a chat model"
        if not n:
            return f"[yellow]unknown: {literal(e['fit_problem'])}[/]"
        return "one Spark" if n == 1 else f"needs {n} Sparks"

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


def summary(r) -> dict:
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
        return with_measured(entry, r)
    max_pos = (r.model.config.get("text_config") or r.model.config).get("max_position_embeddings")
    if not isinstance(max_pos, int):
        entry.update(sparks_needed=None, fit_problem="config.json lacks 'max_position_embeddings' (a whole number): "
                                                     "cannot plan the fit")
        return with_measured(entry, r)
    try:
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
    except ValueError as exc:  # the fit's refusal of the config (e.g. "config.json lacks ..."); any other: a bug
        entry.update(sparks_needed=None, fit_problem=str(exc))
    return with_measured(entry, r)


def with_measured(entry: dict, r) -> dict:
    if "decode_tokens_per_s" in r.measured:
        entry["measured"] = {"decode_tokens_per_s": r.measured["decode_tokens_per_s"],
                             "concurrency": r.measured.get("concurrency", 1),
                             "source": r.measured.get("source", "no source given")}
    return entry
