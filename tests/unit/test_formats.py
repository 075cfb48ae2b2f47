"""Each host file format has one owner (contract/formats.py over the host module): the env files and the
memory plan are written, read and edited there only, and each host path is named once (contract/paths.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from sparkfleet.contract import formats, paths
from sparkfleet.contract.shared import PACKAGE_DIR, memory

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = [p for top in ("sparkfleet", "files", "templates") for p in sorted((ROOT / top).rglob("*"))
           if p.is_file() and p.suffix not in (".pyc", ".json", ".lock")] + [ROOT / "deploy.py", ROOT / "rollback.py"]


def holders(pattern: str) -> list[str]:
    """The product files whose text matches `pattern`, relative to the checkout."""
    found = re.compile(pattern)
    return sorted(str(p.relative_to(ROOT)) for p in PRODUCT if found.search(p.read_text(errors="replace")))


def test_each_rule_of_a_host_file_is_written_in_its_owner_alone():
    # the engine's descriptor, and the env file's owner for a serving file older than `api_key_var`
    assert holders(r"VLLM_API_KEY") == ["files/sparkfleet_host/envfiles.py", "sparkfleet/contract/engines.py"]
    assert holders(r"/etc/systemd/system") == ["sparkfleet/contract/paths.py"]  # paths.unit_path
    assert holders(r"memory\.json") == ["sparkfleet/contract/paths.py"]  # paths.MEMORY_PLAN, the helper's argument
    assert holders(r"host_memory_gb\s*\*") == ["sparkfleet/contract/formats.py"]  # formats.host_memory_bytes
    assert holders(r"\+ 1e-9|1e-9\b") == ["files/sparkfleet_host/memory.py"]  # within_budget: planner and memcheck


def test_the_env_file_reads_back_what_it_was_written_with():
    env = {"b": "1", "SIM_X": " a=b c", "_Y": ""}
    text = formats.engine_env("sk-the-key", env)
    assert text.splitlines()[1:] == ["VLLM_API_KEY=sk-the-key", "_Y=", "b=1", "SIM_X= a=b c"]  # by name, any case
    assert formats.parse_env(text) == {formats.DEFAULT_KEY_VAR: "sk-the-key", **env}
    assert formats.parse_env(formats.hub_env("hf_tok")) == dict.fromkeys(formats.HUB_TOKEN_VARS, "hf_tok")
    assert formats.parse_env(formats.hub_env(None)) == {}


@pytest.mark.parametrize("env", [{"A": "x\nVLLM_API_KEY=stolen"}, {"A B": "1"}, {"A=B": "1"}])
def test_a_line_that_would_split_or_hide_another_is_refused_naming_the_variable_alone(env):
    with pytest.raises(ValueError) as caught:
        formats.engine_env("sk-the-key", env)
    assert "needs a name of [A-Za-z0-9_] and a one-line value" in str(caught.value)
    assert "stolen" not in str(caught.value) and "sk-the-key" not in str(caught.value)


def test_the_api_key_comes_from_api_key_only():
    with pytest.raises(ValueError, match="from the `api_key` setting"):
        formats.engine_env(None, {formats.DEFAULT_KEY_VAR: "sk-other"})


def test_a_rollback_edit_with_no_kept_file_fails_in_one_line_and_leaves_the_live_env(tmp_path):
    live = tmp_path / "engine.env"
    live.write_text("# header\nVLLM_API_KEY=sk-today\n")
    proc = subprocess.run([sys.executable, str(PACKAGE_DIR), "env-restore", str(live), str(tmp_path / "absent"),
                           "VLLM_HOST_IP"], capture_output=True, text=True, check=False)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [f"sparkfleet_host env-restore: {tmp_path}/absent: No such file or directory"]
    assert live.read_text() == "# header\nVLLM_API_KEY=sk-today\n" and "sk-today" not in proc.stderr


def test_the_budget_rule_is_one_function():
    assert memory.within_budget([0.88, 0.03, 0.03], 0.95) == (0.94, True)
    assert memory.within_budget([0.1, 0.2, 0.65], 0.95) == (0.95, True)  # 0.9500000000000001 is 0.95
    assert memory.within_budget([0.88, 0.1], 0.95) == (0.98, False)
    assert formats.host_memory_bytes(128) == 128_000_000_000 and paths.MEMORY_PLAN == "/etc/sparkfleet/memory.json"
