"""`python -m sparkfleet plan`: connects to nothing, exit 2 on invalid settings."""

import json
import subprocess

import pytest

from sparkfleet import cli
from sparkfleet.cli import main
from sparkfleet.release.engine import flag_table

from .helpers import ROOT


def write_inventory(tmp_path, data: dict) -> str:
    path = tmp_path / "fleet.py"
    path.write_text(f"sparks = [('spark-1', {data!r}), ('spark-2', {{}})]\n")
    return str(path)


def test_plan_json_of_the_office_example(capsys, monkeypatch):
    """The acceptance command with the hub out of reach: the plan still prints, the release unresolved."""
    unreachable = "cannot resolve modelscope:Qwen/Qwen3.5-35B-A3B-FP8@master: no network in this test"
    monkeypatch.setattr(cli, "hub_resolver", lambda s: (None, None, unreachable))
    assert main(["plan", str(ROOT / "inventory/office.py"), "--json"]) == 0
    hosts = json.loads(capsys.readouterr().out)["hosts"]
    assert [h["name"] for h in hosts] == ["spark-a", "spark-b", "spark-c"]
    first = hosts[0]
    assert first["image"] == "vllm/vllm-openai:v0.33.0" and "ExecStart=" in first["unit"]
    for flag in ["--enable-prefix-caching", "--enable-auto-tool-choice", "--attention-backend"]:
        assert flag in first["engine_args"]
    assert flag_table("0.33.0").problems(first["engine_args"]) == []
    assert first["release_id"] is None and first["hub_error"] == unreachable
    assert first["model_dir"] == "/var/lib/sparkfleet/models/Qwen--Qwen3.5-35B-A3B-FP8@unresolved"


def test_plan_table_of_the_office_example(capsys, monkeypatch):
    monkeypatch.setattr(cli, "hub_resolver", lambda s: (None, None, "hub down"))
    assert main(["plan", str(ROOT / "inventory/office.py"), "--host", "spark-b"]) == 0
    out = capsys.readouterr().out
    assert "spark-b: release unresolved" in out and "hub unreachable: hub down" in out
    assert "spark-a" not in out and "[Service]" in out


def test_plan_json_with_a_reachable_hub(tmp_path, capsys, local_hub):
    inventory = write_inventory(tmp_path, {"hub_endpoint": local_hub})
    assert main(["plan", inventory, "--json", "--host", "spark-1"]) == 0
    [host] = json.loads(capsys.readouterr().out)["hosts"]
    assert len(host["release_id"]) == 12 and host["manifest"]["files"] >= 8
    assert f"release {host['release_id']}" in host["unit"]


@pytest.mark.parametrize("data,needle", [
    ({"max_model_length": 8192}, "did you mean `max_model_len`?"),
    ({"kv_cache_dtype": "fp8"}, 'set kv_cache_dtype = "auto"'),
    ({"extra_engine_args": ["--enable-reasoning"]}, "does not exist in vLLM 0.33.0"),
    ({"max_model_len": 1048576}, "set max_model_len <= 262144"),
    ({"api_host": "0.0.0.0"}, "set api_key"),
    ({"api_port": "http"}, "setting `api_port` = 'http' is invalid"),
])
def test_invalid_settings_exit_2_naming_the_fix(tmp_path, capsys, data, needle):
    inventory = write_inventory(tmp_path, {"hub_endpoint": "http://127.0.0.1:9", **data})
    assert main(["plan", inventory]) == 2
    err = capsys.readouterr().err
    assert "spark-1:" in err and needle in err and "spark-2:" not in err


def test_deploy_refuses_bad_settings_before_any_operation(tmp_path):
    """pyinfra itself, on a local "host": the refusal is one clear message, not a traceback."""
    inventory = tmp_path / "local.py"
    inventory.write_text("sparks = [('@local', {'kv_cache_dtype': 'fp8'})]\n")
    proc = subprocess.run([str(ROOT / ".venv/bin/pyinfra"), "-y", str(inventory), "deploy.py"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in output
    assert "invalid settings; no host was changed" in output and 'set kv_cache_dtype = "auto"' in output
    assert "Starting operation" not in output
