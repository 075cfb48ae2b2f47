"""The quality record a host keeps (contract/quality.py): read back untrusted, a baseline never replaced, a size its
one shell argument carries; what `status` shows of it, and the textfile's lines."""

from __future__ import annotations

import json

from sparkfleet.contract import monitoring
from sparkfleet.contract.quality import KEEP, MAX_BYTES, Eval, Kept, metrics_text, parse_record, render_record, \
    summary

A, B = "aaaaaa111111", "bbbbbb222222"


def evaluation(score: float | None, failed: tuple[str, ...] = (), model: str = "m") -> dict:
    results = [{"id": p, "kind": "exact", "verdict": "fail" if p in failed else "pass", "answer": "4", "why": ""}
               for p in ("sum", "word")]
    return {"model": model, "serves": "chat", "results": results, "score": score, "evaluated": score is not None,
            "seconds": 1.0}


def test_a_record_of_the_wrong_shape_counts_for_nothing():
    hostile = {"releases": {"not-an-id": {"last": {"at": "x", "models": {"m": {}}}},
                            A: {"baseline": {"at": "t\x1b[2J", "models": {"m\n": {}, "ok": [], "fine": {"a": 1}}},
                                "last": "nope"},
                            B: {"last": {"at": 5, "models": {"m": evaluation(1.0)}, "below": {"m": ["sum", 7, "x y"],
                                                                                               "ghost": ["sum"]}}}}}
    found = parse_record(hostile)
    assert set(found) == {A, B}
    assert found[A].baseline.models == {"fine": {"a": 1}} and found[A].baseline.at == "" and found[A].last is None
    assert found[B].last.at == "" and found[B].last.below == {"m": ["sum"]}
    assert parse_record(["releases"]) == {} and parse_record({"releases": []}) == {}


def test_a_baseline_is_never_replaced_and_a_new_model_is_added_to_it():
    first = Eval("t1", {"m": evaluation(1.0)})
    kept = parse_record(json.loads(render_record({}, A, first, first)))
    later = Eval("t2", {"m": evaluation(0.5, ("sum",)), "n": evaluation(1.0, model="n")}, {"m": ["sum"]})
    record = json.loads(render_record(kept, A, later, Eval("t2", {"m": evaluation(0.5), "n": evaluation(1.0)})))
    entry = record["releases"][A]
    assert entry["baseline"]["models"]["m"]["score"] == 1.0 and entry["baseline"]["at"] == "t1"
    assert entry["baseline"]["models"]["n"]["score"] == 1.0  # evaluated for the first time: added
    assert entry["last"]["at"] == "t2" and entry["last"]["below"] == {"m": ["sum"]}


def test_the_newest_releases_are_kept_within_the_size_of_one_argument():
    kept: dict[str, Kept] = {}
    ids = [f"{n:012x}" for n in range(KEEP + 3)]
    for release in ids:
        kept = parse_record(json.loads(render_record(kept, release, Eval("t", {"m": evaluation(1.0)}))))
    assert list(kept) == ids[-KEEP:]
    big = {f"model-{n}": {**evaluation(1.0), "pad": "x" * 20_000} for n in range(3)}
    text = render_record(kept, ids[0], Eval("t", big), Eval("t", big))
    assert len(text.encode()) <= MAX_BYTES or list(json.loads(text)["releases"]) == [ids[0]]
    assert list(json.loads(text)["releases"])[-1] == ids[0]


def test_status_reads_the_last_eval_of_the_running_release():
    record = json.loads(render_record({}, A, Eval("2026-12-07T10:00:00Z", {"m": evaluation(0.5, ("sum",))},
                                                  {"m": ["sum"]})))
    assert summary(record, A) == {"at": "2026-12-07T10:00:00Z", "models": {"m": {
        "score": 0.5, "evaluated": True, "failed": ["sum"], "below": ["sum"]}}}
    assert summary(record, B) is None and summary(None, A) is None and summary(record, None) is None
    record["releases"][A]["last"]["models"]["m"] = {"score": "high", "results": "x"}
    assert summary(record, A)["models"]["m"] == {"score": None, "evaluated": False, "failed": [], "below": ["sum"]}


def test_the_textfile_has_a_score_and_a_below_gauge_per_evaluated_model():
    last = Eval("t", {"m": evaluation(0.5), 'we"ird': evaluation(1.0), "down": evaluation(None)}, {"m": ["sum"]})
    text = metrics_text(last, monitoring.QUALITY_SCORE_METRIC, monitoring.QUALITY_BELOW_METRIC)
    assert 'sparkfleet_quality_score{model="m"} 0.5' in text
    assert 'sparkfleet_quality_below_baseline{model="m"} 1' in text
    assert 'sparkfleet_quality_below_baseline{model="we\\"ird"} 0' in text
    assert "down" not in text  # not evaluated: no series, not a zero
    assert {monitoring.QUALITY_SCORE_METRIC, monitoring.QUALITY_BELOW_METRIC} == set(monitoring.QUALITY_METRICS)
