"""End-to-end checks of the simulated fleet itself (sim/), over real SSH.

Needs root, Docker and (the first time) the network to Debian's packages for
debootstrap; `sim up` does the rest. Checks that only read run on the fleet's
hosts (which other e2e tests may have converged); checks that change a host
(GPU knobs, installing the toolkit, editing daemon.json, a reboot) run on a
scratch host (same image, flags, network and key, outside the inventory) that
is removed at the end, so the deployed fleet is never disturbed.
"""
from __future__ import annotations

import json
import runpy
import subprocess
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
TOOLKIT = ["nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
           "libnvidia-container1"]
KEYRING = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
SOURCES = "/etc/apt/sources.list.d/nvidia-container-toolkit.list"
# apt-get update against the sim repository only: the tests talk to nothing else
APT_SIM_ONLY = f"-o Dir::Etc::sourcelist={SOURCES} -o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0"


@pytest.fixture(scope="module")
def _fleet(sim_fleet):
    return sim_fleet


@pytest.fixture(scope="module")
def _scratch(_fleet):
    from sim import fleet
    row = fleet.start_scratch_host("spark-scratch")
    yield row
    fleet.remove_host("spark-scratch")


def ssh(state: dict, host: str | dict, command: str, check: bool = True, timeout: float = 180):
    row = host if isinstance(host, dict) else next(h for h in state["hosts"] if h["name"] == host)
    host = row["name"]
    cp = subprocess.run(
        ["ssh", "-i", state["ssh_key"], "-p", str(row["ssh_port"]), "-o", "BatchMode=yes",
         "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
         "-o", "ConnectTimeout=10", f"{state['ssh_user']}@127.0.0.1", command],
        capture_output=True, text=True, timeout=timeout)
    if check and cp.returncode != 0:
        raise AssertionError(f"{host}: `{command}` exited {cp.returncode}\n{cp.stdout}\n{cp.stderr}")
    return cp


def test_state_file_shape(_fleet):
    state = json.loads((Path(_fleet["ssh_key"]).parent / "state.json").read_text())  # .sim/ or .sim/fleets/NAME/
    assert state == _fleet
    assert [h["name"] for h in state["hosts"]] == [f"spark-{i}" for i in range(1, len(state["hosts"]) + 1)]
    assert len(state["hosts"]) >= 2
    assert state["ssh_user"] == "root"
    assert Path(state["ssh_key"]).stat().st_mode & 0o777 == 0o600
    assert state["image"] == "sparkfleet-registry:5000/vllm/vllm-openai:v0.33.0"
    assert state["registry"]["host"] == "sparkfleet-registry:5000"
    assert state["hub"]["host_url"] == "http://sparkfleet-hub:8080"
    assert "{arch}" in state["apt"]["repo_url"]
    assert len(state["apt"]["key_fingerprint"]) == 40


def test_inventory_reads_state(_fleet):
    groups = runpy.run_path(str(REPO / "inventory" / "sim.py"))
    sparks = dict(groups["sparks"])
    assert sorted(sparks) == sorted(h["name"] for h in _fleet["hosts"])
    d = sparks["spark-1"]
    assert d["ssh_hostname"] == "127.0.0.1" and d["ssh_port"] == _fleet["hosts"][0]["ssh_port"]
    assert d["toolkit_key_fingerprint"] == _fleet["apt"]["key_fingerprint"]
    assert d["engine_image"] == _fleet["image"] and d["expected_arch"] == "x86_64"


def test_known_hosts_holds_every_hosts_real_key(_fleet):
    """inventory/sim.py checks host keys strictly against .sim/known_hosts (a named fleet's: beside its key):
    real keys, no warnings."""
    known_hosts = Path(_fleet["ssh_key"]).parent / "known_hosts"
    d = dict(runpy.run_path(str(REPO / "inventory" / "sim.py"))["sparks"])["spark-1"]
    assert d["ssh_strict_host_key_checking"] == "yes" and d["ssh_known_hosts_file"] == str(known_hosts)
    lines = known_hosts.read_text().splitlines()
    for h in _fleet["hosts"]:
        assert any(line.startswith(f"[127.0.0.1]:{h['ssh_port']} ssh-ed25519 ") for line in lines), h["name"]
        proc = subprocess.run(
            ["ssh", "-i", _fleet["ssh_key"], "-p", str(h["ssh_port"]), "-o", "StrictHostKeyChecking=yes",
             "-o", f"UserKnownHostsFile={known_hosts}", "-o", "BatchMode=yes", "root@127.0.0.1",
             "hostname"], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and proc.stdout.strip() == h["name"], proc.stderr


def test_systemd_sshd_and_docker_run_on_every_host(_fleet):
    for h in _fleet["hosts"]:
        assert ssh(_fleet, h["name"], "hostname").stdout.strip() == h["name"]
        assert ssh(_fleet, h["name"], "systemctl is-system-running", check=False).stdout.strip() in (
            "running", "degraded")
        # Docker's own choice on the host's volume: overlay2 where nested overlay mounts work (here), which starts
        # a container in about a second; vfs copies the whole image at every start (15-20 s for the engine's)
        assert ssh(_fleet, h["name"], "docker info --format '{{.Driver}}'").stdout.strip() == "overlay2"


def test_the_service_host_is_a_plain_debian_box_beside_the_sparks(_fleet):
    """door-1: listed apart from the Sparks, reached over SSH with its real key, no Docker and no GPU stand-ins,
    Debian's Prometheus off, nothing on the LAN but sshd, its port 8080 published on 127.0.0.1."""
    [door] = _fleet["service_hosts"]
    assert door["name"] == "door-1" and "api_port" not in door and door["name"] not in [h["name"] for h in
                                                                                        _fleet["hosts"]]
    known_hosts = Path(_fleet["ssh_key"]).parent / "known_hosts"
    assert any(line.startswith(f"[127.0.0.1]:{door['ssh_port']} ssh-ed25519 ")
               for line in known_hosts.read_text().splitlines())
    assert ssh(_fleet, door, "hostname").stdout.strip() == "door-1"
    assert ssh(_fleet, door, "command -v docker nvidia-smi", check=False).stdout.strip() == ""
    assert ssh(_fleet, door, "command -v haproxy socat prometheus curl ip python3").stdout.count("\n") == 6
    assert ssh(_fleet, door, "systemctl is-enabled prometheus.service", check=False).stdout.strip() == "disabled"
    listening = ssh(_fleet, door, "ss -Htln | awk '{print $4}'").stdout.split()
    assert {a.rsplit(":", 1)[1] for a in listening if not a.startswith(("127.", "[::1]"))} <= {"22", "8080"}
    published = subprocess.run(["docker", "port", door["container"], "8080/tcp"], capture_output=True, text=True,
                               check=True).stdout.split()
    assert published and all(p.startswith("127.0.0.1:") for p in published)


def test_a_fresh_host_has_no_toolkit_and_a_unique_identity(_fleet, _scratch):
    assert ssh(_fleet, _scratch, "command -v nvidia-ctk nvidia-container-runtime-hook", check=False).returncode != 0
    assert ssh(_fleet, _scratch, "systemctl --failed --no-legend").stdout.strip() == ""
    ids = {ssh(_fleet, h, "cat /etc/machine-id").stdout for h in (_scratch, _fleet["hosts"][0]["name"])}
    assert len(ids) == 2


def test_nvidia_smi_prints_what_a_gb10_prints(_fleet):
    out = ssh(_fleet, "spark-1", "nvidia-smi").stdout
    assert "NVIDIA-SMI 580.95.05" in out and "Driver Version: 580.95.05" in out and "CUDA Version: 13.0" in out
    assert "NVIDIA GB10" in out and "Not Supported" in out
    q = ssh(_fleet, "spark-1", "nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total "
                               "--format=csv").stdout.splitlines()
    assert q == ["name, driver_version, compute_cap, memory.total [MiB]", "NVIDIA GB10, 580.95.05, 12.1, [N/A]"]
    q = ssh(_fleet, "spark-1", "nvidia-smi --query-gpu=name,memory.used,memory.free "
                               "--format=csv,noheader,nounits").stdout
    assert q == "NVIDIA GB10, [N/A], [N/A]\n"


def test_gpu_fault_knobs(_fleet, _scratch):
    from sim import fleet
    try:
        fleet.set_gpu(_scratch["name"], driver="550.54.14", cuda="12.4")
        q = ssh(_fleet, _scratch, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").stdout
        assert q.strip() == "550.54.14"
        assert "CUDA Version: 12.4" in ssh(_fleet, _scratch, "nvidia-smi").stdout
        assert "580.95.05" in ssh(_fleet, "spark-1", "nvidia-smi").stdout  # other hosts untouched
        fleet.set_gpu(_scratch["name"], present=False)
        cp = ssh(_fleet, _scratch, "nvidia-smi", check=False)
        assert cp.returncode == 9
        assert "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver" in cp.stdout
    finally:
        fleet.set_gpu(_scratch["name"], **fleet.fleet.DEFAULT_GPU)


def test_toolkit_from_the_sim_apt_repo_and_gpu_containers(_fleet, _scratch):
    st = _fleet
    host = _scratch
    repo = st["apt"]["repo_url"].format(arch="amd64")
    ssh(st, host, "cp /etc/docker/daemon.json /root/daemon.json.orig")
    try:
        ssh(st, host, f"curl -fsSL {st['apt']['key_url']} | gpg --dearmor --yes -o {KEYRING} && "
                      f"echo 'deb [signed-by={KEYRING}] {repo} /' > {SOURCES}")
        fpr = ssh(st, host, f"gpg --show-keys --with-colons {KEYRING} | awk -F: '/^fpr/{{print $10; exit}}'")
        assert fpr.stdout.strip() == st["apt"]["key_fingerprint"]
        ssh(st, host, f"apt-get update {APT_SIM_ONLY} 2>&1")
        policy = ssh(st, host, "apt-cache policy nvidia-container-toolkit").stdout
        assert "1.18.1-1" in policy and "1.17.8-1" in policy
        pins = " ".join(f"{p}=1.18.1-1" for p in TOOLKIT)
        ssh(st, host, f"DEBIAN_FRONTEND=noninteractive apt-get install -y -q {pins}")
        assert ssh(st, host, "nvidia-ctk --version").stdout.splitlines()[0] == \
            "NVIDIA Container Toolkit CLI version 1.18.1"
        cp = ssh(st, host, "nvidia-ctk runtime configure --runtime=docker 2>&1")
        assert "Wrote updated config to /etc/docker/daemon.json" in cp.stdout
        cfg = json.loads(ssh(st, host, "cat /etc/docker/daemon.json").stdout)
        assert cfg["insecure-registries"] == ["sparkfleet-registry:5000"]  # the user's key survives
        assert cfg["log-driver"] == "json-file"
        assert cfg["runtimes"] == {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}
        assert "default-runtime" not in cfg
        ssh(st, host, "systemctl restart docker")
        assert "nvidia" in ssh(st, host, "docker info --format '{{json .Runtimes}}'").stdout
        out = ssh(st, host, f"docker run --rm --gpus all --runtime nvidia --entrypoint python3 {st['image']} "
                            "-c 'import os; print(sorted(os.listdir(\"/opt/standin\")))'", timeout=300).stdout
        assert "standin_vllm.py" in out and "vllm-flags.json" in out
    finally:
        ssh(st, host, f"DEBIAN_FRONTEND=noninteractive apt-get purge -y -q {' '.join(TOOLKIT)}; "
                      f"rm -f {SOURCES} {KEYRING}; cp /root/daemon.json.orig /etc/docker/daemon.json && "
                      "systemctl restart docker", check=False)


def test_hub_reachable_from_controller_and_hosts(_fleet):
    with urllib.request.urlopen(_fleet["hub"]["controller_url"] + "/_sim/counters", timeout=10) as r:
        assert r.status == 200
        json.load(r)
    out = ssh(_fleet, "spark-1", f"curl -fsS {_fleet['hub']['host_url']}/_sim/counters").stdout
    assert isinstance(json.loads(out), dict)
    with urllib.request.urlopen(f"http://{_fleet['registry']['controller']}/v2/_catalog", timeout=10) as r:
        assert "vllm/vllm-openai" in json.load(r)["repositories"]


def test_reboot_brings_sshd_and_docker_back(_fleet, _scratch):
    from sim import fleet
    before = ssh(_fleet, _scratch, "cat /proc/1/stat | cut -d' ' -f22").stdout.strip()
    seconds = fleet.reboot(_scratch["name"])
    assert seconds < 120
    assert ssh(_fleet, _scratch, "systemctl is-active ssh docker").stdout.split() == ["active", "active"]
    assert ssh(_fleet, _scratch, "docker info --format '{{.Driver}}'").stdout.strip() == "overlay2"
    after = ssh(_fleet, _scratch, "cat /proc/1/stat | cut -d' ' -f22").stdout.strip()
    assert after != before  # a new init: the host really booted again
    assert fleet.status()["up"]
