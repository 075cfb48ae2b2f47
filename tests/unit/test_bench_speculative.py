"""Speculative decoding as bench measures it: vLLM's spec-decode counters from /metrics, and the stand-in
engine simulating MTP from its flags (tokens per step = 1 + accepted drafts)."""

from __future__ import annotations

import json

import pytest
import requests

from sparkfleet.fleet import bench
from sparkfleet.fleet.metrics import read_by_label

from .helpers import Server, make_model, run_to_exit

NAME = "Qwen3.5-35B-A3B"
STEPS_PER_S = 20.0  # SIM_TOKENS_PER_S: the plain (one token per step) rate
SPEC = json.dumps({"method": "mtp", "num_speculative_tokens": 2})

# What vLLM 0.33 exports (prometheus_client counters: the `_total` suffix), labelled as vLLM labels them.
METRICS = """# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 100.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 200.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 150.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 90.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 60.0
"""


def test_spec_decode_counters_are_read_with_their_positions():
    assert bench.parse_spec_decode(METRICS) == {"drafts": 100.0, "draft_tokens": 200.0, "accepted_tokens": 150.0,
                                                "accepted_per_position": [90.0, 60.0]}
    plain = METRICS.replace("_total{", "{")  # older exporters: no _total
    assert bench.parse_spec_decode(plain)["accepted_per_position"] == [90.0, 60.0]
    assert bench.parse_spec_decode("vllm:num_requests_running 0\n") is None
    assert read_by_label(METRICS, "vllm:spec_decode_num_accepted_tokens_per_pos_total", "position") == {
        "0": 90.0, "1": 60.0}


def test_the_runs_share_is_after_minus_before():
    before = bench.parse_spec_decode(METRICS)
    after = {"drafts": 300.0, "draft_tokens": 600.0, "accepted_tokens": 470.0, "accepted_per_position": [270.0, 200.0]}
    # during: 200 drafts, 400 draft tokens, 320 accepted: 80 %; 1 + 320 / 200 = 2.6 tokens per step;
    # position 0: 180 / 200 = 90 %, position 1: 140 / 200 = 70 %
    assert bench.spec_decode_report(before, after) == {
        "drafts": 200.0, "draft_tokens": 400.0, "accepted_tokens": 320.0, "num_speculative_tokens": 2,
        "acceptance_rate": 0.8, "mean_acceptance_length": 2.6, "acceptance_per_position": [0.9, 0.7]}
    assert bench.spec_decode_report(None, after) is None


@pytest.fixture(scope="module")
def mtp_model(tmp_path_factory):
    root = make_model(tmp_path_factory.mktemp("spec") / "model")
    config = json.loads((root / "config.json").read_text())
    config["text_config"]["mtp_num_hidden_layers"] = 1
    (root / "config.json").write_text(json.dumps(config))
    return root


@pytest.fixture(scope="module")
def knob_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("knobs") / "engine.json"
    path.write_text(json.dumps({"spec_acceptance_rate": 0.75}))
    return path


@pytest.fixture(scope="module")
def server(mtp_model, knob_file):
    s = Server(mtp_model, "--served-model-name", NAME, "--speculative-config", SPEC,
               SIM_TOKENS_PER_S=str(int(STEPS_PER_S)), SIM_LOAD_DELAY_S="0", SIM_KNOB_FILE=str(knob_file))
    yield s
    s.stop()


def test_the_stand_in_drafts_at_the_knobs_rate_and_bench_reports_it(server, capsys):
    # 2 drafts accepted at 0.75: 1.5 accepted per step, 2.5 tokens per step at 20 steps/s = 50 tokens/s.
    result = bench.run_bench(server.base, NAME, None, concurrency=[1], max_tokens=41, think=False,
                             requests_per_level=2, roofline=25.0)
    spec = result["speculative_decoding"]
    assert spec["acceptance_rate"] == pytest.approx(0.75, abs=0.02)
    assert spec["mean_acceptance_length"] == pytest.approx(2.5, abs=0.05)
    assert spec["num_speculative_tokens"] == 2
    assert spec["acceptance_per_position"][0] >= spec["acceptance_per_position"][1]
    assert result["single_stream_decode_tokens_per_s"] == pytest.approx(50.0, rel=0.15)  # loose: a busy machine
    bench.print_table(result)
    out = " ".join(capsys.readouterr().out.split())
    assert "speculative decoding may exceed the plain roofline" in out
    assert "speculative decoding: acceptance rate 7" in out and "draft tokens per step, mean accepted length 2." in out


def test_the_knob_is_read_live(server, knob_file):
    """A new acceptance rate applies from the next step, without a restart (as `sim engine --live` does)."""
    knob_file.write_text(json.dumps({"spec_acceptance_rate": 0.0}))
    try:
        before = bench.parse_spec_decode(requests.get(server.base + "/metrics", timeout=5).text)
        bench.run_bench(server.base, NAME, None, concurrency=[1], max_tokens=6, think=False, requests_per_level=1)
        after = bench.parse_spec_decode(requests.get(server.base + "/metrics", timeout=5).text)
    finally:
        knob_file.write_text(json.dumps({"spec_acceptance_rate": 0.75}))
    during = bench.spec_decode_report(before, after)
    assert during["drafts"] > 0 and during["accepted_tokens"] == 0 and during["mean_acceptance_length"] == 1.0


def test_a_plain_engine_exports_no_spec_counters(mtp_model):
    s = Server(mtp_model, "--served-model-name", NAME, SIM_LOAD_DELAY_S="0")
    try:
        assert "spec_decode" not in requests.get(s.base + "/metrics", timeout=5).text
    finally:
        s.stop()


@pytest.mark.parametrize("spec,needle", [
    ({"method": "ngram", "num_speculative_tokens": 2}, "Unsupported speculative method: 'ngram'"),
    ({"method": "mtp"}, "num_speculative_tokens must be a positive integer"),
    ({"method": "mtp", "num_speculative_tokens": 0}, "num_speculative_tokens must be a positive integer"),
])
def test_the_stand_in_refuses_what_it_cannot_draft(mtp_model, spec, needle):
    proc = run_to_exit(str(mtp_model), "--speculative-config", json.dumps(spec), SIM_LOAD_DELAY_S="0")
    assert proc.returncode == 1 and needle in proc.stderr + proc.stdout


def test_mtp_needs_the_models_mtp_layers(tmp_path):
    proc = run_to_exit(str(make_model(tmp_path / "model")), "--speculative-config", SPEC, SIM_LOAD_DELAY_S="0")
    assert proc.returncode == 1 and "config.json has no mtp_num_hidden_layers" in proc.stderr + proc.stdout
