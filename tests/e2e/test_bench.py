"""`sparkfleet bench` against a simulated Spark whose stand-in decodes at 50 tokens/s after a
100 ms first token (inventory/sim.py's engine_env): it must measure what was set."""

import json
import subprocess
import sys

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.e2e
TOKENS_PER_S, FIRST_TOKEN_MS = 50, 100


def test_bench_measures_the_set_pace(converged_fleet, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "sparkfleet", "bench", "inventory/sim.py", "--host", "spark-1",
                           "--concurrency", "1,4", "--max-tokens", "64", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads((tmp_path / "bench.json").read_text())
    assert abs(result["single_stream_decode_tokens_per_s"] - TOKENS_PER_S) <= 0.05 * TOKENS_PER_S
    level_1 = next(level for level in result["levels"] if level["concurrency"] == 1)
    assert FIRST_TOKEN_MS <= level_1["ttft_ms"]["p50"] <= FIRST_TOKEN_MS + 50
    assert all(level["errors"] == 0 for level in result["levels"])
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result["roofline_tokens_per_s"] and result["decode_vs_roofline"] > 0
