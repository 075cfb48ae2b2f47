"""`sparkfleet eval INVENTORY`: every served model asked the probe suite through its host's guard (fleet/quality.py),
each probe's verdict and the score against its release's baseline, kept on the host.

Exit status: 0 when every model was evaluated and none fell below its baseline (and each host's record was kept);
1 when a model failed a probe its baseline passed or its score fell by more than `quality_margin`, when a model
could not be asked ("not evaluated": down, 5xx, out of reach; never counted as a pass), or when a host's record
could not be written; 2 on bad input (a probe file that does not parse, a probe longer than a model's context).
With --due, a host whose last evaluation is younger than `quality_eval_interval_s` is skipped (not a failure)."""

from __future__ import annotations

import json
import sys

from sparkfleet.commands import common

NAME = "eval"
HELP = "ask every served model the probe suite; non-zero if one answers below its release's baseline"


def arguments(parser) -> None:
    parser.add_argument("inventory")
    common.limit(parser)
    parser.add_argument("--probes", metavar="FILE",
                        help="a probe suite file (default: each host's quality_probes, else the packaged suite)")
    parser.add_argument("--due", action="store_true",
                        help="only the hosts whose last evaluation is older than quality_eval_interval_s (0: none); "
                             "for the controller's cron or timer")
    common.as_json(parser)


def rows(hosts) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]]:
    """(a row per probe: host, model, probe, kind, verdict, answer or why; a row per model: host, model, serves,
    score, baseline, verdict)."""
    from sparkfleet.tables import literal

    color = {"pass": "green", "fail": "red", "not_evaluated": "yellow"}
    verdicts = {"passed": "green", "baseline": "green", "regressed": "red", "not evaluated": "yellow"}
    probes, models = [], []
    for host in hosts:
        for m in host.models:
            e = m.evaluation
            for r in e.results:
                said = r.answer if r.verdict == "pass" or not r.why else f"{r.why}: {r.answer}" if r.answer else r.why
                probes.append((literal(host.host), literal(e.model), literal(r.id), literal(r.kind),
                               f"[{color.get(r.verdict, 'red')}]{literal(r.verdict)}[/]", literal(said, 100)))
            score = "-" if e.score is None else f"{e.score:.2f}"
            before = "-" if m.baseline_score is None else f"{m.baseline_score:.2f}"
            models.append((literal(host.host), literal(e.model), literal(e.serves), score, before,
                           f"[{verdicts.get(m.verdict, 'red')}]{literal(m.verdict)}[/]"))
    return probes, models


def run(args) -> int:
    from sparkfleet.fleet.quality import QualityGate, evaluate_hosts, read_records
    from sparkfleet.fleet.status import quiet_connections
    from sparkfleet.tables import clean, print_table

    sparks = common.planned_sparks(args.inventory, args.limit)
    ca, hosts, settings, groups = sparks.ca, sparks.hosts, sparks.settings, sparks.groups
    serving = [name for name in hosts if name not in groups or groups[name].head == name]  # a worker serves none
    quiet_connections()
    installed, records = read_records(args.inventory, serving)
    gate = QualityGate(args.inventory, {name: (settings[name], hosts[name]) for name in serving}, records, installed,
                       ca=ca, probes=args.probes)
    for name in serving:  # every suite read before any model is asked: a file that does not parse is refused (2)
        gate.suite(name)
    found = evaluate_hosts(gate, serving, only_due=args.due, log=None if args.json else common.log)
    if args.json:
        print(json.dumps({"hosts": [h.to_dict() for h in found]}, indent=2))
    else:
        probes, models = rows(found)
        print_table("sparkfleet eval: probes", ("host", "model", "probe", "kind", "verdict", "answer"), probes)
        print_table("sparkfleet eval", ("host", "model", "serves", "score", "baseline", "verdict"), models)
    ok = True
    for host in found:
        for line in problem_lines(host):
            print(clean(line), file=sys.stderr)
        if not host.skipped:
            ok = ok and host.release is not None and host.kept is not False and all(
                m.verdict in ("passed", "baseline") for m in host.models)
    return 0 if ok else 1


def problem_lines(host) -> list[str]:
    """What the tables leave to a line: each regression, each model not evaluated and why, a host skipped or whose
    record was not kept."""
    lines = [line for m in host.models for line in m.lines]
    for m in host.models:
        if m.verdict == "not evaluated":
            why = next((r.why for r in m.evaluation.results if r.why), "no probe for what it serves")
            lines.append(f"{host.host}: {m.evaluation.model}: not evaluated ({why})")
    if host.skipped:
        lines.append(f"{host.host}: skipped: {host.skipped}")
    elif host.release is None:
        lines.append(f"{host.host}: its release record was not read over SSH: nothing kept")
    elif host.kept is False:
        lines.append(f"{host.host}: its quality record could not be written over SSH")
    return lines
