"""The sim's other engines: the hub's GGUF model (parsed by llama.cpp's gguf reader; loaded by the real llama-server
where its image is built), the SGLang stand-in (the vLLM stand-in's sglang mode, run as a process on loopback)."""

from __future__ import annotations

import hashlib
import json
import runpy
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests

from sim.fleet import images
from sim.hub.gguf_model import GGUF_FILES, GGUF_REPO_ID, generate_gguf_repo
from sim.hub.server import make_server, server_url
from tests.conftest import free_port
from tests.unit.helpers import KEY, make_model, wait_for

STANDIN = Path(__file__).resolve().parents[2] / "sim" / "engine" / "standin_vllm.py"
# The flags sparkfleet gives SGLang, as its table spells them (the real table: sparkfleet/release/engines/).
SGLANG_TABLE = {"version": "0.5.23", "flags": {
    "--model-path": {"value": True, "dest": "model_path"}, "--served-model-name": {"value": True},
    "--host": {"value": True}, "--port": {"value": True, "type": "int"}, "--api-key": {"value": True},
    "--context-length": {"value": True, "type": "int"}, "--mem-fraction-static": {"value": True, "type": "float"},
    "--enable-metrics": {"value": False}, "--tp-size": {"value": True, "type": "int", "dest": "tp_size"},
    "--config": {"value": True}}}


# ----------------------------------------------------------------------------- the GGUF repo


@pytest.fixture(scope="module")
def gguf():
    return pytest.importorskip("gguf")  # requirements.txt pins it; only the GGUF tests need it


@pytest.fixture(scope="module")
def gguf_hub(gguf, tmp_path_factory):
    data = tmp_path_factory.mktemp("hubdata")
    generate_gguf_repo(data / GGUF_REPO_ID)
    server = make_server(data, "127.0.0.1", 0, log=False)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server_url(server)
    server.shutdown()
    server.server_close()


def test_the_gguf_repo_is_a_deterministic_split_set(gguf, tmp_path):
    a, b = generate_gguf_repo(tmp_path / "a"), generate_gguf_repo(tmp_path / "b")
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted([*GGUF_FILES, "README.md"]) and len(GGUF_FILES) == 2
    assert all((a / n).read_bytes() == (b / n).read_bytes() for n in names)


def test_the_hub_serves_a_gguf_the_reader_parses_with_its_listed_sha256(gguf, gguf_hub, tmp_path):
    info = requests.get(f"{gguf_hub}/api/models/{GGUF_REPO_ID}", params={"blobs": "true"}, timeout=10).json()
    assert info["library_name"] == "gguf"
    listed = {s["rfilename"]: s for s in info["siblings"]}
    parts = []
    for name in GGUF_FILES:
        data = requests.get(f"{gguf_hub}/{GGUF_REPO_ID}/resolve/main/{name}", timeout=10).content
        assert hashlib.sha256(data).hexdigest() == listed[name]["lfs"]["sha256"]
        (tmp_path / name).write_bytes(data)
        parts.append(gguf.GGUFReader(tmp_path / name))
    first = parts[0]
    field = lambda r, k: r.fields[k].contents()  # noqa: E731
    assert field(first, "general.architecture") == "llama"
    assert "<|im_start|>" in field(first, "tokenizer.chat_template")
    assert field(first, "split.count") == 2 and [field(p, "split.no") for p in parts] == [0, 1]
    assert sum(len(p.tensors) for p in parts) == field(first, "split.tensors.count")
    tokens = field(first, "tokenizer.ggml.tokens")
    assert len(tokens) == len(set(tokens)) == field(first, "llama.vocab_size")  # llama.cpp refuses duplicates


@pytest.mark.skipif(not shutil.which("docker") or images.image_hash(images.LLAMACPP_IMAGE) is None,
                    reason="the llama.cpp image is not built (python -m sim build)")
def test_the_real_llama_server_loads_the_split_gguf_and_generates(gguf, tmp_path):
    repo = generate_gguf_repo(tmp_path / "repo")
    port = free_port()
    name = f"sparkfleet-test-llama-{port}"
    subprocess.run(["docker", "run", "-d", "--rm", "--name", name, "-p", f"127.0.0.1:{port}:8080",
                    "-e", f"LLAMA_API_KEY={KEY}", "-v", f"{repo}:/models:ro", images.LLAMACPP_IMAGE,
                    "-m", f"/models/{GGUF_FILES[0]}", "--host", "0.0.0.0", "--port", "8080", "-c", "2048",
                    "-ngl", "999", "--jinja", "--metrics", "--alias", "tiny-llama"], check=True, capture_output=True)
    try:
        base, auth = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {KEY}"}
        wait_for(lambda: requests.get(base + "/health", timeout=1).status_code == 200, 30)
        assert requests.get(base + "/v1/models", timeout=5).status_code == 401
        assert requests.get(base + "/v1/models", headers=auth, timeout=5).json()["data"][0]["id"] == "tiny-llama"
        reply = requests.post(base + "/v1/chat/completions", headers=auth, timeout=30, json={
            "model": "tiny-llama", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}).json()
        assert reply["usage"]["completion_tokens"] == 8 and reply["choices"][0]["message"]["content"]
        assert "llamacpp:tokens_predicted_total 8" in requests.get(base + "/metrics", headers=auth, timeout=5).text
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)


def test_llamacpp_build_is_read_from_the_version_line():
    assert images.llamacpp_build("version: 0.7.0 (build 11669, commit Debian)\nbuilt with GNU") == "11669"
    assert images.llamacpp_build("version: 7000 (abc123)\n") == "7000"
    assert images.llamacpp_build("no such thing") is None


# ----------------------------------------------------------------------------- the SGLang stand-in


@pytest.fixture(scope="module")
def sglang(tmp_path_factory):
    work = tmp_path_factory.mktemp("sglang")
    table = work / "sglang.json"
    table.write_text(json.dumps(SGLANG_TABLE))
    config = work / "config.yaml"
    config.write_text(f"api-key: {KEY}\nenable-metrics: true\n")  # the key off the command line
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(STANDIN), "--mode", "sglang", "--flags-file", str(table),
                             "--model-path", str(make_model(work / "model")), "--served-model-name", "q-sglang",
                             "--host", "127.0.0.1", "--port", str(port), "--config", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={"SIM_LOAD_DELAY_S": "0", "SIM_KNOB_FILE": str(work / "knobs.json"),
                                 "PATH": "/usr/bin:/bin"})
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: requests.get(base + "/health", timeout=1).status_code == 200)
        yield base, table, work / "knobs.json"
    finally:
        proc.terminate()
        proc.wait(10)


def test_sglang_refuses_an_unknown_flag_as_argparse_does(sglang, tmp_path):
    _, table, _ = sglang
    cp = subprocess.run([sys.executable, str(STANDIN), "--mode", "sglang", "--flags-file", str(table),
                         "--model-path", str(tmp_path), "--max-model-len", "4096"],
                        capture_output=True, text=True, timeout=15)
    assert cp.returncode == 2
    assert "launch_server.py: error: unrecognized arguments: --max-model-len" in cp.stderr


def test_sglang_health_generate_generates_a_token_and_metrics_are_sglangs(sglang):
    base, _, _ = sglang
    before = requests.get(base + "/metrics", timeout=5).text
    assert requests.get(base + "/health_generate", timeout=5).status_code == 200
    after = requests.get(base + "/metrics", timeout=5).text  # /metrics needs no key, as SGLang's middleware
    count = lambda text: float(next(line.split()[-1] for line in text.splitlines()  # noqa: E731
                                    if line.startswith("sglang:generation_tokens_total")))
    assert count(after) == count(before) + 1
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
                 "sglang:prompt_tokens_total", "sglang:gen_throughput"):
        assert f'{name}{{model_name="q-sglang"}}' in after
    assert "vllm:" not in after


def test_sglang_key_from_its_config_file_guards_the_openai_routes(sglang):
    base, _, _ = sglang
    assert requests.get(base + "/v1/models", timeout=5).status_code == 401
    auth = {"Authorization": f"Bearer {KEY}"}
    assert requests.get(base + "/v1/models", headers=auth, timeout=5).json()["data"][0]["id"] == "q-sglang"
    reply = requests.post(base + "/v1/chat/completions", headers=auth, timeout=10, json={
        "model": "q-sglang", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}).json()
    assert reply["usage"]["completion_tokens"] == 3


def test_sglang_hang_knob_wedges_health_generate(sglang):
    base, _, knobs = sglang
    knobs.write_text(json.dumps({"fault": "generation-hang"}))
    try:
        assert requests.get(base + "/health", timeout=5).status_code == 200
        with pytest.raises(requests.Timeout):
            requests.get(base + "/health_generate", timeout=1.5)
    finally:
        knobs.write_text("{}")
    # a new request reads the cleared knob at once (the one held above ends at its next re-read, 0.5 s)
    assert requests.get(base + "/health_generate", timeout=5).status_code == 200


# ----------------------------------------------------------------------------- inventory/sim_engines.py


def test_the_engines_inventory_serves_three_engines_under_three_names_behind_door_1(tmp_path, monkeypatch):
    from sparkfleet.contract.settings import parse_settings
    from tests.unit.helpers import DEFAULTS, ROOT

    state = {"hosts": [{"name": f"spark-{n}", "ssh_port": 2200 + n, "api_port": 8000 + n,
                        "container": f"sparkfleet-spark-{n}", "fabric_address": None} for n in (1, 2, 3)],
             "service_hosts": [{"name": "door-1", "ssh_port": 2299, "container": "sparkfleet-door-1"}],
             "ssh_user": "root", "ssh_key": "/k", "image": images.ENGINE_IMAGE,
             "engine_images": {"vllm": images.ENGINE_IMAGE, "sglang": images.SGLANG_IMAGE,
                               "llamacpp": images.LLAMACPP_IMAGE},
             "registry": {"controller": "127.0.0.1:5000"},
             "hub": {"host_url": "http://hub", "controller_url": "http://127.0.0.1:1", "repo": "Qwen/Q",
                     "gguf_repo": GGUF_REPO_ID, "gguf_files": GGUF_FILES},
             "apt": {"repo_url": "http://apt/deb", "key_url": "http://apt/key", "key_fingerprint": "F" * 40}}
    (tmp_path / ".sim" / "fleets" / "t").mkdir(parents=True)
    (tmp_path / ".sim" / "fleets" / "t" / "state.json").write_text(json.dumps(state))
    (tmp_path / "inventory").mkdir()
    for name in ("sim.py", "sim_front_door.py", "sim_engines.py"):
        (tmp_path / "inventory" / name).write_text((ROOT / "inventory" / name).read_text())
    monkeypatch.setenv("SPARKFLEET_SIM_FLEET", "t")
    real_run = subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: SimpleNamespace(stdout="127.0.0.1:40080\n")
                        if cmd[:2] == ["docker", "port"] else real_run(cmd, **kw))
    groups = runpy.run_path(str(tmp_path / "inventory" / "sim_engines.py"))
    assert [n for n, _ in groups["front_door"]] == ["door-1"] and groups["monitoring"] == ["door-1"]
    parsed = {name: parse_settings(name, {**DEFAULTS, **data}) for name, data in groups["sparks"]}
    assert {n: (s.engine, s.engine_image) for n, s in parsed.items()} == {
        "spark-1": ("vllm", images.ENGINE_IMAGE), "spark-2": ("sglang", images.SGLANG_IMAGE),
        "spark-3": ("llamacpp", images.LLAMACPP_IMAGE)}
    assert len({s.served_model_name for s in parsed.values()}) == 3
    assert parsed["spark-3"].model_repo == GGUF_REPO_ID and parsed["spark-3"].model_files == GGUF_FILES
    assert parsed["spark-3"].llamacpp_version == images.LLAMACPP_BUILD


@pytest.mark.skipif(not images.SGLANG_FLAGS.exists(), reason="SGLang's flag table is not in this checkout")
def test_sglang_takes_the_command_sparkfleet_gives_it_with_the_real_table(tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(STANDIN), "--mode", "sglang", "--flags-file", str(images.SGLANG_FLAGS),
                             "--model-path", str(make_model(tmp_path / "model")), "--served-model-name", "q",
                             "--host", "127.0.0.1", "--port", str(port), "--context-length", "8192",
                             "--mem-fraction-static", "0.3", "--enable-metrics", "--tool-call-parser", "qwen3_coder",
                             "--reasoning-parser", "qwen3"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={"SIM_LOAD_DELAY_S": "0", "SIM_KNOB_FILE": str(tmp_path / "knobs.json")})
    try:
        wait_for(lambda: requests.get(f"http://127.0.0.1:{port}/health_generate", timeout=1).status_code == 200)
        assert "sglang:token_usage" in requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        proc.terminate()
        proc.wait(10)
