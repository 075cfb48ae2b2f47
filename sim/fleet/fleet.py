"""Bring the simulated fleet up and down: N systemd "Spark" containers and one
services container (hub, apt repository, registry) on the docker network
sparkfleet-sim; the Sparks also share sparkfleet-sim-fabric (MTU 9000, fixed
addresses), their ConnectX-7 link. All state lives in .sim/ (state.json, the SSH
key, caches). A named fleet (SPARKFLEET_SIM_FLEET=b) runs beside it: sparkfleet-b-*
containers and networks, its own fabric subnet, state in .sim/fleets/b/.
"""
from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import socket
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sim.hub.gguf_model import GGUF_FILES, GGUF_REPO_ID

from . import apt_repo, driver, images
from ._util import (CONFIG_LABEL, FLEET, FLEET_DIR, IMAGES_DIR, LABEL, LOCK_FILE, PREFIX, REPO_ROOT, SIM_DIR,
                    STATE_FILE, SimError, docker, free_port, log, port_is_free, read_json, run, sha256_bytes,
                    wait_for, write_json)

NETWORK = f"{PREFIX}-sim"
FABRIC_NETWORK = f"{PREFIX}-sim-fabric"
FABRIC_FILE = "/etc/sparkfleet-sim/fabric.json"
# interface name, MTU and subnet of the fabric: the spark image's boot unit reads the same file
FABRIC = read_json(IMAGES_DIR / "spark" / "rootfs" / FABRIC_FILE.lstrip("/"))


def fabric_subnet(fleet: str) -> str:
    """The fleet's fabric subnet: the image's for the default fleet; for a named one a /24 of 10.200.0.0/16
    picked by its name (not the default's), written into each of its hosts before the first boot."""
    if not fleet:
        return FABRIC["subnet"]
    default = ipaddress.ip_network(FABRIC["subnet"]).network_address.packed[2]
    third = 1 + int(sha256_bytes("fabric", fleet)[:8], 16) % 253
    return f"10.200.{third + (third >= default)}.0/24"


FABRIC = {**FABRIC, "subnet": fabric_subnet(FLEET)}
FABRIC_SUBNET = ipaddress.ip_network(FABRIC["subnet"])
FABRIC_DYNAMIC = list(FABRIC_SUBNET.subnets(1))[1]  # scratch hosts' addresses; fleet hosts' are fixed below it
FABRIC_SCRIPT = "/usr/local/sbin/sparkfleet-sim-fabric"
SERVICES = f"{PREFIX}-services"
HUB_ALIAS, APT_ALIAS, REGISTRY_ALIAS = "sparkfleet-hub", "sparkfleet-apt", "sparkfleet-registry"
HUB_PORT, APT_PORT, REGISTRY_PORT = 8080, 8081, 5000
APT_URL = f"http://{APT_ALIAS}:{APT_PORT}"  # the services container's apt repositories, as a host reaches them
HUB_REPO = "Qwen/Qwen3.5-35B-A3B-FP8"
SSH_KEY = FLEET_DIR / "id_ed25519"
KNOWN_HOSTS = FLEET_DIR / "known_hosts"  # the hosts' real SSH host keys: inventory/sim.py checks them strictly
BOOTSTRAP = REPO_ROOT / "sim" / "bootstrap.sh"
DEFAULT_GPU = {"present": True, "name": "NVIDIA GB10", "driver": "580.95.05", "cuda": "13.0",
               "compute_cap": "12.1"}
GPU_FILE = "/etc/sparkfleet-sim/gpu.json"
GPU_THROTTLES = ("none", "idle", "power", "thermal", "hw")  # the stand-in nvidia-smi's throttle knob
ENGINE_KNOB_FILE = "/etc/sparkfleet-sim/engine.json"  # the stand-in engine's fault knobs (sim/engine)
ENGINE_KNOBS = {"fault": (str, type(None)), "crash_on_start": (bool,), "load_delay_s": (int, float, str),
                "spec_acceptance_rate": (int, float, str),  # speculative decoding: share of drafts accepted
                "ray_wait_s": (int, float, str),  # Ray backend: seconds to wait for the GPU nodes before exit 1
                "answer_fault": (str, type(None))}  # wrong | tool_text | cut | tool_args | none (docs/quality.md)
STOP_TIMEOUT = "30"
# What this machine allows for a systemd container (no --privileged: the VM lacks CAP_SYS_RESOURCE).
SYSTEMD_FLAGS = ["--cap-add=ALL", "--cap-drop=SYS_RESOURCE", "--security-opt", "seccomp=unconfined",
                 "--security-opt", "apparmor=unconfined", "--cgroupns=host",
                 "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "--tmpfs", "/run", "--tmpfs", "/run/lock"]
BOOT_TIMEOUT = float(os.environ.get("SPARKFLEET_SIM_BOOT_TIMEOUT", "120"))


def container_name(host: str) -> str:
    return f"{PREFIX}-{host}"


# --------------------------------------------------------------------------- docker plumbing

def bootstrap() -> None:
    """Install missing Debian packages and start dockerd when it is not answering."""
    if docker("info", "--format", "{{.ServerVersion}}", check=False, timeout=30).returncode == 0 \
            and all(_which(t) for t in ("debootstrap", "gpg", "dpkg-scanpackages", "ssh-keygen")):
        return
    log("running sim/bootstrap.sh")
    run(["bash", str(BOOTSTRAP)], capture=False)


def _which(tool: str) -> bool:
    from shutil import which
    return which(tool) is not None


def _inspect(name: str) -> dict | None:
    cp = docker("container", "inspect", name, check=False)
    if cp.returncode != 0:
        return None
    return json.loads(cp.stdout)[0]


def _ensure_network() -> None:
    if docker("network", "inspect", NETWORK, check=False).returncode != 0:
        docker("network", "create", "--label", f"{LABEL}=1", NETWORK)


def _lan() -> dict:
    """The sim's LAN (the Docker network the hosts, the doors and this machine share) and its floating address:
    the subnet's last usable address, which Docker's allocator (lowest free first) never hands a container of a
    fleet this size. This machine reaches it over the network's bridge, as an office's laptop reaches a door."""
    cp = docker("network", "inspect", NETWORK, "-f", "{{json .IPAM.Config}}")
    subnet = ipaddress.ip_network(next(c["Subnet"] for c in json.loads(cp.stdout) if ":" not in c["Subnet"]))
    return {"network": NETWORK, "subnet": str(subnet),
            "floating_address": f"{subnet.broadcast_address - 1}/{subnet.prefixlen}"}


def fabric_address(name: str) -> str | None:
    """A fleet host's fixed fabric address (spark-N: the subnet's 10+N-th); None for other hosts."""
    prefix, _, n = name.rpartition("-")
    if prefix != "spark" or not n.isdigit() or not 1 <= int(n) <= 100:
        return None
    return str(FABRIC_SUBNET.network_address + 10 + int(n))


def _fabric_options() -> list[str]:
    return ["--label", f"{LABEL}=1", "--subnet", str(FABRIC_SUBNET), "--ip-range", str(FABRIC_DYNAMIC),
            "--opt", f"com.docker.network.driver.mtu={FABRIC['mtu']}"]


def _fabric_is_current(info: dict) -> bool:
    ipam = (info.get("IPAM") or {}).get("Config") or [{}]
    return (ipam[0].get("Subnet"), ipam[0].get("IPRange"), (info.get("Options") or {}).get(
        "com.docker.network.driver.mtu"), (info.get("Labels") or {}).get(LABEL)) == \
        (str(FABRIC_SUBNET), str(FABRIC_DYNAMIC), str(FABRIC["mtu"]), "1")


def _ensure_fabric() -> None:
    """The fabric network as configured; a stale one (other subnet or MTU) is removed with its containers."""
    cp = docker("network", "inspect", FABRIC_NETWORK, check=False)
    if cp.returncode == 0:
        info = json.loads(cp.stdout)[0]
        if _fabric_is_current(info):
            return
        attached = sorted(c["Name"] for c in (info.get("Containers") or {}).values())
        log(f"{FABRIC_NETWORK} is stale: removing it{' and ' + ', '.join(attached) if attached else ''} "
            "(volumes kept)")
        if attached:
            docker("rm", "-f", *attached, timeout=180)
        docker("network", "rm", FABRIC_NETWORK)
    cp = docker("network", "create", *_fabric_options(), FABRIC_NETWORK, check=False)
    if cp.returncode != 0:
        raise SimError(f"cannot create {FABRIC_NETWORK} on {FABRIC_SUBNET}: {cp.stderr.strip()} (another docker "
                       "network holds the subnet: give this fleet another name)")


def _fabric_endpoint(info: dict) -> str | None:
    """The container's address on the fabric network, None when it is not attached."""
    net = (info.get("NetworkSettings", {}).get("Networks") or {}).get(FABRIC_NETWORK)
    return (net or {}).get("IPAddress") or ((net or {}).get("IPAMConfig") or {}).get("IPv4Address") or None


def _ensure_volume(name: str) -> None:
    if docker("volume", "inspect", name, check=False).returncode != 0:
        docker("volume", "create", "--label", f"{LABEL}=1", name)


def _exec(container: str, *cmd: str, input: str | None = None, check: bool = True, timeout: float = 60):
    args = ["exec", "-i", container, *cmd] if input is not None else ["exec", container, *cmd]
    return docker(*args, input=input, check=check, timeout=timeout)


def _put_file(container: str, path: str, content: str, mode: str = "0644") -> bool:
    """Write a file in a container when its content differs; True when changed."""
    cur = _exec(container, "cat", path, check=False)
    if cur.returncode == 0 and cur.stdout == content:
        return False
    d = os.path.dirname(path)
    _exec(container, "sh", "-c", f"mkdir -p '{d}' && cat > '{path}.tmp' && chmod {mode} '{path}.tmp' "
          f"&& mv '{path}.tmp' '{path}'", input=content)
    return True


def _pick_port(previous: int | None, taken: set[int]) -> int:
    if previous and previous not in taken and port_is_free(previous):
        return previous
    while True:
        p = free_port()
        if p not in taken:
            return p


def _published(info: dict, port: int) -> int | None:
    bindings = (info.get("HostConfig", {}).get("PortBindings") or {}).get(f"{port}/tcp") or []
    for b in bindings:
        if b.get("HostPort"):
            return int(b["HostPort"])
    return None


def _http_ok(url: str, timeout: float = 3) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return 200 <= r.status < 500
    except urllib.error.HTTPError as e:
        return e.code < 500
    except OSError:
        return False


def _ssh_banner(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
            s.settimeout(3)
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False


# --------------------------------------------------------------------------- SSH key

def ensure_ssh_key() -> Path:
    FLEET_DIR.mkdir(parents=True, exist_ok=True)
    if not SSH_KEY.exists() or not SSH_KEY.with_suffix(".pub").exists():
        for p in (SSH_KEY, SSH_KEY.with_suffix(".pub")):
            p.unlink(missing_ok=True)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sparkfleet-sim", "-f", str(SSH_KEY)])
    os.chmod(SSH_KEY, 0o600)
    return SSH_KEY


def _host_key_lines(row: dict) -> list[str]:
    """known_hosts lines ("[127.0.0.1]:PORT TYPE KEY") of a host's SSH host keys, read inside its container."""
    keys = _exec(row["container"], "sh", "-c", "cat /etc/ssh/ssh_host_*_key.pub").stdout
    return [f"[127.0.0.1]:{row['ssh_port']} {' '.join(line.split()[:2])}" for line in keys.splitlines()
            if line.strip()]


def write_known_hosts() -> Path:
    """.sim/known_hosts for every running sim host (the fleet's and scratch ones), rewritten whole."""
    state = load_state()
    rows = [*state["hosts"], *state.get("service_hosts", [])]
    names = {row["container"] for row in rows}
    for c in docker("ps", "--filter", f"label={LABEL}.role=scratch", "--format", "{{.Names}}",
                    check=False).stdout.split():
        info = _inspect(c)
        if c not in names and info:
            rows.append({"container": c, "ssh_port": _published(info, 22)})
    lines = [line for row in rows if (_inspect(row["container"]) or {}).get("State", {}).get("Running")
             for line in _host_key_lines(row)]
    partial = KNOWN_HOSTS.with_suffix(".partial")
    partial.write_text("".join(f"{line}\n" for line in lines))
    os.replace(partial, KNOWN_HOSTS)
    return KNOWN_HOSTS


# --------------------------------------------------------------------------- services

def _ensure_services(prev: dict, image_hash: str, apt: dict) -> dict:
    info = _inspect(SERVICES)
    taken: set[int] = set()
    ports = {}
    for key, inner in (("hub", HUB_PORT), ("registry", REGISTRY_PORT), ("apt", APT_PORT)):
        ports[key] = (_published(info, inner) if info else None) or _pick_port(prev.get(key), taken)
        taken.add(ports[key])
    cfg = sha256_bytes("services-v1", image_hash, apt["dir"], json.dumps(ports, sort_keys=True))
    if info and info["Config"]["Labels"].get(CONFIG_LABEL) != cfg:
        log("services container is stale: recreating")
        docker("rm", "-f", SERVICES)
        info = None
    if info is None:
        log(f"starting {SERVICES}")
        docker("run", "-d", "--name", SERVICES, "--hostname", SERVICES, "--network", NETWORK,
               "--network-alias", HUB_ALIAS, "--network-alias", APT_ALIAS, "--network-alias", REGISTRY_ALIAS,
               "--label", f"{LABEL}=1", "--label", f"{LABEL}.role=services", "--label", f"{CONFIG_LABEL}={cfg}",
               "--restart", "unless-stopped",
               "-e", f"SPARKFLEET_HUB_REPO={HUB_REPO}",
               "-v", f"{apt['dir']}:/srv/apt:ro",
               "-p", f"127.0.0.1:{ports['hub']}:{HUB_PORT}",
               "-p", f"127.0.0.1:{ports['registry']}:{REGISTRY_PORT}",
               "-p", f"127.0.0.1:{ports['apt']}:{APT_PORT}",
               images.SERVICES_IMAGE)
    elif not info["State"]["Running"]:
        log(f"starting stopped {SERVICES}")
        docker("start", SERVICES)
    _wait_services(ports)
    return ports


def _wait_services(ports: dict) -> None:
    wait_for(lambda: _http_ok(f"http://127.0.0.1:{ports['registry']}/v2/"), 60, what="the sim registry")
    wait_for(lambda: _http_ok(f"http://127.0.0.1:{ports['apt']}/gpgkey"), 60, what="the sim apt repository")
    if images.HUB_DIR.joinpath("server.py").exists():
        wait_for(lambda: _http_ok(f"http://127.0.0.1:{ports['hub']}/_sim/counters"), 120, what="the sim hub")


def _push_engines(registry_port: int) -> None:
    """Put the engine images (stand-in vLLM and SGLang, real llama.cpp) into the sim registry."""
    for repo, tag, name in images.REGISTRY_IMAGES:
        _push_image(registry_port, repo, tag, name)


def _push_image(registry_port: int, repo: str, tag: str, name: str) -> None:
    """Push one image as REPO:TAG (skipped when the registry already holds it)."""
    image_id = docker("image", "inspect", name, "--format", "{{.Id}}").stdout.strip()
    url = f"http://127.0.0.1:{registry_port}/v2/{repo}/manifests/{tag}"
    req = urllib.request.Request(url, headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            if json.load(r).get("config", {}).get("digest") == image_id:
                return
    except (OSError, ValueError):
        pass
    t0 = time.monotonic()
    local = f"127.0.0.1:{registry_port}/{repo}:{tag}"
    docker("tag", name, local)
    try:
        docker("push", local, timeout=600)
    finally:
        docker("rmi", local, check=False)
    LOCK_FILE.unlink(missing_ok=True)  # it pinned the image this push replaced
    log(f"pushed {repo}:{tag} in {time.monotonic() - t0:.1f}s")


# --------------------------------------------------------------------------- hosts

CHAT_UI_BUILD_LOG = SIM_DIR / "chat-ui-build.log"


def build_chat_ui() -> None:
    """Open WebUI's sim images, built when missing (minutes, ~3 GB), under their own lock rather than the shared
    images' (`_build_lock`), so that a build in the background never holds up `up`."""
    SIM_DIR.mkdir(parents=True, exist_ok=True)
    with open(SIM_DIR / "chat-ui-build.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        images.ensure_chat_ui_next(images.ensure_chat_ui())


def build_chat_ui_in_background() -> str:
    """Start `build_chat_ui` in a process of its own (`make demo` overlaps it with the fleet's start and converge);
    `chat_ui_image` later waits for it on the lock. Its log: CHAT_UI_BUILD_LOG."""
    import subprocess
    import sys

    SIM_DIR.mkdir(parents=True, exist_ok=True)
    with open(CHAT_UI_BUILD_LOG, "wb") as out:
        subprocess.Popen([sys.executable, "-m", "sim", "chat-ui", "--build-only"], cwd=REPO_ROOT, stdout=out,
                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    return str(CHAT_UI_BUILD_LOG)


def chat_ui_image() -> str:
    """Open WebUI's sim image (built from its PyPI release when missing: minutes, ~3 GB) pushed into the registry;
    the reference a host pulls, pinned by its digest. Only what uses a chat UI asks: `up` never builds it."""
    state = load_state()
    build_chat_ui()
    port = int(state["registry"]["controller"].rsplit(":", 1)[1])
    _push_image(port, images.CHAT_UI_REPO, images.CHAT_UI_TAG, images.CHAT_UI_IMAGE)
    _push_image(port, images.CHAT_UI_REPO, images.CHAT_UI_NEXT_TAG, images.CHAT_UI_NEXT_IMAGE)
    url = f"http://127.0.0.1:{port}/v2/{images.CHAT_UI_REPO}/manifests/{images.CHAT_UI_TAG}"
    req = urllib.request.Request(url, method="HEAD",
                                 headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        digest = r.headers["Docker-Content-Digest"]
    return f"{images.CHAT_UI_IMAGE}@{digest}"


def sign_in_url(port: int = 3000) -> str:
    """Where a browser on this machine reaches the chat UI (over the Docker bridge): the doors' floating address
    where two doors share it (inventory/sim_chat_ui.py), else door-1's own address."""
    state = load_state()
    if len(state.get("service_hosts") or []) > 1 and "lan" in state:
        return f"http://{state['lan']['floating_address'].split('/')[0]}:{port}/"
    info = _inspect(state["service_hosts"][0]["container"]) if state.get("service_hosts") else None
    if not info:
        raise SimError("the simulated fleet has no door: `python -m sim up --service-hosts 2`")
    address = next(iter(info["NetworkSettings"]["Networks"].values()))["IPAddress"]
    return f"http://{address}:{port}/"


def _host_config_hash(name: str, image_hash: str, ssh_port: int, api_port: int) -> str:
    return sha256_bytes("host-v2", name, image_hash, str(ssh_port), str(api_port), json.dumps(SYSTEMD_FLAGS),
                        str(fabric_address(name)), json.dumps(FABRIC, sort_keys=True))


SERVICE_ROLE = "service"  # a service host's role label: a front door / monitoring box, not a Spark


def _create_host(name: str, image_hash: str, ssh_port: int, api_port: int | None, role: str = "host") -> None:
    """Create the host on both networks before its first boot (the boot unit names the fabric link), then start it.
    A service host (role SERVICE_ROLE) is the same container of its own image: no Docker volume, no engine port,
    no fabric."""
    c = container_name(name)
    service = role == SERVICE_ROLE
    volumes = [f"{c}-data"] if service else [f"{c}-docker", f"{c}-data"]
    for vol in volumes:
        _ensure_volume(vol)
    docker("create", "--name", c, "--hostname", name, "--network", NETWORK,
           "--label", f"{LABEL}=1", "--label", f"{LABEL}.role={role}", "--label", f"{LABEL}.host={name}",
           "--label", f"{CONFIG_LABEL}={_host_config_hash(name, image_hash, ssh_port, api_port)}",
           *SYSTEMD_FLAGS, "--restart", "unless-stopped", "--stop-timeout", STOP_TIMEOUT,
           *([] if service else ["-v", f"{c}-docker:/var/lib/docker"]), "-v", f"{c}-data:/var/lib/sparkfleet",
           "-p", f"127.0.0.1:{ssh_port}:22", *([] if service else ["-p", f"127.0.0.1:{api_port}:8000"]),
           "-p", "127.0.0.1::8080",  # a front door (group_data's front_door_port); `docker port` tells where
           images.SERVICE_HOST_IMAGE if service else images.SPARK_IMAGE, "/sbin/init")
    if not service:
        if FLEET:
            _copy_fabric_file(c)
        fixed = fabric_address(name) if role == "host" else None
        docker("network", "connect", *(["--ip", fixed] if fixed else []), FABRIC_NETWORK, c)
    _start_new(c)


def _start_new(container: str, tries: int = 5) -> None:
    """`docker start` of a container just made. Its front door port is one Docker picks at the start, from the
    same range the other fleets' fixed ports were drawn from: where Docker picks one another start (or a probe
    of a free port) holds at that moment ("port is already allocated"), start again, and it picks another."""
    for attempt in range(tries):
        done = docker("start", container, check=attempt == tries - 1)
        if done.returncode == 0:
            return
        if "port is already allocated" not in done.stderr:
            docker("start", container)  # raises, naming what Docker said
        log(f"{container}: {done.stderr.strip()[-200:]}: starting again")
        time.sleep(1 + attempt)


def _copy_fabric_file(container: str) -> None:
    """A named fleet's fabric settings (its own subnet) in the created host, for the boot unit to find."""
    with tempfile.TemporaryDirectory(dir=FLEET_DIR) as d:
        path = Path(d) / "fabric.json"
        path.write_text(json.dumps(FABRIC) + "\n")
        docker("cp", str(path), f"{container}:{FABRIC_FILE}")


def _system_state(c: str) -> str:
    cp = _exec(c, "systemctl", "is-system-running", check=False, timeout=20)
    return cp.stdout.strip() or cp.stderr.strip()


def wait_host_ready(name: str, ssh_port: int, timeout: float = BOOT_TIMEOUT, spark: bool = True) -> None:
    """systemd finished booting, docker.service active (on a Spark), sshd answering on 127.0.0.1."""
    c = container_name(name)
    wait_for(lambda: _system_state(c) in ("running", "degraded"), timeout, what=f"{name} to boot")
    if spark:
        wait_for(lambda: _exec(c, "systemctl", "is-active", "docker", check=False).returncode == 0, 60,
                 what=f"docker.service on {name}")
    wait_for(lambda: _ssh_banner(ssh_port), 30, what=f"sshd on {name} (127.0.0.1:{ssh_port})")


def _ensure_host(name: str, prev: dict, image_hash: str, taken: set[int], role: str = "host") -> dict:
    c = container_name(name)
    info = _inspect(c)
    ssh_port = (_published(info, 22) if info else None) or _pick_port(prev.get("ssh_port"), taken)
    taken.add(ssh_port)
    api_port = None
    if role != SERVICE_ROLE:  # a service host serves no engine API
        api_port = (_published(info, 8000) if info else None) or _pick_port(prev.get("api_port"), taken)
        taken.add(api_port)
    want = _host_config_hash(name, image_hash, ssh_port, api_port)
    if info and info["Config"]["Labels"].get(CONFIG_LABEL) != want:
        log(f"{name}: image or config changed: recreating the container (volumes kept)")
        docker("rm", "-f", c)
        info = None
    if info and _fabric_endpoint(info) != fabric_address(name):
        log(f"{name}: not on {FABRIC_NETWORK} at {fabric_address(name)}: recreating the container (volumes kept)")
        docker("rm", "-f", c)
        info = None
    if info is None:
        log(f"{name}: creating (ssh 127.0.0.1:{ssh_port}" + (f", api 127.0.0.1:{api_port})" if api_port else ")"))
        _create_host(name, image_hash, ssh_port, api_port, role)
    elif not info["State"]["Running"]:
        log(f"{name}: container was stopped: starting it")
        if docker("start", c, check=False).returncode != 0:
            log(f"{name}: start failed: recreating")
            docker("rm", "-f", c)
            _create_host(name, image_hash, ssh_port, api_port, role)
    if role == SERVICE_ROLE:
        return {"name": name, "ssh_port": ssh_port, "container": c}
    return {"name": name, "ssh_port": ssh_port, "api_port": api_port, "container": c,
            "fabric_address": fabric_address(name)}


def _finish_host(h: dict, pubkey: str, gpu: dict) -> None:
    name, c = h["name"], h["container"]
    try:
        wait_host_ready(name, h["ssh_port"])
    except SimError as e:
        log(f"{name}: not ready ({e}); recreating it once")
        info = _inspect(c)
        role = (info["Config"]["Labels"].get(f"{LABEL}.role") if info else None) or "host"
        docker("rm", "-f", c)
        _create_host(name, images.image_hash(images.SPARK_IMAGE) or "", h["ssh_port"], h["api_port"], role)
        wait_host_ready(name, h["ssh_port"])
    _put_file(c, "/root/.ssh/authorized_keys", pubkey, "0600")
    _install_reboot_unit(c)
    _exec(c, "sh", "-c", driver.host_script(APT_URL), timeout=300)  # before the knobs: a fault's driver wins
    _put_file(c, GPU_FILE, json.dumps(gpu, sort_keys=True) + "\n")
    _exec(c, FABRIC_SCRIPT)  # the boot unit did it; again here: up() also repairs a fabric knob left set


def _finish_service_host(h: dict, pubkey: str) -> None:
    """A service host booted and reachable over SSH with the fleet's key (no driver, GPU or fabric to set)."""
    wait_host_ready(h["name"], h["ssh_port"], spark=False)
    _put_file(h["container"], "/root/.ssh/authorized_keys", pubkey, "0600")
    _install_reboot_unit(h["container"])


def _install_reboot_unit(c: str) -> None:
    """The unit that makes an in-host reboot read as one (sim/fleet/driver.py), started now and at every boot."""
    changed = [_put_file(c, path, content, mode) for path, (content, mode) in driver.reboot_files().items()]
    if any(changed):
        _exec(c, "systemctl", "daemon-reload")
    _exec(c, "systemctl", "enable", "--now", driver.REBOOT_UNIT)


# --------------------------------------------------------------------------- public API

def service_host_names(count: int) -> list[str]:
    return [f"door-{i}" for i in range(1, count + 1)]


def up(hosts: int = 3, faults: dict[str, dict] | None = None, service_hosts: int = 1) -> dict:
    """Bring the fleet to `hosts` simulated Sparks and `service_hosts` service hosts (door-N: a front door /
    monitoring box, no GPU) plus services; idempotent."""
    if hosts < 1:
        raise SimError("hosts must be >= 1")
    faults = faults or {}
    unknown = set(faults) - {f"spark-{i}" for i in range(1, hosts + 1)}
    if unknown:
        raise SimError(f"faults for unknown hosts: {sorted(unknown)}")
    t0 = time.monotonic()
    bootstrap()
    with _build_lock():
        hashes = images.ensure_all()
        apt = apt_repo.ensure_repo()
    key = ensure_ssh_key()
    pubkey = key.with_suffix(".pub").read_text()
    prev = read_json(STATE_FILE, {}) or {}
    _ensure_network()
    _ensure_fabric()
    ports = _ensure_services(prev.get("services", {}), hashes["services"], apt)
    _push_engines(ports["registry"])

    names = [f"spark-{i}" for i in range(1, hosts + 1)]
    for extra in _host_containers():
        if extra not in [container_name(n) for n in names]:
            log(f"removing {extra} (fleet size is {hosts})")
            _remove_containers([extra], volumes=True)
    prev_hosts = {h["name"]: h for h in prev.get("hosts", [])}
    taken = {ports["hub"], ports["registry"], ports["apt"]}
    doors = service_host_names(service_hosts)
    for extra in _host_containers(SERVICE_ROLE):
        if extra not in [container_name(n) for n in doors]:
            log(f"removing {extra} ({service_hosts} service hosts)")
            _remove_containers([extra], volumes=True)
    host_rows = [_ensure_host(n, prev_hosts.get(n, {}), hashes["spark"], taken) for n in names]
    prev_doors = {h["name"]: h for h in prev.get("service_hosts", [])}
    door_rows = [_ensure_host(n, prev_doors.get(n, {}), hashes["service-host"], taken, SERVICE_ROLE) for n in doors]
    with ThreadPoolExecutor(max(1, len(host_rows) + len(door_rows))) as ex:
        futs = [ex.submit(_finish_host, h, pubkey, {**DEFAULT_GPU, **faults.get(h["name"], {})})
                for h in host_rows] + [ex.submit(_finish_service_host, h, pubkey) for h in door_rows]
        for f in futs:
            f.result()

    state = {**_make_state(host_rows, ports, apt, key), "service_hosts": door_rows, "lan": _lan()}
    if state != prev:
        write_json(STATE_FILE, state)
    write_known_hosts()
    log(f"fleet up: {hosts} host(s) in {time.monotonic() - t0:.1f}s")
    return state


def _make_state(host_rows: list[dict], ports: dict, apt: dict, key: Path) -> dict:
    return {
        "hosts": host_rows,
        "ssh_key": str(key),
        "ssh_user": "root",
        "hub": {"controller_url": f"http://127.0.0.1:{ports['hub']}",
                "host_url": f"http://{HUB_ALIAS}:{HUB_PORT}", "repo": HUB_REPO, "gguf_repo": GGUF_REPO_ID,
                "gguf_files": GGUF_FILES},
        "apt": {"repo_url": f"http://{APT_ALIAS}:{APT_PORT}/stable/deb/{{arch}}",
                "key_url": f"http://{APT_ALIAS}:{APT_PORT}/gpgkey",
                "key_fingerprint": apt["fingerprint"],
                "controller_url": f"http://127.0.0.1:{ports['apt']}"},
        "registry": {"host": f"{REGISTRY_ALIAS}:{REGISTRY_PORT}", "controller": f"127.0.0.1:{ports['registry']}"},
        "image": images.ENGINE_IMAGE,
        "engine_images": {"vllm": images.ENGINE_IMAGE, "sglang": images.SGLANG_IMAGE,
                          "llamacpp": images.LLAMACPP_IMAGE},
        "services": {"container": SERVICES, "network": NETWORK, **ports},
        "fabric": {"network": FABRIC_NETWORK, "subnet": str(FABRIC_SUBNET), "interface": FABRIC["interface"],
                   "mtu": FABRIC["mtu"]},
    }


@contextlib.contextmanager
def _build_lock():
    """One fleet at a time builds the shared images and apt repository (two fleets coming up at once)."""
    SIM_DIR.mkdir(parents=True, exist_ok=True)
    with open(SIM_DIR / "build.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _host_containers(role: str = "host") -> list[str]:
    cp = docker("ps", "-a", "--filter", f"label={LABEL}.role={role}", "--format", "{{.Names}}", check=False)
    return sorted(n for n in cp.stdout.split() if n)


def _remove_containers(names: list[str], volumes: bool) -> None:
    if not names:
        return
    docker("rm", "-f", "-v", *names, check=False, timeout=120)
    if volumes:
        for c in names:
            for vol in (f"{c}-docker", f"{c}-data"):
                docker("volume", "rm", "-f", vol, check=False)  # a service host has no -docker: nothing to do


def down() -> None:
    """Remove the fleet's containers, volumes and network (image caches and other fleets stay)."""
    t0 = time.monotonic()
    bootstrap()
    cp = docker("ps", "-aq", "--filter", f"label={LABEL}", check=False)
    ids = cp.stdout.split()
    if ids:
        docker("rm", "-f", "-v", *ids, check=False, timeout=180)
    vols = docker("volume", "ls", "-q", "--filter", f"label={LABEL}", check=False).stdout.split()
    if vols:
        docker("volume", "rm", "-f", *vols, check=False)
    for net in (NETWORK, FABRIC_NETWORK):
        if docker("network", "inspect", net, check=False).returncode == 0:
            docker("network", "rm", net, check=False)
    STATE_FILE.unlink(missing_ok=True)
    LOCK_FILE.unlink(missing_ok=True)  # its hub and registry are gone with it
    log(f"fleet down in {time.monotonic() - t0:.1f}s")


def load_state() -> dict:
    state = read_json(STATE_FILE)
    if not state:
        raise SimError("the simulated fleet is not up: run `python -m sim up` first")
    return state


def _host_row(host: str) -> dict:
    """A fleet host from state.json, or a scratch host found by its container."""
    state = load_state()
    for h in [*state["hosts"], *state.get("service_hosts", [])]:
        if h["name"] == host or h["container"] == host:
            return h
    info = _inspect(container_name(host))
    if info and info["Config"]["Labels"].get(f"{LABEL}.role") in ("host", "scratch"):
        return {"name": host, "ssh_port": _published(info, 22), "api_port": _published(info, 8000),
                "container": container_name(host), "fabric_address": _fabric_endpoint(info)}
    raise SimError(f"no simulated host named {host!r}")


def start_scratch_host(name: str = "spark-scratch") -> dict:
    """A fresh simulated Spark outside state.json (and outside the inventory), for
    checks that change a host without disturbing the deployed fleet. Same image,
    flags, network and SSH key as the fleet's hosts; `remove_host` (or `down`)
    removes it. Returns its row: name, ssh_port, api_port, container."""
    load_state()
    if name in [h["name"] for h in load_state()["hosts"]]:
        raise SimError(f"{name} is a fleet host; pick another name for a scratch host")
    remove_host(name)
    taken: set[int] = set()
    ssh_port = _pick_port(None, taken)
    taken.add(ssh_port)
    api_port = _pick_port(None, taken)
    _create_host(name, images.image_hash(images.SPARK_IMAGE) or "", ssh_port, api_port, role="scratch")
    row = {"name": name, "ssh_port": ssh_port, "api_port": api_port, "container": container_name(name)}
    _finish_host(row, SSH_KEY.with_suffix(".pub").read_text(), dict(DEFAULT_GPU))
    write_known_hosts()
    return {**row, "fabric_address": _fabric_endpoint(_inspect(container_name(name)) or {})}


def remove_host(name: str) -> None:
    """Remove a scratch host (container and volumes); fleet hosts go with `up --hosts N` or `down`."""
    _remove_containers([container_name(name)] if _inspect(container_name(name)) else [], volumes=True)


def status() -> dict:
    """What is running now: per host its container state, systemd state and GPU knobs."""
    dockerd = docker("info", "--format", "{{.ServerVersion}}", check=False, timeout=30).returncode == 0
    state = read_json(STATE_FILE)
    out: dict = {"dockerd": dockerd, "up": False, "state_file": str(STATE_FILE), "state": state,
                 "hosts": [], "service_hosts": [], "services": None}
    if not dockerd or not state:
        return out
    info = _inspect(SERVICES)
    out["services"] = {"container": SERVICES, "status": info["State"]["Status"] if info else "missing",
                       "hub": _http_ok(state["hub"]["controller_url"] + "/_sim/counters", 2) if info else False,
                       "registry": _http_ok(f"http://{state['registry']['controller']}/v2/", 2) if info else False}
    all_ok = bool(info and info["State"]["Running"])
    doors = state.get("service_hosts", [])
    for h in [*state["hosts"], *doors]:
        info = _inspect(h["container"])
        row = {**h, "status": info["State"]["Status"] if info else "missing", "system": None, "gpu": None}
        if info and info["State"]["Running"]:
            row["system"] = _system_state(h["container"])
            g = _exec(h["container"], "cat", GPU_FILE, check=False) if h not in doors else None
            row["gpu"] = json.loads(g.stdout) if g and g.returncode == 0 else None
        all_ok = all_ok and row["system"] in ("running", "degraded")
        out["service_hosts" if h in doors else "hosts"].append(row)
    out["up"] = all_ok
    return out


def set_gpu(host: str, **gpu) -> dict:
    """Change a host's simulated GPU (keys: present, name, driver, cuda, compute_cap, sm_clock_mhz,
    sm_clock_max_mhz, power, temp, throttle=none|idle|power|thermal|hw, and containers: false for GPU
    containers started from now on not to see it)."""
    if gpu.get("throttle", "none") not in GPU_THROTTLES:
        raise SimError(f"throttle {gpu['throttle']!r}: use one of {', '.join(GPU_THROTTLES)}")
    for key in ("sm_clock_mhz", "sm_clock_max_mhz", "power", "temp"):
        if key in gpu:
            try:
                gpu[key] = float(gpu[key])
            except (TypeError, ValueError):
                raise SimError(f"{key} {gpu[key]!r}: give a number") from None
    c = _host_row(host)["container"]
    cur = _exec(c, "cat", GPU_FILE, check=False)
    knobs = dict(DEFAULT_GPU)
    if cur.returncode == 0:
        try:
            knobs.update(json.loads(cur.stdout))
        except ValueError:
            pass
    knobs.update(gpu)
    _put_file(c, GPU_FILE, json.dumps(knobs, sort_keys=True) + "\n")
    return knobs


def set_engine(host: str, live: bool = False, **knobs) -> dict:
    """Set the stand-in engine's knobs (fault=hang|generation-hang|none, crash_on_start,
    load_delay_s, spec_acceptance_rate). live=False: the host's file, copied into each engine container at its start
    (lasts across restarts); live=True: the running container's copy (gone with the container)."""
    bad = sorted(k for k in knobs if k not in ENGINE_KNOBS)
    if bad:
        raise SimError(f"unknown engine knob(s) {bad}: known are {sorted(ENGINE_KNOBS)}")
    if knobs.get("fault") in ("none", ""):
        knobs["fault"] = None
    if knobs.get("answer_fault") in ("none", ""):
        knobs["answer_fault"] = None
    if knobs.get("fault") not in (None, "hang", "generation-hang"):
        raise SimError(f"engine fault {knobs['fault']!r}: use hang, generation-hang or none")
    if "spec_acceptance_rate" in knobs:
        try:
            knobs["spec_acceptance_rate"] = float(knobs["spec_acceptance_rate"])
        except ValueError:
            knobs["spec_acceptance_rate"] = -1.0
        if not 0 <= knobs["spec_acceptance_rate"] <= 1:
            raise SimError("spec_acceptance_rate: a share of draft tokens accepted, from 0 to 1")
    c = _host_row(host)["container"]
    where = ("docker", "exec", "-i", "vllm") if live else ()
    cur = _exec(c, *where, "cat", ENGINE_KNOB_FILE, check=False)
    values: dict = {}
    if cur.returncode == 0:
        try:
            values = json.loads(cur.stdout)
        except ValueError:
            pass
    values.update(knobs)
    text = json.dumps(values, sort_keys=True) + "\n"
    if live:
        cp = _exec(c, "docker", "exec", "-i", "vllm", "sh", "-c",
                   f"mkdir -p /etc/sparkfleet-sim && cat > {ENGINE_KNOB_FILE}", input=text, check=False)
        if cp.returncode != 0:
            raise SimError(f"{host}: no running engine container to set knobs in: {cp.stderr.strip()}")
    else:
        _put_file(c, ENGINE_KNOB_FILE, text)
    return values


def lose_container_gpu(host: str) -> None:
    """The running engine container loses the GPU (as after a daemon-reload with the legacy
    runtime): its nvidia-smi fails from now on; the host's does not; a new container sees it."""
    c = _host_row(host)["container"]
    script = (f"import json; p = {GPU_FILE!r}; k = json.load(open(p)); k['nvml_error'] = True; "
              "open(p, 'w').write(json.dumps(k, sort_keys=True))")
    cp = _exec(c, "docker", "exec", "vllm", "python3", "-c", script, check=False)
    if cp.returncode != 0:
        raise SimError(f"{host}: no running engine container with a GPU: {cp.stderr.strip()}")


def fabric_link(host: str) -> dict:
    """The host's fabric interface as `ip` sees it inside the host: name, up, mtu, address."""
    c = _host_row(host)["container"]
    cp = _exec(c, "ip", "-j", "addr", "show", "dev", FABRIC["interface"], check=False)
    if cp.returncode != 0:
        raise SimError(f"{host}: no interface {FABRIC['interface']} (is the host up? `python -m sim up` "
                       f"renames it): {cp.stderr.strip()}")
    link = json.loads(cp.stdout)[0]
    address = next((a["local"] for a in link.get("addr_info", []) if a.get("family") == "inet"), None)
    return {"interface": link["ifname"], "up": "UP" in link.get("flags", []), "mtu": link["mtu"],
            "address": address}


def set_fabric(host: str, up: bool | None = None, mtu: int | None = None) -> dict:
    """Fault knobs on the host's fabric link (a pulled cable, an MTU that fell back to 1500); a reboot or
    `up()` restores the configured state (up, MTU 9000), as netplan does on a real Spark. Returns the link."""
    c = _host_row(host)["container"]
    name = FABRIC["interface"]
    if mtu is not None:
        if isinstance(mtu, bool) or not str(mtu).isdigit() or not 68 <= int(mtu) <= 65535:
            raise SimError(f"fabric mtu {mtu!r}: a number of bytes from 68 to 65535, such as 1500 or 9000")
        fabric_link(host)
        _exec(c, "ip", "link", "set", "dev", name, "mtu", str(int(mtu)))
    if up is not None:
        fabric_link(host)
        _exec(c, "ip", "link", "set", "dev", name, "up" if up else "down")
    return fabric_link(host)


TOOLKIT_PACKAGES = ("nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
                    "libnvidia-container1")
TOOLKIT_KEYRING = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
TOOLKIT_SOURCES = "/etc/apt/sources.list.d/nvidia-container-toolkit.list"


def install_toolkit(host: str, version: str = "1.18.1-1") -> bool:
    """Install the stand-in NVIDIA Container Toolkit from the sim's apt repository as NVIDIA's guide does
    (for sim checks that need `docker run --gpus` without a converge); False when it was there already."""
    state, c = load_state(), _host_row(host)["container"]
    if _exec(c, "sh", "-c", "command -v nvidia-container-runtime-hook", check=False).returncode == 0:
        return False
    repo = state["apt"]["repo_url"].format(arch="amd64")
    sim_only = (f"-o Dir::Etc::sourcelist={TOOLKIT_SOURCES} -o Dir::Etc::sourceparts=- "
                "-o APT::Get::List-Cleanup=0")
    pins = " ".join(f"{p}={version}" for p in TOOLKIT_PACKAGES)
    _exec(c, "sh", "-c", f"cp /etc/docker/daemon.json /etc/docker/daemon.json.sim-orig && "
          f"curl -fsSL {state['apt']['key_url']} | gpg --dearmor --yes -o {TOOLKIT_KEYRING} && "
          f"echo 'deb [signed-by={TOOLKIT_KEYRING}] {repo} /' > {TOOLKIT_SOURCES} && "
          f"apt-get update -q {sim_only} && DEBIAN_FRONTEND=noninteractive apt-get install -y -q {pins} && "
          "nvidia-ctk runtime configure --runtime=docker && systemctl restart docker", timeout=300)
    return True


def remove_toolkit(host: str) -> None:
    """Undo install_toolkit: purge the packages, restore daemon.json, restart docker."""
    c = _host_row(host)["container"]
    _exec(c, "sh", "-c", f"DEBIAN_FRONTEND=noninteractive apt-get purge -y -q {' '.join(TOOLKIT_PACKAGES)}; "
          f"rm -f {TOOLKIT_SOURCES} {TOOLKIT_KEYRING}; "
          "if [ -f /etc/docker/daemon.json.sim-orig ]; then mv /etc/docker/daemon.json.sim-orig "
          "/etc/docker/daemon.json; fi; systemctl restart docker", timeout=300)


def reboot(host: str) -> float:
    """docker restart the host (systemd boots again); returns seconds until ready."""
    h = _host_row(host)
    t0 = time.monotonic()
    docker("restart", "-t", STOP_TIMEOUT, h["container"], timeout=180)
    wait_host_ready(h["name"], h["ssh_port"])
    return time.monotonic() - t0


def stop_host(host: str) -> None:
    docker("stop", "-t", STOP_TIMEOUT, _host_row(host)["container"], timeout=180)


def start_host(host: str) -> float:
    h = _host_row(host)
    t0 = time.monotonic()
    docker("start", h["container"])
    wait_host_ready(h["name"], h["ssh_port"])
    return time.monotonic() - t0


def stop_services() -> None:
    load_state()
    docker("stop", "-t", "10", SERVICES, timeout=60)


def start_services() -> None:
    state = load_state()
    docker("start", SERVICES)
    _wait_services(state["services"])


def publish_driver(version: str) -> list[str]:
    """A newer stand-in driver in the DGX OS repository (apt_repo.publish_driver); the versions it holds."""
    return apt_repo.publish_driver(version)


def reset_driver(host: str | None = None) -> list[str]:
    """The repository back to the original driver only, and `host` (every fleet host when None) on it as if booted
    with it, no reboot cycle; the hosts reset."""
    apt_repo.unpublish_drivers()
    names = [host] if host else [h["name"] for h in load_state()["hosts"]]
    for name in names:
        _exec(_host_row(name)["container"], "sh", "-c", driver.host_script(APT_URL), timeout=300)
    return names


def driver_state(host: str) -> dict:
    """The host's driver package version, the driver nvidia-smi reports, and whether a reboot is pending."""
    c = _host_row(host)["container"]
    cp = _exec(c, "sh", "-c", f"dpkg-query -W -f='${{Version}}' {driver.DRIVER_PACKAGE}; echo; "
               "nvidia-smi --query-gpu=driver_version --format=csv,noheader; "
               "test -e /run/reboot-required && echo yes || echo no", check=False)
    package, loaded, pending = (cp.stdout.splitlines() + ["", "", ""])[:3]
    return {"package": package or None, "driver": loaded or None, "reboot_required": pending == "yes"}
