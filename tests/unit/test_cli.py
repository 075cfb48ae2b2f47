"""`python -m sparkfleet plan`: connects to nothing, exit 2 on invalid settings."""

import argparse
import json
import os
import subprocess
import sys

import pytest

import sparkfleet
from sparkfleet import cli
from sparkfleet.cli import main
from sparkfleet.release.engines.vllm import flag_table

from .helpers import ROOT


def write_inventory(tmp_path, data: dict) -> str:
    path = tmp_path / "fleet.py"
    path.write_text(f"sparks = [('spark-1', {data!r}), ('spark-2', {{}})]\n")
    return str(path)


def test_plan_json_of_the_office_example(capsys, monkeypatch):
    """The acceptance command with the hub out of reach: the plan still prints, the release unresolved."""
    unreachable = "cannot resolve modelscope:Qwen/Qwen3.5-35B-A3B-FP8@master: no network in this test"
    monkeypatch.setattr("sparkfleet.controller.inventory.hub_resolver", lambda s: (None, None, unreachable))
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
    monkeypatch.setattr("sparkfleet.controller.inventory.hub_resolver", lambda s: (None, None, "hub down"))
    assert main(["plan", str(ROOT / "inventory/office.py"), "--limit", "spark-b", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "spark-b: release unresolved" in out and "hub unreachable: hub down" in out
    assert "spark-a" not in out and "[Service]" in out


def test_plan_ends_with_one_summary_line_a_host_and_renders_files_only_when_verbose(capsys, monkeypatch):
    """Issue 51: about 100 lines a host with no summary; now the tables, then one line a host (fits, engine, image
    pinned or not, served names); the rendered units with --verbose (and in --json) only."""
    monkeypatch.setattr("sparkfleet.controller.inventory.hub_resolver", lambda s: (None, None, "hub down"))
    assert main(["plan", str(ROOT / "inventory/office.py"), "--offline"]) == 0
    out = capsys.readouterr().out
    assert "[Service]" not in out and "ExecStart" not in out
    lines = out.splitlines()
    summary = lines[next(i for i, line in enumerate(lines) if line.startswith("summary")) + 1:]
    assert [line.split(":")[0] for line in summary] == ["spark-a", "spark-b", "spark-c"]
    for line in summary:
        assert line.split("; ")[0].split(": ")[1].startswith("fits (") and "; vLLM " in line
        assert "image NOT pinned" in line and line.endswith("serves Qwen3.5-35B-A3B")
    assert main(["plan", str(ROOT / "inventory/office.py"), "--offline", "--json"]) == 0
    assert all("[Service]" in host["unit"] for host in json.loads(capsys.readouterr().out)["hosts"])


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


# --- the command line itself ---------------------------------------------------------------------------

HOST_SUBSETS = ("plan", "status", "fetch", "rollout", "rollback", "hostkeys", "bench")


def commands(parser=None, prefix=()):
    """(name path, sub-parser) of every command, `users add` and the like included."""
    parser = parser or cli.parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if any(isinstance(a, argparse._SubParsersAction) for a in sub._actions):
                    yield from commands(sub, (*prefix, name))
                else:
                    yield (*prefix, name), sub


def options(parser) -> dict[str, argparse.Action]:
    return {flag: a for a in parser._actions for flag in a.option_strings}


def test_every_command_takes_json_and_every_host_subset_is_limit():
    found = dict(commands())
    assert {("users", "add"), ("users", "list"), ("logs",), ("init",)} <= set(found)
    assert [name for name, sub in found.items() if "--json" not in options(sub)] == []
    for name in HOST_SUBSETS:
        opts = options(found[(name,)])
        assert opts["--limit"].dest == "limit" and opts["--host"].dest == "limit"
        assert opts["--host"].help == argparse.SUPPRESS  # the old name works, unadvertised


def test_version_and_prog(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out == f"sparkfleet {sparkfleet.__version__}\n"
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: sparkfleet plan") and "--limit" in out and "--host" not in out


def test_limit_and_its_old_name_pick_the_same_host(capsys):
    office = str(ROOT / "inventory/office.py")
    assert main(["plan", office, "--offline", "--json", "--limit", "spark-c"]) == 0
    by_limit = json.loads(capsys.readouterr().out)
    assert main(["plan", office, "--offline", "--json", "--host", "spark-c"]) == 0
    assert json.loads(capsys.readouterr().out) == by_limit and [h["name"] for h in by_limit["hosts"]] == ["spark-c"]


def test_a_closed_pipe_ends_quietly():
    """`sparkfleet plan --json | head -1`: the reader is gone before the plan is printed."""
    read, write = os.pipe()
    os.close(read)
    proc = subprocess.run([sys.executable, "-m", "sparkfleet", "plan", "inventory/office.py", "--offline", "--json"],
                          cwd=ROOT, stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    os.close(write)
    assert proc.returncode == 1 and proc.stderr == ""


def test_a_problem_of_every_host_is_said_once_naming_them_all(tmp_path, capsys):
    inventory = tmp_path / "fleet.py"
    inventory.write_text("sparks = [(n, {'kv_cache_dtype': 'fp8'}) for n in ('spark-1', 'spark-2', 'spark-3')]\n")
    assert main(["plan", str(inventory), "--offline"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "kv_cache_dtype" in line]
    assert len(lines) == 1 and lines[0].startswith("spark-1, spark-2, spark-3: ")


def test_group_problems_keeps_order_and_lines_that_name_no_host():
    from sparkfleet.contract.settings import SettingsError, group_problems

    problems = ["a: X", "b: Y", "b: X", "group 'g': Z", "group 'g': Z", "a: X"]
    assert group_problems(problems) == ["a, b: X", "b: Y", "group 'g': Z"]
    assert SettingsError(problems).problems == problems  # each host's own lines stay for the callers


def test_bench_refuses_a_key_on_the_command_line(capsys):
    assert main(["bench", "--url", "http://127.0.0.1:9", "--api-key", "sk-visible-in-ps"]) == 2
    err = capsys.readouterr().err
    assert "--api-key is refused" in err and "SPARKFLEET_API_KEY" in err and "sk-visible-in-ps" not in err


def test_bench_reads_the_key_from_the_environment_over_the_inventory(tmp_path, monkeypatch):
    from sparkfleet.commands import bench

    inventory = tmp_path / "inv.py"
    inventory.write_text("sparks = [('spark-a', {'ssh_hostname': '10.0.0.1', 'api_host': '0.0.0.0', "
                         "'api_key': 'inventory-key-0123'})]\n")
    args = cli.parser().parse_args(["bench", str(inventory), "--limit", "spark-a", "--roofline", "1"])
    monkeypatch.delenv("SPARKFLEET_API_KEY", raising=False)
    assert bench.target(args)[2] == "inventory-key-0123"
    monkeypatch.setenv("SPARKFLEET_API_KEY", "env-key")
    assert bench.target(args)[2] == "env-key"
    url_args = cli.parser().parse_args(["bench", "--url", "http://127.0.0.1:9"])
    assert bench.target(url_args)[2] == "env-key"
