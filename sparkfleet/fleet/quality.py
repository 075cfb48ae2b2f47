"""Answers, not only speed: each served model asked the probe suite (sparkfleet.quality) through its host's guard,
judged against its release's baseline, kept on the host.

What a host serves (`served_models`): its chat model on `api_port` (a tensor-parallel group's head only: a worker
serves nothing) and each service of `services` on its own port (chat, embedding, reranker), all behind the guard.
The controller asks them as `status` does (fleet/tls.py `guard_client`: the guard's URL, the backend key, the fleet's
client certificate where its hops are TLS); a port the controller does not reach (an API on loopback only, or a
service where a `controller_api_url` stands for the host) through an SSH forward to the guard's port on the host
(fleet/speed.py `forwarded`). One request at a time, at temperature 0: an evaluation never crowds the colleagues.

The record (contract/quality.py, contract/paths.py QUALITY_FILE): a release's first evaluation that served is its
baseline (never replaced; a model evaluated later for the first time is added), every evaluation its latest, which
`status` shows and the node exporter's textfile (contract/monitoring.py QUALITY_TEXTFILE) carries for the alert
QualityBelowBaseline. The judgement is sparkfleet.quality.compare `regressions` (a probe that passed and now fails,
or the score below the baseline's by more than `quality_margin`); a model not evaluated (down, 5xx) is reported as
such, never as a regression nor a pass.

`QualityGate` is what a rollout's or an upgrade's canary asks: `measure`, `baseline`, `keep`, `judge` (the halting
line). `sparkfleet eval` (commands/eval.py) runs `evaluate_hosts`.
"""

from __future__ import annotations

import datetime
import json
import shlex
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from sparkfleet.contract import monitoring, paths
from sparkfleet.contract.quality import Eval, Kept, metrics_text, parse_record, render_record, suite_path
from sparkfleet.contract.reach import api_reachable, http_url, ssh_address
from sparkfleet.contract.settings import Settings
from sparkfleet.quality.compare import regressions
from sparkfleet.quality.run import Evaluation, ProbeResult, evaluate
from sparkfleet.quality.suite import Suite, load_suite

# contract/serving.py's kinds -> the suite's `serves`
SERVES = {"chat": "chat", "embedding": "embedding", "reranker": "rerank"}
ASK_TIMEOUT_S = 120.0  # one probe's request: a long needle on a loaded Spark takes a while
DEFAULT_CONTEXT = 512  # a service whose context the recipes cannot tell: the smallest a pooling model has
OVERRIDE = "override with --no-quality-gate"


@dataclass(frozen=True)
class Served:
    """One model a host serves: its served name, the suite's kind for it, the guard's port, its context."""

    model: str
    serves: str  # chat | embedding | rerank (sparkfleet.quality.suite Probe.serves)
    port: int
    context_tokens: int
    service: str | None = None  # the `services` entry; None: the host's own chat model
    on_demand: bool = False  # started by its first request: an evaluation does not start it


def _service_context(name: str, service: str, s: Settings) -> int:
    """A service's context in tokens: its merged max_model_len, else its model's (the recipe's offline copy)."""
    from sparkfleet.model.config import model_shape
    from sparkfleet.release.services import merged

    if service not in s.services:
        return DEFAULT_CONTEXT
    recipe, merged_service, _, _ = merged(name, service, s)
    if merged_service is not None and merged_service.max_model_len:
        return merged_service.max_model_len
    try:
        return model_shape(recipe.model.config).max_position_embeddings if recipe else DEFAULT_CONTEXT
    except (KeyError, TypeError, ValueError, AttributeError):
        return DEFAULT_CONTEXT


def served_models(name: str, s: Settings, installed: dict | None = None) -> list[Served]:
    """What host `name` serves: as its settings plan it, or (`installed`: its release record, read back from the
    host, untrusted) as the release it runs does: the record's served names, kinds and ports where they are of the
    right type. The chat model first, then the services by name."""
    from sparkfleet.release.services import merged

    record = installed if isinstance(installed, dict) and installed else None  # none read: as the settings plan
    chat_name, port = s.served_model_name, s.api_port
    if record is not None:
        chat_name = record["served_model_name"] if isinstance(record.get("served_model_name"), str) else chat_name
        port = record["api_port"] if type(record.get("api_port")) is int else port
    found = [Served(chat_name, "chat", port, s.max_model_len)]
    if record is not None:
        services = record.get("services") if isinstance(record.get("services"), dict) else {}
        for service, entry in sorted(services.items()):
            if not (isinstance(entry, dict) and isinstance(entry.get("served_model_name"), str)
                    and type(entry.get("api_port")) is int and entry.get("kind") in SERVES):
                continue
            context = s.max_model_len if entry["kind"] == "chat" and service not in s.services else \
                _service_context(name, service, s)
            found.append(Served(entry["served_model_name"], SERVES[entry["kind"]], entry["api_port"], context,
                                service, isinstance(entry.get("on_demand"), dict)))
        return found
    for service in sorted(s.services):
        recipe, merged_service, _, _ = merged(name, service, s)
        if recipe is None or merged_service is None or recipe.kind not in SERVES:
            continue
        found.append(Served(str(merged_service.served_model_name), SERVES[recipe.kind],
                            int(merged_service.api_port or 0), _service_context(name, service, s), service,
                            merged_service.on_demand))
    return found


def for_serves(suite: Suite, serves: str) -> Suite:
    """The suite's probes for one kind of model (a chat model is never asked an embedding probe)."""
    return replace(suite, probes=suite.serving(serves))


def not_evaluated(suite: Suite, served: Served, why: str) -> Evaluation:
    """A model that was not asked (its guard out of reach, an idle on-demand model): each of its probes not
    evaluated, with why."""
    return Evaluation(served.model, served.serves, [ProbeResult(p.id, p.kind, "not_evaluated", "", why)
                                                    for p in for_serves(suite, served.serves).probes],
                      None, False, 0.0)


def asker(session, url: str, api_key: str | None, timeout_s: float = ASK_TIMEOUT_S):
    """sparkfleet.quality.run's Ask over the guard at `url`: (HTTP status, the JSON object or None, why not in
    words or None); never raises for a request that fails (that model is then not evaluated)."""
    import requests

    from sparkfleet.fleet.status import api_headers, in_words

    headers = api_headers(api_key)

    def ask(path: str, body: dict):
        try:
            reply = session.post(url + path, json=body, headers=headers, timeout=timeout_s)
        except requests.RequestException as exc:
            return None, None, in_words(exc)
        try:
            found = reply.json()
        except ValueError:
            found = None
        why = f"answered HTTP {reply.status_code}" if reply.status_code >= 400 else \
            None if isinstance(found, dict) else "the answer is not a JSON object"
        return reply.status_code, found if isinstance(found, dict) else None, why

    return ask


@contextmanager
def guard_url(client, name: str, s: Settings, data: dict, port: int):
    """The URL the controller asks the guard's `port` on host `name` at, for the block's length: the host's API
    (`api_url`, through `client`) for its own port; another port at the host's address where the controller reaches
    the host's API there; else an SSH forward to the guard on the host. Through `client.url` in every case, so the
    scheme and the guard's name check are the guard client's (fleet/tls.py)."""
    from sparkfleet.fleet.speed import forwarded

    if port == s.api_port and (url := client.url(name, s, data)):
        yield url
        return
    if api_reachable(s) and not s.controller_api_url:
        yield client.url(name, s.model_copy(update={"controller_api_url": http_url(ssh_address(name, data), port)}),
                         data)
        return
    with forwarded(name, data, port) as local:
        yield client.url(name, s.model_copy(update={"controller_api_url": local}), data)


def measure_host(name: str, s: Settings, data: dict, suite: Suite, client, installed: dict | None = None,
                 baseline: dict[str, Evaluation] | None = None) -> dict[str, Evaluation]:
    """Every model host `name` serves, evaluated: {served name: Evaluation}. `installed`: ask what its release
    record says it runs (else what `s` plans); `baseline`: its release's baseline, the exact probes' references."""
    from sparkfleet.fleet.speed import ReachError

    found = {}
    for served in served_models(name, s, installed):
        if served.on_demand:
            found[served.model] = not_evaluated(suite, served, "on demand: an evaluation does not start it")
            continue
        try:
            with guard_url(client, name, s, data, served.port) as url:
                found[served.model] = evaluate(for_serves(suite, served.serves), served.model, served.serves,
                                               asker(client.session, url, s.api_key), served.context_tokens,
                                               (baseline or {}).get(served.model))
        except ReachError as exc:
            found[served.model] = not_evaluated(suite, served, str(exc))
    return found


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _evaluations(entry: Eval | None) -> dict[str, Evaluation] | None:
    """A kept evaluation's models as Evaluations; one of the wrong shape (read back from a host) is left out."""
    if entry is None:
        return None
    found = {}
    for model, value in entry.models.items():
        try:
            found[model] = Evaluation.from_dict(value)
        except ValueError:
            continue
    return found or None


def below(baseline: dict[str, Evaluation] | None, evaluations: dict[str, Evaluation],
          margin: float) -> dict[str, list]:
    """{model: its regressions against the baseline} for each evaluated model the baseline holds (none: empty)."""
    found = {}
    for model, now_eval in evaluations.items():
        before = (baseline or {}).get(model)
        if before is not None and now_eval.evaluated and before.evaluated:
            found[model] = regressions(before, now_eval, margin)
    return {model: regs for model, regs in found.items() if regs}


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


class QualityGate:
    """What `sparkfleet eval` and a canary's quality gate ask: a release's baseline on a host, an evaluation of what
    it serves, keeping one, and the judgement.

    `hosts`: {name: (its planned settings, its inventory data)}; `records`: {name: its quality record as read back
    (None or {} when it has none)}; `installed`: {name: the release record of what it runs}; `ca`: the fleet CA
    where the guards serve TLS (roles/pki.py `hosts_ca`), None for plain hops; `probes`: a suite file over each
    host's `quality_probes`."""

    def __init__(self, inventory: str, hosts: dict[str, tuple[Settings, dict]], records: dict[str, dict | None],
                 installed: dict[str, dict | None] | None = None, ca=None, probes: str | Path | None = None):
        self.inventory = inventory
        self.hosts = hosts
        self.kept: dict[str, dict[str, Kept]] = {name: parse_record(record) for name, record in records.items()}
        self.installed = installed or {}
        self.ca = ca
        self.probes = probes
        self._suites: dict[str, Suite] = {}

    def margin(self, host: str) -> float:
        return self.hosts[host][0].quality_margin

    def suite(self, host: str) -> Suite:
        """The host's suite: --probes, else its `quality_probes`, else the packaged one (loaded once a file)."""
        path = self.probes if self.probes is not None else suite_path(self.hosts[host][0].quality_probes)
        key = str(path)
        if key not in self._suites:
            self._suites[key] = load_suite(path)
        return self._suites[key]

    def baseline(self, host: str, release: str | None) -> dict[str, Evaluation] | None:
        """The release's baseline on the host, per model; None when it has none."""
        kept = self.kept.get(host, {}).get(release) if release else None
        return _evaluations(kept.baseline) if kept else None

    def last(self, host: str, release: str | None) -> Eval | None:
        kept = self.kept.get(host, {}).get(release) if release else None
        return kept.last if kept else None

    def measure(self, host: str, running: bool = False,
                baseline: dict[str, Evaluation] | None = None) -> dict[str, Evaluation]:
        """Every model the host serves evaluated, as the planned release serves them, or (`running`) as the release
        it runs now does (its record's served names and ports). `baseline`: the references of the exact probes."""
        from sparkfleet.fleet.tls import guard_client

        s, data = self.hosts[host]
        with guard_client(self.ca) as client:
            return measure_host(host, s, data, self.suite(host), client,
                                (self.installed.get(host) or {}) if running else None, baseline)

    def judge(self, host: str, baseline: dict[str, Evaluation] | None,
              evaluations: dict[str, Evaluation], then: str | None = None) -> str | None:
        """The halting line (host, model, probe, both answers, `then`: what the command did about it, the override)
        of the first regression, or None: no evaluated model fell below its baseline (a model not evaluated is the
        caller's to report)."""
        for model, regs in below(baseline, evaluations, self.margin(host)).items():
            return _one_line(f"{host}: {model}: {regs[0].line()}; {f'{then}; ' if then else ''}{OVERRIDE}")
        return None

    def on_demand(self, host: str) -> set[str]:
        """The served names of the models the host's planned release starts on demand: an evaluation never starts
        one, so its "not evaluated" is no fault of the release."""
        return {m.model for m in served_models(host, self.hosts[host][0]) if m.on_demand}

    def keep(self, host: str, release: str, evaluations: dict[str, Evaluation]) -> bool:
        """Write the host's quality record with this evaluation as the release's latest (and its baseline where it
        has none yet and a model was evaluated), and its textfile for the node exporter, in one SSH round trip;
        whether it was written (a failure is reported, never fatal)."""
        from sparkfleet.fleet.converge import wrote_state_file

        kept = self.kept.get(host, {})
        baseline = self.baseline(host, release)
        worse = below(baseline, evaluations, self.margin(host))
        last = Eval(now(), {m: e.to_dict() for m, e in evaluations.items()},
                    {m: [r.probe for r in regs] for m, regs in worse.items()})
        evaluated = {m: e.to_dict() for m, e in evaluations.items() if e.evaluated}
        first = Eval(last.at, evaluated) if evaluated else None
        text = render_record(kept, release, last, first)
        metrics = metrics_text(last, monitoring.QUALITY_SCORE_METRIC, monitoring.QUALITY_BELOW_METRIC)
        ok = wrote_state_file(self.inventory, host, paths.QUALITY_FILE, text, also=textfile_command(metrics))
        if ok:
            self.kept[host] = parse_record(json.loads(text))
        return ok


def textfile_command(metrics: str) -> str:
    """The quality textfile put in place where the node exporter's directory is (a host of a monitored fleet)."""
    from sparkfleet.fleet.converge import replace_file_command

    return (f"{{ [ ! -d {shlex.quote(monitoring.TEXTFILE_DIR)} ] || "
            f"{{ {replace_file_command(monitoring.QUALITY_TEXTFILE, metrics)}; }}; }}")


# --- `sparkfleet eval` -------------------------------------------------------------------------------------------


@dataclass
class ModelReport:
    """One model's evaluation as `sparkfleet eval` reports it."""

    host: str
    evaluation: Evaluation
    verdict: str  # passed | regressed | baseline | not evaluated
    baseline_score: float | None = None
    lines: list[str] = field(default_factory=list)  # each regression, one line

    def to_dict(self) -> dict:
        return {"host": self.host, "model": self.evaluation.model, "verdict": self.verdict,
                "baseline_score": self.baseline_score, "regressions": self.lines, **self.evaluation.to_dict()}


@dataclass
class HostEval:
    host: str
    release: str | None
    models: list[ModelReport]
    kept: bool | None = None  # the record written; None: nothing to write (no release, nothing evaluated)
    seconds: float = 0.0
    skipped: str | None = None  # why the host was not evaluated at all (--due: evaluated recently)

    def to_dict(self) -> dict:
        return {"host": self.host, "release": self.release, "record_written": self.kept, "skipped": self.skipped,
                "seconds": round(self.seconds, 1), "models": [m.to_dict() for m in self.models]}


def report_host(gate: QualityGate, host: str, release: str | None,
                evaluations: dict[str, Evaluation]) -> list[ModelReport]:
    """Each model's verdict against the release's baseline (None: this evaluation is the baseline)."""
    baseline = gate.baseline(host, release)
    worse = below(baseline, evaluations, gate.margin(host))
    found = []
    for model, evaluation in evaluations.items():
        before = (baseline or {}).get(model)
        report = ModelReport(host, evaluation, "passed", before.score if before else None)
        if not evaluation.evaluated:
            report.verdict = "not evaluated"
        elif before is None or not before.evaluated:
            report.verdict = "baseline"
        elif model in worse:
            report.verdict = "regressed"
            report.lines = [_one_line(f"{host}: {model}: {r.line()}") for r in worse[model]]
        found.append(report)
    return found


def due(gate: QualityGate, host: str, release: str | None, at: float | None = None) -> str | None:
    """Why a periodic eval (--due) leaves the host alone now, or None: it is due. Off (`quality_eval_interval_s`
    0) never evaluates; else a host is due when its release's latest evaluation is that old, or it has none."""
    interval = gate.hosts[host][0].quality_eval_interval_s
    if not interval:
        return "periodic evaluation off (quality_eval_interval_s = 0)"
    last = gate.last(host, release)
    try:
        when = datetime.datetime.fromisoformat(last.at.replace("Z", "+00:00")).timestamp() if last else None
    except ValueError:
        when = None
    age = (time.time() if at is None else at) - when if when is not None else None
    if age is not None and age < interval:
        return f"evaluated {age / 60:.0f} min ago (quality_eval_interval_s {interval})"
    return None


def evaluate_hosts(gate: QualityGate, hosts: list[str], only_due: bool = False, log=None) -> list[HostEval]:
    """`sparkfleet eval`: each host's running release evaluated (one host, one model, one request at a time),
    judged against its baseline and kept (the first evaluation of a release that served is its baseline)."""
    found = []
    for host in hosts:
        release = (gate.installed.get(host) or {}).get("release_id")
        release = release if isinstance(release, str) else None
        skipped = due(gate, host, release) if only_due else None
        if skipped:
            found.append(HostEval(host, release, [], None, 0.0, skipped))
            continue
        if log:
            log(f"{host}: evaluating ...")
        started = time.monotonic()
        evaluations = gate.measure(host, running=True, baseline=gate.baseline(host, release))
        models = report_host(gate, host, release, evaluations)
        kept = gate.keep(host, release, evaluations) if release and any(
            e.evaluated for e in evaluations.values()) else None
        found.append(HostEval(host, release, models, kept, time.monotonic() - started))
    return found


def read_records(inventory: str, hosts: list[str]) -> tuple[dict[str, dict | None], dict[str, dict | None]]:
    """Each host's installed release record and its quality record, in one read: ({name: release}, {name: quality}),
    None for a host that did not answer over SSH."""
    from sparkfleet.fleet.converge import read_hosts
    from sparkfleet.host.facts import read_json_object

    found = read_hosts(inventory, hosts, lambda h: {"release": read_json_object(h, paths.RELEASE_FILE).value or {},
                                                    "quality": read_json_object(h, paths.QUALITY_FILE).value})
    return ({name: (read or {}).get("release") if read else None for name, read in found.items()},
            {name: (read or {}).get("quality") if read else None for name, read in found.items()})
