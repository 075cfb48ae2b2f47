"""A model's evaluation against its release's baseline: what fell (docs/quality.md, "The gate").

A regression is a probe that passed in the baseline and fails now, or a score below the baseline's by more than the
margin. A probe not evaluated on either side is neither; a model not evaluated now is never a regression nor a pass
(the caller reports it as not evaluated)."""

from __future__ import annotations

from dataclasses import dataclass

from sparkfleet.quality.run import ANSWER_MAX, Evaluation
from sparkfleet.tables import clean

SCORE = "score"  # the Regression.probe of a score that fell by more than the margin


@dataclass(frozen=True)
class Regression:
    probe: str
    before: str
    now: str
    why: str

    def line(self) -> str:
        """One terminal-safe line naming the probe and both answers."""
        if self.probe == SCORE:
            return f"score {clean(self.now, 16)}, below the baseline's {clean(self.before, 16)}: {clean(self.why)}"
        return (f"probe {clean(self.probe, 64)} passed in the baseline and fails now ({clean(self.why, ANSWER_MAX)}): "
                f"before {clean(self.before, ANSWER_MAX + 2)}, now {clean(self.now, ANSWER_MAX + 2)}")


def regressions(baseline: Evaluation, now: Evaluation, margin: float) -> list[Regression]:
    """What fell since the baseline (empty when nothing did, or when `now` was not evaluated)."""
    if not 0 <= margin < 1:
        raise ValueError(f"margin {margin!r} is not from 0 to below 1")
    if not now.evaluated:
        return []
    found = []
    for result in now.results:
        before = baseline.result(result.id)
        if result.verdict == "fail" and before is not None and before.verdict == "pass":
            found.append(Regression(result.id, f'"{before.answer}"', f'"{result.answer}"', result.why))
    fell = None if baseline.score is None or now.score is None else round(baseline.score - now.score, 9)
    if fell is not None and fell > margin:  # rounded: a score's float error is no fall
        found.append(Regression(SCORE, f"{baseline.score:.2f}", f"{now.score:.2f}",
                                f"more than the margin {margin:.2f} below"))
    return found
