"""The vLLM 0.33.0 flag table (sparkfleet/release/engines/vllm-0.33.0.json)."""

import json
from pathlib import Path

import pytest

TABLE_PATH = Path(__file__).resolve().parents[2] / "sparkfleet" / "release" / "engines" / "vllm-0.33.0.json"

REFERENCE_VALUE_FLAGS = [
    "--served-model-name", "--max-model-len", "--gpu-memory-utilization", "--tool-call-parser",
    "--reasoning-parser", "--attention-backend", "--limit-mm-per-prompt", "--max-num-seqs",
    "--kv-cache-dtype", "--api-key", "--host", "--port", "--tensor-parallel-size",
]
REFERENCE_SWITCHES = ["--enable-prefix-caching", "--enable-auto-tool-choice"]


@pytest.fixture(scope="module")
def table():
    return json.loads(TABLE_PATH.read_text())


def test_header(table):
    assert table["version"] == "0.33.0"
    assert table["entrypoint"] == ["vllm", "serve"]
    assert "vllm-project/vllm" in table["source"]
    assert len(table["flags"]) > 300


@pytest.mark.parametrize("flag", REFERENCE_VALUE_FLAGS)
def test_reference_value_flags(table, flag):
    assert table["flags"][flag]["value"] is True


@pytest.mark.parametrize("flag", REFERENCE_SWITCHES)
def test_reference_switches(table, flag):
    spec = table["flags"][flag]
    assert spec["value"] is False and spec["negatable"] is True


def test_aliases_and_negations(table):
    flags = table["flags"]
    assert flags["-tp"]["alias_of"] == "--tensor-parallel-size"
    assert flags["--no-enable-prefix-caching"]["negates"] == "--enable-prefix-caching"
    assert flags["--disable-prefix-caching"]["negates"] == "--enable-prefix-caching"
    assert flags["--served-model-name"]["nargs"] == "+"


def test_parser_names_are_known_but_free_strings(table):
    flags = table["flags"]
    assert "qwen3_coder" in flags["--tool-call-parser"]["known_values"]
    assert "qwen3" in flags["--reasoning-parser"]["known_values"]
    assert "FLASH_ATTN" in flags["--attention-backend"]["known_values"]
    assert "fp8" in flags["--kv-cache-dtype"]["known_values"]
    for flag in ("--tool-call-parser", "--reasoning-parser", "--attention-backend"):
        assert "choices" not in flags[flag] and flags[flag]["checked_at_startup"]


def test_removed_flags(table):
    removed = table["removed"]
    assert {"--enable-reasoning", "--guided-decoding-backend", "--num-scheduler-steps"} <= set(removed)
    for flag, fix in removed.items():
        assert flag not in table["flags"], flag
        assert fix.strip()


def test_disable_log_requests_is_accepted_by_0_33_0(table):
    # Older guides call it removed; in 0.33.0 every --enable-X boolean also
    # registers --disable-X, so it parses (as a no-op: logging is off by default).
    assert table["flags"]["--disable-log-requests"]["negates"] == "--enable-log-requests"
    assert table["flags"]["--enable-log-requests"]["default"] is False
    assert "--disable-log-requests" not in table["removed"]
    assert "--disable-log-requests" in table["notes"]
