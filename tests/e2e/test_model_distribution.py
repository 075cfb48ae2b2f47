"""Model bytes at fleet scale, on the simulated fleet: one hub download per fleet,
resume after a cut, a damaged shard re-fetched alone, and an air-gapped host."""

import json
import subprocess
import urllib.request

import pytest

from .conftest import HOSTS, ROOT, converge, ssh, started_at

pytestmark = pytest.mark.e2e
REPO = "Qwen/Qwen3.5-35B-A3B-FP8"


def hub_get(hub, what):
    return json.loads(urllib.request.urlopen(f"{hub}/_sim/{what}").read())


def hub_post(hub, what, body):
    request = urllib.request.Request(f"{hub}/_sim/{what}", data=json.dumps(body).encode(), method="POST")
    return json.loads(urllib.request.urlopen(request).read())


def model_dir(state, host) -> str:
    return json.loads(ssh(state, host, "cat /etc/sparkfleet/release.json"))["model_dir"]


def first_shard(hub) -> tuple[str, int]:
    files = hub_get(hub, "repos")[REPO]["files"]
    path = sorted(p for p in files if p.endswith(".safetensors"))[0]
    return path, files[path]["size"]


def test_peer_distribution_serves_the_model_once(hub, first_converge):
    """The first converge ran with the default, model_source = "peer"."""
    counters = first_converge.hub_counters
    model_bytes = hub_get(hub, "repos")[REPO]["size"]
    assert model_bytes <= counters["total_bytes"] <= 1.05 * model_bytes
    assert len([c for c, n in counters["clients"].items() if n >= model_bytes]) == 1


def test_cut_transfer_resumes(sim_fleet, hub, converged_fleet):
    path, size = first_shard(hub)
    host = HOSTS[2]
    ssh(sim_fleet, host, f"rm -f '{model_dir(sim_fleet, host)}/{path}'")
    hub_post(hub, "reset", {})
    hub_post(hub, "knobs", {"cut_once": {f"{REPO}/{path}": size // 3}})
    result = converge("--limit", host, "--data", "model_source=hub")
    assert result.returncode == 0, result.output[-3000:]
    served = hub_get(hub, "counters")["files"]
    assert size <= served[f"{REPO}/{path}"] <= 1.05 * size
    assert set(served) == {f"{REPO}/{path}"}
    downloads = [r for r in hub_get(hub, "requests") if r["path"].endswith(path) and r["method"] == "GET"]
    assert len(downloads) >= 2 and any(r["range"] for r in downloads[1:])  # cut, then resumed with Range


def test_damaged_shard_is_refetched_there_alone(sim_fleet, hub, converged_fleet):
    path, size = first_shard(hub)
    victim = HOSTS[1]
    target = f"{model_dir(sim_fleet, victim)}/{path}"
    ssh(sim_fleet, victim, f"printf 'X' | dd of='{target}' bs=1 seek=4096 conv=notrunc status=none")
    before = {host: started_at(sim_fleet, host) for host in HOSTS}
    hub_post(hub, "reset", {})
    result = converge("--data", "model_source=hub")
    assert result.returncode == 0, result.output[-3000:]
    assert hub_get(hub, "counters")["files"] == {f"{REPO}/{path}": size}
    assert [h for h in HOSTS if result.changed[h]] == [victim]
    after = {host: started_at(sim_fleet, host) for host in HOSTS}
    assert [h for h in HOSTS if after[h] != before[h]] == [victim]


def test_air_gapped_host_converges_from_the_controller(sim_fleet, hub, converged_fleet, tmp_path):
    """Hub down and registry unreachable: model and image come from the controller over SSH."""
    from sim import fleet

    commit = hub_get(hub, "repos")[REPO]["commit"]
    image = sim_fleet["image"]
    archive = tmp_path / "engine-image.tar"
    subprocess.run(["docker", "save", "-o", str(archive), image], check=True, timeout=300)
    pin = ["--data", f"model_revision={commit}"]
    # The controller makes its verified copy while it can still reach the hub.
    made = subprocess.run([str(ROOT / ".venv/bin/python"), "-m", "sparkfleet", "fetch", "inventory/sim.py",
                           "--host", "spark-1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0 and "files verified in" in made.stdout, made.stderr
    state = fleet.up(hosts=len(HOSTS) + 1)
    fresh = f"spark-{len(HOSTS) + 1}"
    try:
        ssh(state, fresh, "for name in sparkfleet-hub sparkfleet-registry; do "
                          "iptables -I OUTPUT -d $(getent hosts $name | cut -d' ' -f1) -p tcp "
                          "-m multiport --dports 8080,5000 -j REJECT; done")
        hub_post(hub, "reset", {})
        hub_post(hub, "knobs", {"down": True})
        result = converge("--limit", fresh, *pin, "--data", "model_source=controller",
                          "--data", f"engine_image_archive={archive}")
        assert result.returncode == 0, result.output[-4000:]
        assert hub_get(hub, "counters")["total_bytes"] == 0
        reply = ssh(state, fresh, "curl -sf -H 'Authorization: Bearer sim-key' http://127.0.0.1:8000/v1/models")
        assert "Qwen3.5-35B-A3B" in reply
    finally:
        hub_post(hub, "reset", {})
        fleet.up(hosts=len(HOSTS))
