"""The quality record a host keeps (contract/paths.py QUALITY_FILE): per release, the first evaluation of its answers
(its baseline) and its latest, each per served model, by release id.

    {"releases": {"<release id>": {
        "baseline": {"at": "...Z", "models": {"<served name>": {<sparkfleet.quality.run Evaluation.to_dict()>}}},
        "last": {"at": "...Z", "models": {...}, "below": {"<served name>": ["<probe id>", ...]}}}}}

`below` names, per model, the probes of the latest evaluation that fell below the baseline (the gate's judgement:
sparkfleet.quality.compare `regressions`, "score" for a score below it by more than the margin). Written by the
controller (`sparkfleet eval`, the gate: fleet/quality.py) in one command, read back as the next evaluation's
baseline and by `status`. Read back from a host it is untrusted: an entry of the wrong shape counts for nothing,
and an evaluation's own shape is judged by `Evaluation.from_dict` above this layer (here it is only a JSON object).

The node exporter's textfile (contract/monitoring.py QUALITY_TEXTFILE) carries each model's last score and whether
it is below its baseline (`metrics_text`), for the alert QualityBelowBaseline.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import sparkfleet
from sparkfleet.contract.speed import RELEASE_ID

KEEP = 4  # releases a record remembers (the newest): a rollback's target is among them
MAX_BYTES = 96_000  # the record travels in one shell argument (a host's limit is 128 KiB): older releases give way
MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/+-]{0,199}")  # a served name (contract/settings.py ServedName)
PROBE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}")  # a probe id, as a label value and in a line


@dataclass(frozen=True)
class Eval:
    """One evaluation of a host's models: when, each model's evaluation (a JSON object), and per model the probes
    below the baseline."""

    at: str
    models: dict[str, dict]
    below: dict[str, list[str]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"at": self.at, "models": self.models, **({"below": self.below} if self.below else {})}


@dataclass(frozen=True)
class Kept:
    """A release's baseline (its first evaluation that served) and latest evaluation; either may be missing."""

    baseline: Eval | None = None
    last: Eval | None = None

    def to_dict(self) -> dict:
        return {k: v.to_dict() for k, v in (("baseline", self.baseline), ("last", self.last)) if v is not None}


def _eval(entry) -> Eval | None:
    if not isinstance(entry, dict) or not isinstance(entry.get("models"), dict):
        return None
    at = entry.get("at")
    models = {name: found for name, found in entry["models"].items()
              if isinstance(name, str) and MODEL.fullmatch(name) and isinstance(found, dict)}
    below_in = entry.get("below")
    below = {name: [p for p in probes if isinstance(p, str) and PROBE.fullmatch(p)]
             for name, probes in (below_in.items() if isinstance(below_in, dict) else ())
             if name in models and isinstance(probes, list)}
    return Eval(at if isinstance(at, str) and at.isprintable() and len(at) <= 40 else "", models,
                {name: probes for name, probes in below.items() if probes})


def parse_record(record) -> dict[str, Kept]:
    """{release id: Kept} from a record read back from a host; what does not fit the format is left out."""
    releases = record.get("releases") if isinstance(record, dict) else None
    found = {}
    for release, entry in (releases.items() if isinstance(releases, dict) else ()):
        if not (isinstance(release, str) and RELEASE_ID.fullmatch(release) and isinstance(entry, dict)):
            continue
        kept = Kept(_eval(entry.get("baseline")), _eval(entry.get("last")))
        if kept.baseline or kept.last:
            found[release] = kept
    return found


def render_record(kept: dict[str, Kept], release: str, last: Eval, baseline: Eval | None = None,
                  keep: int = KEEP, max_bytes: int = MAX_BYTES) -> str:
    """The record's text: `kept` with `release`'s latest evaluation set to `last`, and `baseline`'s models added to
    its baseline where it has none of them yet (a model's baseline once recorded is never replaced), that release
    placed last; only the `keep` newest releases, fewer where the text would pass `max_bytes` (the newest stays)."""
    if not RELEASE_ID.fullmatch(release):
        raise ValueError(f"not a release id: {release!r}")
    before = kept.get(release, Kept())
    first = before.baseline
    if baseline is not None and baseline.models:
        first = Eval(first.at, {**baseline.models, **first.models}) if first else baseline
    releases = {r: k for r, k in kept.items() if r != release}
    releases[release] = Kept(first, last)
    newest = list(releases.items())[-keep:]
    while True:
        text = json.dumps({"releases": {r: k.to_dict() for r, k in newest}}, separators=(",", ":")) + "\n"
        if len(text.encode()) <= max_bytes or len(newest) == 1:
            return text
        newest = newest[1:]


def suite_path(setting: str | None) -> Path | None:
    """The `quality_probes` setting as a file: absolute as given, else the project's (sparkfleet.PROJECT_ROOT); None:
    the packaged suite."""
    if setting is None:
        return None
    path = Path(setting)
    return path if path.is_absolute() else Path(sparkfleet.PROJECT_ROOT) / path


def _number(value) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def summary(record, release: str | None) -> dict | None:
    """What `status` shows of a host's latest evaluation of the release it runs: {"at", "models": {name: {"score",
    "failed": [probe ids that failed], "below": [probe ids below the baseline], "evaluated"}}}; None when it has
    none. Read from an untrusted record: a model's entry of another shape shows as not evaluated."""
    kept = parse_record(record).get(release or "")
    if kept is None or kept.last is None:
        return None
    models = {}
    for name, found in kept.last.models.items():
        results = found.get("results")
        failed = [r["id"] for r in (results if isinstance(results, list) else ())
                  if isinstance(r, dict) and r.get("verdict") == "fail"
                  and isinstance(r.get("id"), str) and PROBE.fullmatch(r["id"])]
        models[name] = {"score": _number(found.get("score")), "evaluated": found.get("evaluated") is True,
                        "failed": failed, "below": kept.last.below.get(name, [])}
    return {"at": kept.last.at, "models": models}


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metrics_text(last: Eval, score_metric: str, below_metric: str) -> str:
    """The textfile's lines: each evaluated model's score (0..1) and 1 when it is below its baseline, else 0 (label
    `model`); a model not evaluated has no score line (an absent series, not a zero)."""
    lines = [f"# HELP {score_metric} the share of probes the model passed at its last evaluation",
             f"# TYPE {score_metric} gauge",
             f"# HELP {below_metric} 1 when the model's last evaluation fell below its release's baseline",
             f"# TYPE {below_metric} gauge"]
    for name, found in sorted(last.models.items()):
        score = _number(found.get("score"))
        if found.get("evaluated") is not True or score is None:
            continue
        lines.append(f'{score_metric}{{model="{_label(name)}"}} {score:g}')
        lines.append(f'{below_metric}{{model="{_label(name)}"}} {1 if last.below.get(name) else 0}')
    return "\n".join(lines) + "\n"
