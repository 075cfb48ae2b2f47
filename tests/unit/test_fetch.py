"""files/sparkfleet-fetch, the host-side verifier, run here against the local hub."""

import json
import os
import urllib.request
from pathlib import Path

import pytest

from sparkfleet.host.model_files import files_needing_work
from sparkfleet.model.hubs import hub_resolver
from sparkfleet.release.plan import plan_hosts

from .helpers import host_data, run_fetch, start_share


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
                                         model_root=str(tmp_path / "models")))], resolve=hub_resolver)
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"manifest": plan.manifest.to_dict(), "model_dir": plan.model_dir,
                                "staging_dir": str(tmp_path / "models/.staging/x"), "endpoint": local_hub}))
    yield path, plan
    reset(local_hub)


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


def test_extras_are_removed_and_reported(job):
    """After a converge the directory holds exactly the manifest's files and the record."""
    job_path, plan = job
    model_dir = Path(plan.model_dir)
    assert run_fetch(job_path)[0] == 0
    outside = job_path.parent / "outside.txt"
    outside.write_text("not the model's")
    (model_dir / "notes.txt").write_text("left behind")
    (model_dir / "tokenizer.json.orig").symlink_to(outside)
    (model_dir / "old" / "deep").mkdir(parents=True)
    (model_dir / "old" / "deep" / "x.bin").write_bytes(b"x")
    os.replace(model_dir / "config.json", model_dir / "moved.json")
    (model_dir / "config.json").symlink_to(outside)  # a manifest name, but a symlink: never trusted
    rc, report = run_fetch(job_path)
    assert rc == 0, report
    assert report["removed"] == ["config.json", "moved.json", "notes.txt", "old", "old/deep", "old/deep/x.bin",
                                 "tokenizer.json.orig"]
    assert report["fetched"] == ["config.json"]
    names = sorted(str(p.relative_to(model_dir)) for p in model_dir.rglob("*") if not p.is_dir())
    assert names == sorted([".sparkfleet-verified.json", *(f.path for f in plan.manifest.files)])
    assert not (model_dir / "config.json").is_symlink() and outside.read_text() == "not the model's"
    rc, report = run_fetch(job_path)
    assert (rc, report["removed"], report["fetched"], report["rehashed"]) == (0, [], [], 0)


@pytest.fixture
def seed_share(local_hub, tmp_path):
    """A seed host's share: its verified model directory served read-only, to holders of the token."""
    reset(local_hub)
    [plan] = plan_hosts([("seed", host_data(hub_endpoint=local_hub, model_root=str(tmp_path / "seed")))],
                        resolve=hub_resolver)
    job = tmp_path / "seed-job.json"
    job.write_text(json.dumps({"manifest": plan.manifest.to_dict(), "model_dir": plan.model_dir,
                               "staging_dir": str(tmp_path / "seed/.staging/x"), "endpoint": local_hub}))
    assert run_fetch(job)[0] == 0
    token = tmp_path / "fleet.token"
    token.write_text("unit-test-fleet-token\n")
    proc, url = start_share(tmp_path / "seed", token)
    yield plan, f"{url}/{plan.manifest.dir_name}"
    proc.terminate()
    proc.wait(10)
    reset(local_hub)


def peer_job(tmp_path, plan, peers, endpoint):
    path = tmp_path / "peer-job.json"
    model_dir = tmp_path / "peer" / plan.manifest.dir_name
    path.write_text(json.dumps({"manifest": plan.manifest.to_dict(), "model_dir": str(model_dir),
                                "staging_dir": str(tmp_path / "peer/.staging/x"), "endpoint": endpoint,
                                "peers": peers}))
    return path, model_dir


def test_peer_fetches_from_the_lan_not_the_hub(seed_share, tmp_path, hub_counters):
    plan, share = seed_share
    served = hub_counters()["total_bytes"]
    job_path, model_dir = peer_job(tmp_path, plan, ["http://127.0.0.1:9/unreachable", share],
                                   plan.settings.hub_endpoint)
    rc, report = run_fetch(job_path, "--token-file", str(tmp_path / "fleet.token"))
    assert rc == 0 and len(report["fetched"]) == len(plan.manifest.files)
    assert hub_counters()["total_bytes"] == served  # not one byte from the hub
    assert files_needing_work(plan.manifest, *host_view(model_dir)) == []


def test_peer_with_bad_bytes_falls_back_to_the_hub(seed_share, tmp_path, hub_counters):
    plan, share = seed_share
    shard = next(f for f in plan.manifest.files if f.path.endswith(".safetensors"))
    seed_file = Path(plan.model_dir) / shard.path
    data = bytearray(seed_file.read_bytes())
    data[7] ^= 1
    seed_file.write_bytes(bytes(data))  # the seed's record still lists it: the peer must not trust that
    before = hub_counters()
    job_path, model_dir = peer_job(tmp_path, plan, [share], plan.settings.hub_endpoint)
    rc, report = run_fetch(job_path, "--token-file", str(tmp_path / "fleet.token"))
    assert rc == 0 and files_needing_work(plan.manifest, *host_view(model_dir)) == [], report
    key = f"{plan.manifest.repo}/{shard.path}"
    assert hub_counters()["files"][key] == before["files"][key] + shard.size  # that shard alone, from the hub
    assert hub_counters()["total_bytes"] == before["total_bytes"] + shard.size


def test_staged_files_are_verified_before_they_count(local_hub, tmp_path):
    [plan] = plan_hosts([("a", host_data(hub_endpoint=local_hub))], resolve=hub_resolver)
    source = tmp_path / "controller"
    job = tmp_path / "c.json"
    job.write_text(json.dumps({"manifest": plan.manifest.to_dict(), "model_dir": str(source),
                               "staging_dir": str(tmp_path / ".s"), "endpoint": local_hub}))
    assert run_fetch(job)[0] == 0
    staging = tmp_path / "host/.staging/x"
    for f in plan.manifest.files:
        (staging / f.path).parent.mkdir(parents=True, exist_ok=True)
        (staging / f.path).write_bytes((source / f.path).read_bytes())
    shard = next(f for f in plan.manifest.files if f.path.endswith(".safetensors"))
    (staging / shard.path).write_bytes(b"\0" * shard.size)  # damaged on the way
    job.write_text(json.dumps({"manifest": plan.manifest.to_dict(), "model_dir": str(tmp_path / "host/m"),
                               "staging_dir": str(staging), "endpoint": "http://127.0.0.1:9", "staged": True}))
    rc, stderr = run_fetch(job)
    assert rc == 3 and shard.path in stderr
    assert not (tmp_path / "host/m" / shard.path).exists() and (tmp_path / "host/m/config.json").exists()
