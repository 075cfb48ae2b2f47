"""A GGUF repository through the sim's hub (both official clients): `model_files` narrows the manifest, the
config comes from the first file's header by Range reads (no config.json, never the whole file), the plan's fit
counts the .gguf bytes, and the lock keys the selection."""

import json
import struct
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from sparkfleet.contract.settings import SettingsError
from sparkfleet.model import gguf, hubs
from sparkfleet.model.hubs import hub_resolver
from sparkfleet.release.engines import ENGINE_CLASSES
from sparkfleet.release.lock import Lock, Locking
from sparkfleet.release.plan import plan_hosts
from tests.conftest import ROOT, free_port, wait_http

from .helpers import host_data, run_fetch
from .test_gguf import write_gguf

REPO = "test-org/Tiny-GGUF"
VOCAB = 20_000  # a vocabulary of ~200 KB: the key-value section outgrows the first read the tests set


@pytest.fixture(scope="module")
def gguf_hub(tmp_path_factory):
    pytest.importorskip("gguf")
    data = tmp_path_factory.mktemp("gguf-hub")
    repo = data / REPO
    repo.mkdir(parents=True)
    write_gguf(repo / "tiny-Q4_K_M.gguf", vocab=VOCAB, layers=3, ctx=8192, tensor_shape=(512, 1024))
    write_gguf(repo / "tiny-Q8_0.gguf", vocab=VOCAB, layers=5)
    (repo / "split").mkdir()
    write_gguf(repo / "split/tiny-00001-of-00002.gguf", layers=7)
    (repo / "split/tiny-00002-of-00002.gguf").write_bytes(b"\0" * 4096)
    (repo / "README.md").write_text("a tiny GGUF repository\n")
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "sim/hub/server.py"), "--host", "127.0.0.1", "--port",
                             str(port), "--data", str(data), "--quiet"])
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/_sim/counters")
        yield url, repo
    finally:
        proc.terminate()
        proc.wait(10)


def admin(url, what, body=None):
    request = urllib.request.Request(f"{url}/_sim/{what}", data=None if body is None else json.dumps(body).encode(),
                                     method="GET" if body is None else "POST")
    return json.loads(urllib.request.urlopen(request).read())


LLAMACPP_IMAGE = ENGINE_CLASSES["llamacpp"].image


def settings_of(url, hub, model_files):
    return host_data(model_hub=hub, hub_endpoint=url, model_repo=REPO, engine="llamacpp", max_model_len=4096,
                     engine_image=LLAMACPP_IMAGE,
                     model_revision="main" if hub == "huggingface" else "master", model_files=model_files)


@pytest.fixture(autouse=True)
def small_first_read(monkeypatch):
    monkeypatch.setattr(hubs, "GGUF_FIRST_READ", 4096)
    hubs.read_gguf_config.cache_clear()


@pytest.mark.parametrize("hub", ["huggingface", "modelscope"])
def test_model_files_narrow_the_manifest_and_the_header_is_read_by_ranges(gguf_hub, hub):
    url, repo = gguf_hub
    admin(url, "reset", {})
    [plan] = plan_hosts([("a", settings_of(url, hub, ["*Q4_K_M*.gguf"]))], resolve=hub_resolver)
    assert [f.path for f in plan.manifest.files] == ["tiny-Q4_K_M.gguf"]
    assert plan.config["num_hidden_layers"] == 3 and plan.config["vocab_size"] == VOCAB
    assert plan.config["max_position_embeddings"] == 8192
    size = (repo / "tiny-Q4_K_M.gguf").stat().st_size
    assert plan.fit.weights_bytes == size == plan.manifest.weight_bytes
    ranges = [r for r in admin(url, "requests") if r["range"]]
    assert len(ranges) >= 2  # the first 4096 bytes, then on
    assert ranges[0]["range"] == "bytes=0-4095"
    assert admin(url, "counters")["total_bytes"] < size  # never the whole file
    assert plan.model_dir.endswith(plan.manifest.dir_name) and "-" in plan.manifest.dir_name.rsplit("@", 1)[1]


def test_a_split_set_plans_from_its_first_part(gguf_hub):
    url, _ = gguf_hub
    [plan] = plan_hosts([("a", settings_of(url, "huggingface", ["split/*.gguf"]))], resolve=hub_resolver)
    assert plan.config["num_hidden_layers"] == 7
    assert len(plan.manifest.files) == 2


def test_a_glob_matching_nothing_and_two_models_are_refused_naming_the_fix(gguf_hub):
    url, _ = gguf_hub
    with pytest.raises(SettingsError, match=r"'\*Q5\*\.gguf' matches no file .*tiny-Q4_K_M.gguf"):
        plan_hosts([("a", settings_of(url, "huggingface", ["*Q5*.gguf"]))], resolve=hub_resolver)
    with pytest.raises(SettingsError, match="set `model_files`"):
        plan_hosts([("a", settings_of(url, "huggingface", None))], resolve=hub_resolver)


def test_the_lock_keeps_each_selection_apart_and_plans_it_with_no_hub(gguf_hub):
    from sparkfleet.contract.settings import parse_settings

    url, _ = gguf_hub
    locking = Locking(Lock(), hub_resolver, None)
    q4 = parse_settings("a", settings_of(url, "huggingface", ["*Q4_K_M*.gguf"]))
    q8 = parse_settings("a", settings_of(url, "huggingface", ["*Q8_0*.gguf"]))
    assert locking.model(q4)[1]["num_hidden_layers"] == 3
    assert locking.model(q8)[1]["num_hidden_layers"] == 5
    lock = Lock.model_validate_json(locking.added.render())
    assert sorted(lock.models) == [f"huggingface:{REPO}@main?files=*Q4_K_M*.gguf",
                                   f"huggingface:{REPO}@main?files=*Q8_0*.gguf"]

    def no_hub(s):
        raise AssertionError("a locked release asks no hub")
    manifest, config, _ = Locking(lock, no_hub, None).model(q8)
    assert [f.path for f in manifest.files] == ["tiny-Q8_0.gguf"] and config["num_hidden_layers"] == 5
    assert manifest.selection == ("*Q8_0*.gguf",)


def test_a_hostile_or_short_header_is_refused_within_the_manifest_size(gguf_hub):
    _, repo = gguf_hub
    hostile = b"GGUF" + bytes([3, 0, 0, 0]) + b"\xff" * 16 + bytes(4096)
    with pytest.raises(gguf.GGUFError, match="tensor count claims"):
        hubs.read_gguf_header(lambda path, start, stop: hostile[start:stop], "x.gguf", len(hostile))
    data = (repo / "tiny-Q4_K_M.gguf").read_bytes()
    asked = []

    def read(path, start, stop):
        asked.append((start, stop))
        return data[start:stop]
    with pytest.raises(gguf.GGUFError, match="ends inside its header"):  # the manifest says 5000 bytes
        hubs.read_gguf_header(read, "x.gguf", 5000)
    assert max(stop for _, stop in asked) <= 5000
    with pytest.raises(gguf.GGUFError, match="the hub sent 10 of bytes 0-4095"):
        hubs.read_gguf_header(lambda path, start, stop: data[:10], "x.gguf", len(data))


@pytest.mark.parametrize("hub", ["huggingface", "modelscope"])
def test_the_fetch_job_downloads_and_verifies_only_the_selected_files(gguf_hub, hub, tmp_path):
    url, repo = gguf_hub
    [plan] = plan_hosts([("a", settings_of(url, hub, ["split/*.gguf"]) | {"model_root": str(tmp_path / "m")})],
                        resolve=hub_resolver)
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"manifest": plan.manifest.to_dict(), "model_dir": plan.model_dir,
                               "staging_dir": str(tmp_path / "m/.staging/x"), "endpoint": url}))
    rc, report = run_fetch(job)
    assert rc == 0, report
    assert sorted(report["fetched"]) == ["split/tiny-00001-of-00002.gguf", "split/tiny-00002-of-00002.gguf"]
    fetched = sorted(str(p.relative_to(plan.model_dir)) for p in Path(plan.model_dir).rglob("*.gguf"))
    assert fetched == sorted(report["fetched"])
    assert (Path(plan.model_dir) / fetched[0]).read_bytes() == (repo / fetched[0]).read_bytes()


def test_sparkfleet_plan_prints_the_gguf_fit_and_refuses_a_glob_that_matches_nothing(gguf_hub, tmp_path, capsys):
    from sparkfleet.cli import main

    url, repo = gguf_hub
    data = {k: v for k, v in settings_of(url, "huggingface", ["*Q4_K_M*.gguf"]).items()
            if k in ("model_hub", "hub_endpoint", "model_repo", "engine", "engine_image", "max_model_len", "model_revision",
                     "model_files")}
    inventory = tmp_path / "fleet.py"
    inventory.write_text(f"sparks = [('spark-1', {data!r})]\n")
    assert main(["plan", str(inventory), "--json"]) == 0
    [host] = json.loads(capsys.readouterr().out)["hosts"]
    assert host["manifest"]["files"] == 1 and host["manifest"]["bytes"] == (repo / "tiny-Q4_K_M.gguf").stat().st_size
    assert host["fit"]["weights_bytes"] == host["manifest"]["bytes"] and host["fit"]["decode_tokens_per_s_at_0"] > 0
    wrong = tmp_path / "wrong.py"  # another file: the first one's bytecode would be reused within a second
    wrong.write_text(f"sparks = [('spark-1', {data | {'model_files': ['*Q5_K_M*.gguf']}!r})]\n")
    assert main(["plan", str(wrong)]) == 2
    err = capsys.readouterr().err
    assert "'*Q5_K_M*.gguf' matches no file" in err and "tiny-Q4_K_M.gguf" in err and "Traceback" not in err


def test_a_hub_serving_a_hostile_header_gets_no_plan_of_it_and_nothing_is_cached(gguf_hub, monkeypatch):
    from sparkfleet.contract.settings import parse_settings

    url, _ = gguf_hub
    hostile = b"GGUF" + struct.pack("<IQQ", 3, 1, 2**62) + bytes(8192)
    monkeypatch.setattr(hubs, "_RANGES", {"huggingface": lambda m, e, t: lambda p, a, b: hostile[a:b]})
    s = parse_settings("a", settings_of(url, "huggingface", ["*Q4_K_M*.gguf"]))
    manifest, config, error = hub_resolver(s)
    assert manifest is None and config is None
    assert "refusing the GGUF header of huggingface:test-org/Tiny-GGUF tiny-Q4_K_M.gguf" in error
    assert "key-value count claims" in error
    assert not list((hubs.cache_dir() / "configs").rglob("*.config.json"))
