"""The sim's service host (door-1): a plain Debian box beside the Sparks, built and created as a variant of the
Spark's image and container (no Docker, no GPU stand-ins, no engine port, no fabric), and the front-door inventory
that puts the front door and monitoring on it. Hermetic: docker is a recorder."""

from __future__ import annotations

import runpy
import subprocess
from types import SimpleNamespace

import pytest

from sim.fleet import fleet, images, rootfs
from tests.unit.helpers import ROOT


def test_the_service_host_image_has_what_its_roles_need_and_nothing_of_a_spark():
    packages = set(rootfs.SERVICE_HOST_PACKAGES)
    assert {"systemd", "openssh-server", "python3", "haproxy", "socat", "prometheus", "curl", "iproute2"} <= packages
    assert not packages & {"docker.io", "containerd", "runc"}
    dockerfile = (images.IMAGES_DIR / "service-host" / "Dockerfile").read_text()
    assert "systemctl disable prometheus.service" in dockerfile
    assert not any(p.name == "nvidia-smi" for p in (images.IMAGES_DIR / "service-host").rglob("*"))


@pytest.fixture
def recorded(monkeypatch):
    calls = []
    monkeypatch.setattr(fleet, "docker", lambda *args, **kw: calls.append(args) or SimpleNamespace(returncode=0))
    monkeypatch.setattr(fleet, "_copy_fabric_file", lambda c: calls.append(("cp-fabric", c)))
    return calls


def test_a_service_host_container_has_no_docker_volume_engine_port_or_fabric(recorded):
    fleet._create_host("door-1", "h", 2222, None, role=fleet.SERVICE_ROLE)
    create = next(c for c in recorded if c[0] == "create")
    assert images.SERVICE_HOST_IMAGE in create and images.SPARK_IMAGE not in create
    assert "127.0.0.1:2222:22" in create and "127.0.0.1::8080" in create
    assert not any(":8000" in a or "/var/lib/docker" in a for a in create)
    assert f"{fleet.LABEL}.role=service" in create
    assert not any(c[0] == "network" or c[0] == "cp-fabric" for c in recorded)
    assert recorded[-1] == ("start", fleet.container_name("door-1"))
    assert ("volume", "create", "--label", f"{fleet.LABEL}=1", f"{fleet.container_name('door-1')}-docker") \
        not in recorded


def test_a_spark_container_is_as_before(recorded):
    fleet._create_host("spark-1", "h", 2222, 8000)
    create = next(c for c in recorded if c[0] == "create")
    assert images.SPARK_IMAGE in create and "127.0.0.1:8000:8000" in create
    assert any(a.endswith("-docker:/var/lib/docker") for a in create)
    assert any(c[:2] == ("network", "connect") for c in recorded)


def test_the_front_door_inventory_puts_door_1_in_front_of_the_sparks(tmp_path, monkeypatch):
    state = {"hosts": [{"name": f"spark-{n}", "ssh_port": 2200 + n, "api_port": 8000 + n,
                        "container": f"sparkfleet-spark-{n}", "fabric_address": None} for n in (1, 2)],
             "service_hosts": [{"name": "door-1", "ssh_port": 2299, "container": "sparkfleet-door-1"}],
             "ssh_user": "root", "ssh_key": "/k", "image": "img", "registry": {"controller": "127.0.0.1:5000"},
             "hub": {"host_url": "http://hub", "controller_url": "http://127.0.0.1:1", "repo": "r"},
             "apt": {"repo_url": "u", "key_url": "k", "key_fingerprint": "f" * 40}}
    fleet_dir = tmp_path / ".sim" / "fleets" / "t"
    fleet_dir.mkdir(parents=True)
    (fleet_dir / "state.json").write_text(__import__("json").dumps(state))
    (tmp_path / "inventory").mkdir()
    for name in ("sim.py", "sim_front_door.py"):
        (tmp_path / "inventory" / name).write_text((ROOT / "inventory" / name).read_text())
    monkeypatch.setenv("SPARKFLEET_SIM_FLEET", "t")
    real_run = subprocess.run
    asked = []

    def docker_port(cmd, **kw):
        if cmd[:2] == ["docker", "port"]:
            asked.append(cmd)
            return SimpleNamespace(stdout="127.0.0.1:40080\n")
        return real_run(cmd, **kw)

    monkeypatch.setattr(subprocess, "run", docker_port)
    groups = runpy.run_path(str(tmp_path / "inventory" / "sim_front_door.py"))
    assert asked == [["docker", "port", "sparkfleet-door-1", "8080/tcp"]]
    assert [n for n, _ in groups["sparks"]] == ["spark-1", "spark-2"]
    [(name, door)] = groups["front_door"]
    assert name == "door-1" and groups["monitoring"] == ["door-1"]
    assert (door["ssh_port"], door["lan_address"]) == (2299, "sparkfleet-door-1")
    assert door["controller_front_door_url"] == "http://127.0.0.1:40080"
    assert all("front_door_users" not in d for _, d in groups["sparks"])  # the users' keys live on the door only
