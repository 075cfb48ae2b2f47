"""The simulated hub (sim/hub) against the official clients, over 127.0.0.1 only.

One in-process server per module serves a small generated repo (4 x 1 MiB
shards); every test starts from zeroed counters and knobs.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
import threading
import time
import types
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sim.hub.model import generate_repo  # noqa: E402
from sim.hub.server import make_server, server_url  # noqa: E402

REPO = "Qwen/Qwen3.5-35B-A3B-FP8"
SHARD = "model-00001-of-00004.safetensors"
SHARD_KEY = f"{REPO}/{SHARD}"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Hub:
    url: str
    repo_dir: Path
    files: dict[str, bytes]

    @property
    def size(self) -> int:
        return sum(len(b) for b in self.files.values())

    def get(self, path: str, headers: dict | None = None) -> tuple[int, dict, bytes]:
        req = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def head(self, path: str) -> tuple[int, dict]:
        req = urllib.request.Request(self.url + path, method="HEAD")
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, dict(r.headers)
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers)

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as e:
            return e.code, json.load(e)

    def admin(self, what: str):
        status, _, body = self.get(f"/_sim/{what}")
        assert status == 200
        return json.loads(body)

    def knobs(self, **knobs) -> None:
        status, body = self.post("/_sim/knobs", knobs)
        assert status == 200, body

    def downloads(self, key: str) -> list[dict]:
        """File GETs seen for '<repo>/<path>' (from the server's request log)."""
        path = key[len(REPO) + 1:]
        return [r for r in self.admin("requests") if r["method"] == "GET"
                and ("/resolve/" in r["path"] and r["path"].endswith("/" + path)
                     or f"FilePath={path}" in r["path"])]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    data = tmp_path_factory.mktemp("hubdata")
    repo_dir = generate_repo(data / REPO, shards=4, shard_mb=1.0)
    files = {p.relative_to(repo_dir).as_posix(): p.read_bytes() for p in sorted(repo_dir.rglob("*")) if p.is_file()}
    server = make_server(data, "127.0.0.1", 0, log=False)  # assertions read /_sim/requests instead
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield Hub(server_url(server), repo_dir, files)
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(autouse=True)
def _fresh_hub(hub):
    assert hub.post("/_sim/reset", {})[0] == 200
    yield


@pytest.fixture
def ms_env(hub, monkeypatch, tmp_path):
    """Point modelscope at the hub. modelscope_hub reads MODELSCOPE_ENDPOINT when it first builds its
    process-wide default config (modelscope_hub.config.get_default_config), so drop that cache too."""
    import modelscope_hub.config as ms_config

    monkeypatch.setenv("MODELSCOPE_ENDPOINT", hub.url)
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "ms-cache"))
    monkeypatch.setenv("MODELSCOPE_HOME", str(tmp_path / "ms-home"))
    ms_config.set_default_config(None)
    yield
    ms_config.set_default_config(None)


def _assert_same_files(local_dir: Path, expected: dict[str, bytes]) -> None:
    for path, data in expected.items():
        got = (local_dir / path).read_bytes()
        assert len(got) == len(data) and got == data, path


# ---------------------------------------------------------------- the generated repo


def test_generate_repo_is_deterministic_and_shaped_like_the_real_one(tmp_path):
    a = generate_repo(tmp_path / "a", shards=3, shard_mb=0.25, seed=7)
    b = generate_repo(tmp_path / "b", shards=3, shard_mb=0.25, seed=7)
    c = generate_repo(tmp_path / "c", shards=3, shard_mb=0.25, seed=8)
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    assert all((a / n).read_bytes() == (b / n).read_bytes() for n in names)
    assert (a / "model-00001-of-00003.safetensors").read_bytes() != (c / "model-00001-of-00003.safetensors").read_bytes()
    for n in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "chat_template.jinja", "README.md", "model.safetensors.index.json"):
        assert n in names

    cfg = json.loads((a / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3_5MoeForConditionalGeneration"]
    assert cfg["model_type"] == "qwen3_5_moe"
    assert cfg["quantization_config"] == {**cfg["quantization_config"], "quant_method": "fp8", "fmt": "e4m3",
                                          "weight_block_size": [128, 128]}
    assert "vision_config" in cfg
    t = cfg["text_config"]
    assert t["model_type"] == "qwen3_5_moe_text" and t["num_hidden_layers"] == 40
    assert t["layer_types"] == (["linear_attention"] * 3 + ["full_attention"]) * 10
    assert (t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"], t["hidden_size"]) == (16, 2, 256, 2048)
    assert (t["num_experts"], t["num_experts_per_tok"], t["max_position_embeddings"]) == (256, 8, 262144)
    assert t["torch_dtype"] == "bfloat16" and t["vocab_size"] == 248320

    index = json.loads((a / "model.safetensors.index.json").read_text())
    total = 0
    for i in range(1, 4):
        name = f"model-{i:05d}-of-00003.safetensors"
        raw = (a / name).read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8:8 + n])
        data_len = len(raw) - 8 - n
        tensors = {k: v for k, v in header.items() if k != "__metadata__"}
        assert {v["dtype"] for v in tensors.values()} == {"F8_E4M3", "BF16"}
        assert any(k.endswith("mlp.experts.0.down_proj.weight") for k in tensors)
        assert max(v["data_offsets"][1] for v in tensors.values()) == data_len
        for k, v in tensors.items():
            assert index["weight_map"][k] == name
            total += v["data_offsets"][1] - v["data_offsets"][0]
    assert index["metadata"]["total_size"] == total


# ---------------------------------------------------------------- huggingface_hub


def test_hf_snapshot_download_is_byte_identical_verified_and_counted(hub, tmp_path):
    from huggingface_hub import HfApi, snapshot_download

    local = Path(snapshot_download(REPO, revision="main", endpoint=hub.url, local_dir=tmp_path / "hf",
                                   cache_dir=tmp_path / "hf-cache"))
    _assert_same_files(local, hub.files)

    counters = hub.admin("counters")
    assert counters["total_bytes"] == hub.size
    assert counters["files"] == {f"{REPO}/{p}": len(b) for p, b in hub.files.items()}
    assert counters["clients"] == {"127.0.0.1": hub.size}

    result = HfApi(endpoint=hub.url).verify_repo_checksums(REPO, local_dir=local)
    assert result.mismatches == [] and result.missing_paths == [] and result.extra_paths == []
    assert result.checked_count == len(hub.files)

    commit = hub.admin("repos")[REPO]["commit"]
    paths = [(r["method"], r["path"].split("?")[0]) for r in hub.admin("requests")]
    assert ("GET", f"/api/models/{REPO}/revision/main") in paths
    assert ("GET", f"/api/models/{REPO}/tree/{commit}") in paths
    assert ("HEAD", f"/{REPO}/resolve/{commit}/{SHARD}") in paths
    assert ("GET", f"/{REPO}/resolve/{commit}/{SHARD}") in paths


def test_hf_model_info_and_tree_report_the_real_hashes(hub):
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub.url)
    commit = hub.admin("repos")[REPO]["commit"]
    info = api.model_info(REPO, revision="main", files_metadata=True)
    assert info.sha == commit and len(commit) == 40
    siblings = {s.rfilename: s for s in info.siblings}
    assert set(siblings) == set(hub.files)
    for path, data in hub.files.items():
        s = siblings[path]
        assert s.size == len(data)
        if path.endswith(".safetensors"):
            assert s.lfs is not None and s.lfs.sha256 == _sha256(data) and s.lfs.size == len(data)
        else:
            assert s.lfs is None and s.blob_id == _git_sha1(data)

    tree = {f.path: f for f in api.list_repo_tree(REPO, revision=commit, recursive=True)}
    assert set(tree) == set(hub.files)
    for path, data in hub.files.items():
        assert tree[path].xet_hash is None
        if tree[path].lfs:
            assert tree[path].lfs.sha256 == _sha256(data)
        else:
            assert tree[path].blob_id == _git_sha1(data)

    # every name resolves to the same commit
    assert api.model_info(REPO, revision=commit).sha == commit
    assert api.model_info(REPO, revision="master").sha == commit


def test_hf_errors_map_to_the_clients_exceptions(hub):
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    api = HfApi(endpoint=hub.url)
    with pytest.raises(RevisionNotFoundError):
        api.model_info(REPO, revision="no-such-branch")
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("Qwen/no-such-model")


def test_no_xet_signals_are_ever_sent(hub):
    status, headers = hub.head(f"/{REPO}/resolve/main/{SHARD}")
    assert status == 200
    lower = {k.lower(): v for k, v in headers.items()}
    assert not [k for k in lower if k.startswith("x-xet")]
    assert "link" not in lower
    assert lower["etag"] == f'"{_sha256(hub.files[SHARD])}"'
    assert lower["x-linked-etag"] == f'"{_sha256(hub.files[SHARD])}"'
    assert lower["x-linked-size"] == str(len(hub.files[SHARD]))
    _, headers, _ = hub.get(f"/{REPO}/resolve/main/config.json")
    assert headers["ETag"] == f'"{_git_sha1(hub.files["config.json"])}"'
    _, _, body = hub.get(f"/api/models/{REPO}/tree/main?recursive=true")
    assert all("xetHash" not in e for e in json.loads(body))


def test_hf_cut_once_is_retried_inside_the_call_but_from_byte_zero(hub, tmp_path):
    """huggingface_hub 2.4.0 retries a broken body inside http_get, asking for `Range: bytes=<written>-`.
    It writes in DOWNLOAD_CHUNK_SIZE (10 MiB) pieces, so a cut inside the first 10 MiB leaves nothing
    written: the retry asks for the whole file again (no Range)."""
    from huggingface_hub import hf_hub_download

    size = len(hub.files[SHARD])
    hub.knobs(cut_once={SHARD_KEY: 300_000})
    path = hf_hub_download(REPO, SHARD, revision="main", endpoint=hub.url, local_dir=tmp_path / "hf",
                           cache_dir=tmp_path / "hf-cache")
    assert Path(path).read_bytes() == hub.files[SHARD]
    gets = hub.downloads(SHARD_KEY)
    assert [(g["sent"], g["range"]) for g in gets] == [(300_000, None), (size, None)]
    assert hub.admin("counters")["files"][SHARD_KEY] == 300_000 + size


def test_hf_cut_once_resumes_with_range_once_bytes_reach_disk(hub, tmp_path, monkeypatch):
    """With a smaller write chunk (as on real multi-GB shards, where 10 MiB pieces do land before a
    cut), the in-call retry resumes from what was written: served bytes stay within 5% of the file."""
    from huggingface_hub import constants, hf_hub_download

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)
    size = len(hub.files[SHARD])
    hub.knobs(cut_once={SHARD_KEY: 300_000})
    path = hf_hub_download(REPO, SHARD, revision="main", endpoint=hub.url, local_dir=tmp_path / "hf",
                           cache_dir=tmp_path / "hf-cache")
    assert Path(path).read_bytes() == hub.files[SHARD]
    gets = hub.downloads(SHARD_KEY)
    assert len(gets) == 2 and gets[0]["range"] is None
    resumed_from = int(gets[1]["range"].removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_from <= 300_000 and gets[1]["status"] == 206
    assert hub.admin("counters")["files"][SHARD_KEY] <= 1.05 * size


def test_hf_failed_download_keeps_no_partial_file_so_the_next_call_starts_over(hub, tmp_path, monkeypatch):
    """After the in-call retries give up, huggingface_hub 2.4.0 deletes its process-unique
    `<etag>.<uuid>.incomplete` file: a second hf_hub_download cannot resume and fetches every byte again."""
    from huggingface_hub import file_download, hf_hub_download

    monkeypatch.setattr(file_download, "time", types.SimpleNamespace(sleep=lambda s: None))
    size = len(hub.files[SHARD])
    local = tmp_path / "hf"
    hub.knobs(cut_after=300_000)
    with pytest.raises(Exception):
        hf_hub_download(REPO, SHARD, revision="main", endpoint=hub.url, local_dir=local,
                        cache_dir=tmp_path / "hf-cache")
    assert not (local / SHARD).exists()
    assert not list(local.rglob("*.incomplete"))
    failed = hub.admin("counters")["files"][SHARD_KEY]
    assert failed >= 300_000

    hub.knobs(cut_after=None)
    path = hf_hub_download(REPO, SHARD, revision="main", endpoint=hub.url, local_dir=local,
                           cache_dir=tmp_path / "hf-cache")
    assert Path(path).read_bytes() == hub.files[SHARD]
    last = hub.downloads(SHARD_KEY)[-1]
    assert last["range"] is None and last["sent"] == size
    assert hub.admin("counters")["files"][SHARD_KEY] == failed + size


def test_corrupt_file_keeps_its_size_but_not_its_listed_hash(hub, tmp_path):
    from huggingface_hub import HfApi, hf_hub_download

    hub.knobs(corrupt=[SHARD_KEY])
    listed = {s.rfilename: s for s in HfApi(endpoint=hub.url).model_info(REPO, files_metadata=True).siblings}
    path = Path(hf_hub_download(REPO, SHARD, revision="main", endpoint=hub.url, local_dir=tmp_path / "hf",
                                cache_dir=tmp_path / "hf-cache"))  # the client checks only the size
    got = path.read_bytes()
    assert len(got) == listed[SHARD].size == len(hub.files[SHARD])
    assert _sha256(got) != listed[SHARD].lfs.sha256 == _sha256(hub.files[SHARD])
    assert sum(a != b for a, b in zip(got, hub.files[SHARD])) == 1
    result = HfApi(endpoint=hub.url).verify_repo_checksums(REPO, local_dir=tmp_path / "hf")
    assert [m["path"] for m in result.mismatches] == [SHARD]
    # a ranged read that does not cover the middle is untouched
    _, _, head = hub.get(f"/{REPO}/resolve/main/{SHARD}", {"Range": "bytes=0-99"})
    assert head == hub.files[SHARD][:100]


# ---------------------------------------------------------------- modelscope


def test_modelscope_snapshot_download_and_listing(hub, ms_env, tmp_path):
    from modelscope import snapshot_download
    from modelscope_hub import HubApi

    local = Path(snapshot_download(REPO, revision="master", local_dir=str(tmp_path / "ms")))
    _assert_same_files(local, hub.files)
    counters = hub.admin("counters")
    assert counters["total_bytes"] == hub.size
    assert counters["files"] == {f"{REPO}/{p}": len(b) for p, b in hub.files.items()}

    listing = HubApi(endpoint=hub.url).list_repo_files(REPO, "model", revision="master", recursive=True)
    by_path = {f.path: f for f in listing}
    assert set(by_path) == set(hub.files)
    for path, data in hub.files.items():
        assert by_path[path].sha256 == _sha256(data) and by_path[path].size == len(data)

    paths = {(r["method"], r["path"]) for r in hub.admin("requests")}
    assert ("GET", f"/api/v1/models/{REPO}/repo/files?Revision=master&Recursive=True") in paths
    assert ("GET", f"/api/v1/models/{REPO}/repo?Revision=master&FilePath={SHARD}") in paths


def test_modelscope_allow_patterns_fetch_only_matching_files(hub, ms_env, tmp_path):
    from modelscope import snapshot_download

    local = Path(snapshot_download(REPO, revision="master", local_dir=str(tmp_path / "ms"),
                                   allow_patterns=["*.json"]))
    wanted = {p: b for p, b in hub.files.items() if p.endswith(".json")}
    _assert_same_files(local, wanted)
    assert not list(local.glob("*.safetensors"))
    assert hub.admin("counters")["total_bytes"] == sum(len(b) for b in wanted.values())


def test_modelscope_keeps_its_partial_file_and_resumes_on_the_next_call(hub, ms_env, tmp_path, monkeypatch):
    import modelscope_hub._download as ms_download
    from modelscope.hub.file_download import model_file_download

    monkeypatch.setattr(ms_download, "DOWNLOAD_RETRY_TIMES", 0)  # fail on the first cut instead of retrying
    size = len(hub.files[SHARD])
    local = tmp_path / "ms"
    hub.knobs(cut_once={SHARD_KEY: 300_000})
    with pytest.raises(Exception):
        model_file_download(REPO, SHARD, revision="master", local_dir=str(local))
    partial = local / (SHARD + ".incomplete")
    assert partial.stat().st_size == 300_000

    path = model_file_download(REPO, SHARD, revision="master", local_dir=str(local))
    assert Path(path).read_bytes() == hub.files[SHARD]
    last = hub.downloads(SHARD_KEY)[-1]
    assert last["range"] == "bytes=300000-" and last["status"] == 206
    assert hub.admin("counters")["files"][SHARD_KEY] == size


# ---------------------------------------------------------------- raw HTTP and knobs


@pytest.mark.parametrize("route", [f"/{REPO}/resolve/main/{SHARD}",
                                   f"/api/v1/models/{REPO}/repo?Revision=master&FilePath={SHARD}"])
def test_range_requests(hub, route):
    data = hub.files[SHARD]
    status, headers, body = hub.get(route, {"Range": "bytes=1000-"})
    assert status == 206 and body == data[1000:]
    assert headers["Content-Range"] == f"bytes 1000-{len(data) - 1}/{len(data)}"
    status, headers, body = hub.get(route, {"Range": "bytes=10-19"})
    assert status == 206 and body == data[10:20] and headers["Content-Length"] == "10"
    status, _, body = hub.get(route, {"Range": "bytes=-8"})
    assert status == 206 and body == data[-8:]
    status, headers, _ = hub.get(route, {"Range": f"bytes={len(data)}-"})
    assert status == 416 and headers["Content-Range"] == f"bytes */{len(data)}"
    status, _, body = hub.get(route)
    assert status == 200 and body == data
    assert hub.admin("counters")["files"][SHARD_KEY] == len(data) - 1000 + 10 + 8 + len(data)


def test_down_answers_503_except_admin(hub):
    hub.knobs(down=True)
    assert hub.get(f"/api/models/{REPO}/revision/main")[0] == 503
    assert hub.head(f"/{REPO}/resolve/main/config.json")[0] == 503
    assert hub.get(f"/api/v1/models/{REPO}/repo/files?Revision=master&Recursive=True")[0] == 503
    assert hub.admin("knobs")["down"] is True
    assert hub.post("/_sim/reset", {})[0] == 200
    assert hub.get(f"/api/models/{REPO}/revision/main")[0] == 200


def test_throttle_and_knob_validation(hub):
    hub.knobs(throttle_bps=1_000_000)
    t0 = time.monotonic()
    status, _, body = hub.get(f"/{REPO}/resolve/main/{SHARD}", {"Range": "bytes=0-299999"})
    assert status == 206 and len(body) == 300_000
    assert time.monotonic() - t0 >= 0.25
    assert hub.post("/_sim/knobs", {"no_such_knob": 1})[0] == 400
    assert hub.post("/_sim/knobs", {"corrupt": "not-a-list"})[0] == 400


def test_counters_are_thread_safe(hub):
    def fetch():
        for _ in range(5):
            hub.get(f"/{REPO}/resolve/main/config.json")

    threads = [threading.Thread(target=fetch) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    counters = hub.admin("counters")
    assert counters["files"][f"{REPO}/config.json"] == 40 * len(hub.files["config.json"])
    assert counters["requests"] == 40


@pytest.mark.parametrize("how", ["script", "module"])
def test_server_runs_with_the_standard_library_only(tmp_path, how):
    """`python3 -S` (no site-packages) both as a plain script and as `-m sim.hub.server`."""
    server_py = ROOT / "sim" / "hub" / "server.py"
    target = [str(server_py)] if how == "script" else ["-m", "sim.hub.server"]
    cmd = [sys.executable, "-S", *target, "--host", "127.0.0.1", "--port", "0", "--data", str(tmp_path / "data"),
           "--generate", REPO, "--shards", "2", "--shard-mb", "0.25"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    try:
        url = None
        deadline = time.monotonic() + 15
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            if line.startswith("listening on "):
                url = line.split()[-1]
        assert url, f"server did not start: {proc.poll()}"
        with urllib.request.urlopen(f"{url}/api/models/{REPO}/revision/main", timeout=10) as r:
            info = json.load(r)
        assert sorted(s["rfilename"] for s in info["siblings"] if s["rfilename"].endswith(".safetensors")) == [
            "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
        log = proc.stderr.readline()
        assert f"GET /api/models/{REPO}/revision/main" in log and " 200 " in log
    finally:
        proc.terminate()
        proc.wait(timeout=10)
