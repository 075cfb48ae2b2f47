"""files/sparkfleet-fetch, the host-side verifier, run here against the local hub."""

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from sparkfleet.plan import plan_hosts
from sparkfleet.verify import files_needing_work

from .helpers import ROOT, host_data

FETCH = ROOT / "files" / "sparkfleet-fetch"


def knobs(hub, **values):
    body = json.dumps(values).encode()
    urllib.request.urlopen(urllib.request.Request(f"{hub}/_sim/knobs", data=body, method="POST")).read()


def reset(hub):
    urllib.request.urlopen(urllib.request.Request(f"{hub}/_sim/reset", data=b"{}", method="POST")).read()


@pytest.fixture(params=["modelscope", "huggingface"])
def job(request, local_hub, tmp_path):
    reset(local_hub)
    [plan] = plan_hosts([("a", host_data(model_hub=request.param, hub_endpoint=local_hub,
                                         model_revision="main" if request.param == "huggingface" else "master",
                                         model_root=str(tmp_path / "models")))])
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"manifest": plan.manifest.to_dict(), "model_dir": plan.model_dir,
                                "staging_dir": str(tmp_path / "models/.staging/x"), "endpoint": local_hub}))
    yield path, plan
    reset(local_hub)


def run_fetch(job_path, *extra):
    env = {**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HOME": str(job_path.parent / "hf"),
           "MODELSCOPE_CACHE": str(job_path.parent / "ms")}
    proc = subprocess.run([sys.executable, str(FETCH), str(job_path), "--env-file", "/nonexistent", *extra],
                          capture_output=True, text=True, env=env, timeout=120)
    return proc.returncode, (json.loads(proc.stdout.splitlines()[-1]) if proc.returncode == 0 else proc.stderr)


def host_view(model_dir: Path):
    """What the ModelFiles fact would report: the record and each file's stat."""
    record = json.loads((model_dir / ".sparkfleet-verified.json").read_text())
    files = {}
    for path in model_dir.rglob("*"):
        if path.is_file() and path.name != ".sparkfleet-verified.json":
            st = path.stat()
            files[str(path.relative_to(model_dir))] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}
    return record, files


def test_fetch_verify_and_converge(job, hub_counters):
    job_path, plan = job
    model_dir = Path(plan.model_dir)
    rc, report = run_fetch(job_path)
    assert rc == 0, report
    assert sorted(report["fetched"]) == sorted(f.path for f in plan.manifest.files)
    assert hub_counters()["total_bytes"] >= plan.manifest.total_bytes
    assert files_needing_work(plan.manifest, *host_view(model_dir)) == []
    assert not (model_dir.parent / ".staging" / "x").exists()

    # Re-run: nothing fetched, nothing re-hashed (the record vouches by size, mtime, inode).
    served = hub_counters()["total_bytes"]
    rc, report = run_fetch(job_path)
    assert (rc, report["fetched"], report["rehashed"]) == (0, [], 0)
    assert hub_counters()["total_bytes"] == served


def test_damaged_shard_is_refetched_alone(job, hub_counters):
    job_path, plan = job
    assert run_fetch(job_path)[0] == 0
    shard = next(f for f in plan.manifest.files if f.path.endswith(".safetensors"))
    target = Path(plan.model_dir) / shard.path
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    assert files_needing_work(plan.manifest, *host_view(Path(plan.model_dir))) == [shard.path]
    before = hub_counters()["files"]
    rc, report = run_fetch(job_path)
    assert rc == 0 and report["fetched"] == [shard.path]
    after = hub_counters()["files"]
    grown = {k for k in after if after[k] != before.get(k, 0)}
    assert grown == {f"{plan.manifest.repo}/{shard.path}"}


def test_hub_serving_bad_bytes_fails_and_lands_nothing(job):
    job_path, plan = job
    shard = next(f for f in plan.manifest.files if f.path.endswith(".safetensors"))
    knobs(job_path and plan.settings.hub_endpoint, corrupt=[f"{plan.manifest.repo}/{shard.path}"])
    rc, stderr = run_fetch(job_path)
    assert rc != 0 and shard.path in stderr
    assert not (Path(plan.model_dir) / shard.path).exists()
    record = json.loads((Path(plan.model_dir) / ".sparkfleet-verified.json").read_text())
    assert shard.path not in record and len(record) == len(plan.manifest.files) - 1


def test_full_verify_rehashes_everything(job):
    job_path, plan = job
    assert run_fetch(job_path)[0] == 0
    rc, report = run_fetch(job_path, "--full-verify")
    assert rc == 0 and report["rehashed"] == len(plan.manifest.files) and report["fetched"] == []
