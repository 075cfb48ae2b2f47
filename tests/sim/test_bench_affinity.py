"""tools/bench_affinity.py's own parts, without a fleet: the workload it sends, how it reads the door's counts and
the engines' replies, and its table (the fleet run is in docs/benchmarks.md)."""

from __future__ import annotations

import pytest
import requests

from tools import bench_affinity

from tests.unit.helpers import KEY, Server, make_model

STAT = """# pxname,svname,qcur,scur,stot,status
engines,spark-1,0,0,12,UP
engines,spark-2,0,0,3,UP
engines,BACKEND,0,0,15,UP
chat_1,spark-1,0,0,99,UP
"""


class FakeRuntime:
    def __init__(self, answers):
        self.answers = answers

    def _run(self, command):
        assert command == "show stat"
        return self.answers


def test_conversations_share_system_prompts_and_every_other_first_message():
    openings = bench_affinity.conversations(6, 3, 50, "tag")
    systems = [o[0]["content"] for o in openings]
    firsts = [o[1]["content"] for o in openings]
    assert len(set(systems)) == 3 and systems[0] == systems[3] and "tag" in systems[0]
    assert len(systems[0].split()) == 53
    assert firsts[0] == firsts[2] == firsts[4] == bench_affinity.SHARED_FIRST
    assert len({firsts[1], firsts[3], firsts[5], firsts[0]}) == 4


def test_door_requests_are_the_chat_backends_servers_summed_over_doors():
    two_doors = FakeRuntime({"door-1": STAT, "door-2": STAT.replace(",12,", ",5,"), "door-3": None})
    assert bench_affinity.door_requests(two_doors) == {"spark-1": 17, "spark-2": 6}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    s = Server(make_model(tmp_path_factory.mktemp("affinity") / "model"), "--served-model-name", "m",
               "--api-key", KEY, "--enable-prefix-caching", SIM_TOKENS_PER_S="400", SIM_PREFILL_TOKENS_PER_S="0")
    yield s
    s.stop()


def test_one_turn_times_the_first_content_and_the_counters_read_through_the_key(engine):
    engines = {"spark-1": (engine.base, KEY)}
    before = bench_affinity.prefix_counters(engines, requests)["spark-1"]
    turn = bench_affinity.one_turn(engine.base, KEY, "m", [{"role": "user", "content": "hello"}], 5)
    after = bench_affinity.prefix_counters(engines, requests)["spark-1"]
    assert 0 < turn["ttft_s"] < 5 and len(turn["answer"].split()) == 5 and turn["timings"] is None
    assert after["queries"] > before["queries"]
    assert bench_affinity.prefix_counters({"gone": ("http://127.0.0.1:1", KEY)}, requests) == {"gone": None}


def test_run_mode_counts_hits_shares_and_errors(engine, monkeypatch, capsys):
    """One mode against one engine (the door's counts faked): every turn answered, later turns hit the cache."""
    sent = iter([{"spark-1": 10}, {"spark-1": 16}])
    monkeypatch.setattr(bench_affinity, "door_requests", lambda runtime: next(sent))
    args = type("Args", (), {"conversations": 2, "turns": 3, "system_prompts": 1, "system_words": 100,
                             "concurrency": 2, "max_tokens": 4})()
    row = bench_affinity.run_mode("bounded", args, engine.base, "m", [KEY], {"spark-1": (engine.base, KEY)}, None,
                                  requests)
    assert (row["requests"], row["errors"], row["share"], row["sent"]) == (6, [], {"spark-1": 1.0}, {"spark-1": 6})
    assert 0.5 < row["prefix_cache"]["hit_rate"] < 1 and row["ttft_ms"]["p50"] <= row["ttft_ms"]["p95"]
    bench_affinity.print_table([row], {"conversations": 2, "turns": 3, "concurrency": 2, "system_prompts": 1,
                                       "system_words": 100, "max_tokens": 4})
    table = capsys.readouterr().out.splitlines()
    assert table[1].split()[-2:] == ["spark-1", "errors"] and table[2].split()[0] == "bounded"
    assert table[2].split()[-3:] == ["100", "%", "0"]
