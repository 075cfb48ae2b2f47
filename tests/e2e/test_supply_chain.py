"""Supply chain on the simulated fleet: the plan pins the engine image by digest; a registry tag moved to other
bytes changes nothing until `sparkfleet update` (the release lock), then the release, never what a host runs; and
a host that cannot get the planned bytes refuses them.

The registry is the sim's real one; the tag is moved and restored by pushing from this machine
to its published port, so the fleet is left serving the image it started with.
"""

from __future__ import annotations

import hashlib
import json
import subprocess

import requests

from tests.e2e.conftest import INVENTORY, ROOT, api_port, converge, fleet_out_of_step, sparkfleet, ssh

HOST = "spark-3"
ACCEPT = ", ".join(("application/vnd.oci.image.index.v1+json", "application/vnd.oci.image.manifest.v1+json",
                    "application/vnd.docker.distribution.manifest.list.v2+json",
                    "application/vnd.docker.distribution.manifest.v2+json"))


def registry_url(state: dict, ref: str) -> str:
    name, _, tag = state["image"].split("/", 1)[1].rpartition(":")
    return f"http://{state['registry']['controller']}/v2/{name}/manifests/{ref or tag}"


def tag_digest(state: dict) -> str:
    return requests.head(registry_url(state, ""), headers={"Accept": ACCEPT}, timeout=10).headers[
        "Docker-Content-Digest"]


def planned(*extra: str) -> dict:
    done = sparkfleet("plan", "inventory/sim.py", "--json", *extra)
    assert done.returncode == 0, done.stderr
    return {h["name"]: h for h in json.loads(done.stdout)["hosts"]}


def docker(*args: str) -> str:
    return subprocess.run(["docker", *args], check=True, capture_output=True, text=True, timeout=600).stdout.strip()


def push_as_tag(state: dict, local: str) -> str:
    """Push a local image under the sim's engine tag (the registry's published port); returns the tag's digest."""
    pushed = f"{state['registry']['controller']}/{state['image'].split('/', 1)[1]}"
    docker("tag", local, pushed)
    try:
        docker("push", pushed)
    finally:
        docker("rmi", pushed)
    return tag_digest(state)


def container_image(state: dict) -> str:
    return ssh(state, HOST, "docker inspect --format '{{.Image}}' vllm")


def test_plan_pins_the_engine_image_by_the_registry_digest(sim_fleet):
    digest = tag_digest(sim_fleet)
    name = sim_fleet["image"].rsplit(":", 1)[0]
    for host in planned().values():
        assert host["image_pinned"] == f"{name}@{digest}" and host["image_unknown"] is None
        assert f"{name}@{digest}" in host["unit"] and sim_fleet["image"] not in host["unit"]


def test_moved_tag_changes_the_release_after_an_update_never_the_bytes_a_host_runs(converged_fleet):
    state = converged_fleet
    name = state["image"].rsplit(":", 1)[0]
    before = planned()[HOST]
    d1 = before["image_digest"]
    running = container_image(state)
    moved = f"sparkfleet-test/moved:{d1[7:19]}"
    scratch = docker("create", state["image"])
    docker("commit", "--change", "LABEL sparkfleet.test=moved-tag", scratch, moved)  # the same files, other bytes
    docker("rm", scratch)
    d2 = None
    try:
        d2 = push_as_tag(state, moved)
        assert d2 != d1
        assert planned()[HOST] == before  # the release lock holds the tag's digest until `sparkfleet update`
        update = sparkfleet("update", INVENTORY)
        assert update.returncode == 0, update.stderr
        after = planned()[HOST]
        assert after["image_digest"] == d2 and after["release_id"] != before["release_id"]

        # The host's own copy of the tag now holds the moved bytes too: the old unit would have run them.
        ssh(state, HOST, f"docker pull -q {state['image']} >/dev/null")
        pinned = ["--limit", HOST, "--data", f"engine_image={state['image']}@{d1}"]
        kept = converge(*pinned)
        assert kept.returncode == 0, kept.output[-3000:]
        assert kept.changed[HOST] == [] and container_image(state) == running

        # Planned bytes that neither the registry nor the host holds (the tag moved and the old manifest was
        # collected, on a host that never pulled it; docker keeps a verified copy of any manifest it pulled):
        # the host refuses, naming the image, and changes nothing.
        gone = "sha256:" + hashlib.sha256(b"collected").hexdigest()
        assert requests.head(registry_url(state, gone), headers={"Accept": ACCEPT}, timeout=10).status_code == 404
        unit = ssh(state, HOST, "cat /etc/systemd/system/sparkfleet-vllm.service")
        refused = subprocess.run([str(ROOT / ".venv/bin/pyinfra"), "-y", INVENTORY, "deploy.py", "--limit", HOST,
                                  "--data", f"engine_image={state['image']}@{gone}"],
                                 cwd=ROOT, capture_output=True, text=True, timeout=900)  # no host left: no JSON
        assert refused.returncode != 0
        assert f"engine image {state['image']}@{gone}: the registry did not serve {gone}" in refused.stderr
        assert ssh(state, HOST, "cat /etc/systemd/system/sparkfleet-vllm.service") == unit
        health = requests.get(f"http://127.0.0.1:{api_port(state, HOST)}/health", timeout=5).status_code
        assert container_image(state) == running and health == 200  # the old release keeps serving
    finally:
        restored = push_as_tag(state, state["image"])
        if d2 and d2 != restored:
            requests.delete(registry_url(state, d2), timeout=10)
        relocked = sparkfleet("update", INVENTORY)  # the lock back on the restored digest
        ssh(state, HOST, f"docker pull -q {name}@{restored} >/dev/null; docker pull -q {state['image']} >/dev/null",
            check=False)
        docker("rmi", moved)
    assert relocked.returncode == 0, relocked.stderr
    assert restored == d1 and planned()[HOST]["release_id"] == before["release_id"]
    assert fleet_out_of_step(state) == {}
