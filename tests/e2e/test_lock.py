"""The release lock on the simulated fleet: a commit published on the hub changes nothing until `sparkfleet update`
and a rollout move the fleet to it; a converged, locked fleet converges with the hub and registry stopped."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import HOSTS, INVENTORY, ROOT, converge, sparkfleet, ssh

pytestmark = pytest.mark.e2e
REPO = "Qwen/Qwen3.5-35B-A3B-FP8"


def lock() -> Path:
    return Path(os.environ["SPARKFLEET_LOCK"])  # tests/e2e/conftest.py: this fleet's


def sim(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "sim", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def records(state) -> dict[str, dict]:
    return {h: json.loads(ssh(state, h, "cat /etc/sparkfleet/release.json")) for h in HOSTS}


def test_a_published_commit_changes_nothing_until_update_and_the_rollout(sim_fleet, converged_fleet):
    assert lock().exists(), "the fleet's converges write its lock"
    original = lock().read_bytes()
    before = records(sim_fleet)
    old = before[HOSTS[0]]["manifest"]["commit"]
    new = sim("hub", "publish")
    try:
        assert new != old
        still = converge()
        assert still.returncode == 0 and not any(still.changed[h] for h in HOSTS), still.changed
        update = sparkfleet("update", INVENTORY)
        assert update.returncode == 0, update.stderr
        assert f"{old} -> {new}" in update.stdout and "README.md" in update.stdout
        assert all(f"{h} " in update.stdout for h in HOSTS)  # every host restarts on the rollout
        assert f"sparkfleet rollout {INVENTORY} --batch 1" in update.stdout
        rolled = sparkfleet("rollout", INVENTORY, "--batch", "1")
        assert rolled.returncode == 0, rolled.stderr[-4000:]
        moved = records(sim_fleet)
        assert {h: r["manifest"]["commit"] for h, r in moved.items()} == {h: new for h in HOSTS}
        assert all(moved[h]["release_id"] != before[h]["release_id"] for h in HOSTS)
    finally:  # the fleet is shared: back on inventory/sim.py's release, the hub's branch where it was
        lock().write_bytes(original)
        sim("hub", "unpublish")
        back = sparkfleet("rollout", INVENTORY, "--batch", "1")
    assert back.returncode == 0, back.stderr[-4000:]
    assert {h: r["release_id"] for h, r in records(sim_fleet).items()} == \
        {h: r["release_id"] for h, r in before.items()}


def test_a_locked_fleet_converges_with_the_hub_and_the_registry_stopped(sim_fleet, converged_fleet):
    assert lock().exists(), "the fleet's converges write its lock"
    seed = HOSTS[0]  # the peers' seed: the hub is its only source
    model_dir = records(sim_fleet)[seed]["model_dir"]
    shard = ssh(sim_fleet, seed, f"ls '{model_dir}' | grep safetensors$ | head -1")
    sim("stop-services")
    try:
        quiet = converge()
        assert quiet.returncode == 0, quiet.output[-4000:]
        assert not any(quiet.changed[h] for h in HOSTS), quiet.changed
        ssh(sim_fleet, seed, f"printf 'X' | dd of='{model_dir}/{shard}' bs=1 seek=4096 conv=notrunc status=none")
        hurt = converge()
        assert hurt.returncode != 0
        assert [h for h in HOSTS if hurt.host_failed(h)] == [seed], hurt.failed
        assert f"the hub (or a peer) is needed to repair {shard}" in hurt.output, hurt.output[-4000:]
        assert not any(hurt.changed[h] for h in HOSTS[1:]), hurt.changed
    finally:
        sim("start-services")
    repaired = converge()
    assert repaired.returncode == 0, repaired.output[-4000:]
