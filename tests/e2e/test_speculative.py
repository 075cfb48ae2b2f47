"""The speed profile on the simulated fleet: a host converged with the MTP recipe, an acceptance-rate knob on
its stand-in engine, and `sparkfleet bench` measuring what the knob implies and reading the rate from /metrics.

The stand-in steps at inventory/sim.py's SIM_TOKENS_PER_S (50 steps/s); each step emits 1 + the drafts it
accepts. With 2 draft tokens accepted at 0.6: 1 + 1.2 = 2.2 tokens per step, 110 tokens/s.
"""

import json
import subprocess
import sys

import pytest

from .conftest import INVENTORY, ROOT, converge, sparkfleet, variant

pytestmark = pytest.mark.e2e
HOST = "spark-1"
MTP = "qwen3.5-35b-a3b-fp8-mtp"
STEPS_PER_S, ACCEPTANCE, DRAFTS = 50, 0.6, 2
EXPECTED_TOKENS_PER_S = STEPS_PER_S * (1 + ACCEPTANCE * DRAFTS)  # 110


def set_knob(**knobs) -> None:
    """`python -m sim engine HOST k=v --live`: the running engine container's knob file."""
    args = [f"{k}={v}" for k, v in knobs.items()]
    proc = subprocess.run([sys.executable, "-m", "sim", "engine", HOST, *args, "--live"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_bench_measures_the_mtp_profile(converged_fleet, tmp_path):
    fast = variant(tmp_path, "mtp", {}, {HOST: {"recipe": MTP}})
    planned = sparkfleet("plan", fast, "--host", HOST, "--json")
    assert planned.returncode == 0, planned.stderr
    [host] = json.loads(planned.stdout)["hosts"]
    assert host["speculative"] == {"method": "mtp", "num_speculative_tokens": DRAFTS}
    assert host["fit"]["draft_kv_bytes_per_token"] == 2048 and host["fit"]["draft_weights_bytes"] > 0
    i = host["engine_args"].index("--speculative-config")
    assert json.loads(host["engine_args"][i + 1]) == {"method": "mtp", "num_speculative_tokens": DRAFTS}
    try:
        result = converge("--limit", HOST, inventory=fast)
        assert result.returncode == 0 and not result.host_failed(HOST), result.output[-4000:]
        set_knob(spec_acceptance_rate=ACCEPTANCE)
        out = tmp_path / "bench"
        proc = sparkfleet("bench", fast, "--host", HOST, "--concurrency", "1", "--requests", "3",
                          "--max-tokens", "128", "--out", str(out), timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        report = json.loads((out / "bench.json").read_text())
        measured = report["single_stream_decode_tokens_per_s"]
        assert abs(measured - EXPECTED_TOKENS_PER_S) <= 0.05 * EXPECTED_TOKENS_PER_S, measured
        spec = report["speculative_decoding"]
        print(f"decode {measured:.1f} tokens/s (expected {EXPECTED_TOKENS_PER_S:g}); acceptance "
              f"{spec['acceptance_rate']:.3f}, mean accepted length {spec['mean_acceptance_length']:.3f}")
        assert spec["acceptance_rate"] == pytest.approx(ACCEPTANCE, abs=0.02)
        assert spec["mean_acceptance_length"] == pytest.approx(1 + ACCEPTANCE * DRAFTS, abs=0.05)
        assert spec["num_speculative_tokens"] == DRAFTS
        printed = " ".join(proc.stdout.split())
        assert "speculative decoding may exceed the plain roofline" in printed
        assert "speculative decoding: acceptance rate 60." in printed
    finally:
        restored = converge("--limit", HOST, inventory=INVENTORY)
        assert restored.returncode == 0 and not restored.host_failed(HOST), restored.output[-4000:]
