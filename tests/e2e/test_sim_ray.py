"""The simulated fleet's two-Spark pieces, by hand (no sparkfleet code): the fabric link between the hosts, Ray
2.60.0 in the stand-in engine image, and the stand-in serving over Ray with --tensor-parallel-size 2.

The Ray containers are started as the product's Ray unit starts them (tp_contract.md), head on spark-1, worker on
spark-2, each on its fabric address; test-only names, port and directories, so that a converged pair's own Ray is
never touched. Everything started here is removed at the end; the stand-in toolkit (needed for `--gpus all`) is
installed from the sim's apt repository only where a converge had not installed it, and purged again.
"""

from __future__ import annotations

import functools
import json
import subprocess

import pytest

from sim.fleet.fleet import FABRIC_SUBNET  # the run's fleet: conftest, imported first, chose it
from tests import waiting
from tests.unit.helpers import make_model

from .conftest import ssh

pytestmark = pytest.mark.e2e

HEAD, WORKER = "spark-1", "spark-2"
# spark-N: the fabric subnet's 10+N-th address (10.200.77.11-13 on the default fleet, a named one's own /24)
ADDRESSES = {f"spark-{n}": str(FABRIC_SUBNET.network_address + 10 + n) for n in (1, 2, 3)}
FABRIC = "enp1s0f0np0"
RAY_PORT = 6380  # not the product's 6379
RAY_DIR = "/var/lib/sparkfleet/sim-ray-check"  # the head's Ray session, /tmp/ray in both of its containers
MODEL_DIR = "/var/lib/sparkfleet/sim-ray-model"
ENGINE_PORT = 8001  # not the product's 8000
# what Ray needs to fit the sim's shared 24 GiB: one CPU (one idle worker process) and a 100 MB object store
RAY_FLAGS = "--num-gpus 1 --disable-usage-stats --num-cpus 1 --object-store-memory 100000000"
# the stand-in's driver finds its local raylet by its process list: it must see the Ray container's processes
ENGINE_FLAGS = (f"--gpus all --ipc host --network host --pid host -e RAY_ADDRESS={ADDRESSES[HEAD]}:{RAY_PORT} "
                f"-e SIM_LOAD_DELAY_S=0 -e SIM_RAY_CHECK_S=1 --volume {RAY_DIR}:/tmp/ray "
                f"--volume {MODEL_DIR}:/model:ro")
SERVE = f"/model --port {ENGINE_PORT} --served-model-name sim --tensor-parallel-size 2 --distributed-executor-backend ray"
CHAT = (f"curl -s -w ' %{{http_code}}' http://127.0.0.1:{ENGINE_PORT}/v1/chat/completions -H 'content-type: "
        """application/json' -d '{"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}'""")
CLEAN = f"docker rm -f sim-ray sim-ray-engine >/dev/null 2>&1; rm -rf {RAY_DIR} {MODEL_DIR}"


wait_until = functools.partial(waiting.wait_until, step_s=0.5)


def start_ray(state: dict, host: str, role: str) -> None:
    ssh(state, host, f"docker run -d --rm --name sim-ray --gpus all --ipc host --network host --shm-size 1g "
                     f"--volume {RAY_DIR}:/tmp/ray --entrypoint ray {state['image']} start --block "
                     f"--node-ip-address {ADDRESSES[host]} {RAY_FLAGS} {role}")


def ray_status(state: dict) -> str:
    return ssh(state, HEAD, f"docker exec sim-ray ray status --address {ADDRESSES[HEAD]}:{RAY_PORT}", check=False)


def active_nodes(status: str) -> int:
    """The number of nodes `ray status` lists as active."""
    return status.split("Active:")[1].split("Pending:")[0].count("node_") if "Active:" in status else 0


def status_with_nodes(state: dict, n: int) -> str:
    """`ray status` when it lists n active nodes, else ""."""
    status = ray_status(state)
    return status if active_nodes(status) == n else ""


def health(state: dict) -> str:
    return ssh(state, HEAD, f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{ENGINE_PORT}/health",
               check=False)


@pytest.fixture(scope="module")
def ray_pair(sim_fleet, tmp_path_factory):
    """spark-1 and spark-2 able to run GPU containers of the engine image, with a small model on the head."""
    from sim import fleet

    installed = [h for h in (HEAD, WORKER) if fleet.install_toolkit(h)]
    try:
        for host in (HEAD, WORKER):
            ssh(sim_fleet, host, f"{CLEAN}; docker pull -q {sim_fleet['image']}")
        model = make_model(tmp_path_factory.mktemp("ray") / "sim-ray-model")
        container = next(h["container"] for h in sim_fleet["hosts"] if h["name"] == HEAD)
        subprocess.run(["docker", "cp", str(model), f"{container}:{MODEL_DIR}"], check=True, timeout=60)
        yield sim_fleet
    finally:
        for host in (HEAD, WORKER):
            ssh(sim_fleet, host, CLEAN, check=False)
        for host in installed:
            fleet.remove_toolkit(host)


def test_fabric_link_between_the_hosts(sim_fleet):
    from sim import fleet

    assert {h["name"]: h["fabric_address"] for h in sim_fleet["hosts"]} == ADDRESSES
    for host, address in ADDRESSES.items():
        assert fleet.fabric_link(host) == {"interface": FABRIC, "up": True, "mtu": 9000, "address": address}
    jumbo = f"ping -c 1 -W 2 -I {FABRIC} -M do -s 8972 {ADDRESSES[WORKER]}"  # 9000 bytes, not fragmented
    ssh(sim_fleet, HEAD, jumbo)
    try:
        assert fleet.set_fabric(WORKER, mtu=1500)["mtu"] == 1500
        assert ssh(sim_fleet, WORKER, f"cat /sys/class/net/{FABRIC}/mtu") == "1500"
        assert " 0 received" in ssh(sim_fleet, HEAD, jumbo, check=False)  # the worker drops the big frame
        assert fleet.set_fabric(WORKER, up=False)["up"] is False
        assert ssh(sim_fleet, WORKER, f"cat /sys/class/net/{FABRIC}/operstate") == "down"
        assert " 0 received" in ssh(sim_fleet, HEAD, f"ping -c 1 -W 2 -I {FABRIC} {ADDRESSES[WORKER]}", check=False)
        fleet.reboot(WORKER)  # a boot names the link and sets its MTU again, as a Spark's netplan does
        assert fleet.fabric_link(WORKER) == {"interface": FABRIC, "up": True, "mtu": 9000,
                                             "address": ADDRESSES[WORKER]}
        ssh(sim_fleet, HEAD, jumbo)
    finally:
        fleet.set_fabric(WORKER, up=True, mtu=9000)


def test_standin_serves_over_ray_on_two_hosts(ray_pair):
    state = ray_pair
    start_ray(state, HEAD, f"--head --port {RAY_PORT} --include-dashboard false")
    wait_until(lambda: "1.0 GPU" in ray_status(state), 60, "the Ray head")

    # one node of two: the engine waits for its placement group, binds nothing, and gives up after ray_wait_s
    alone = ssh(state, HEAD, f"docker run --rm -e SIM_RAY_WAIT_S=5 {ENGINE_FLAGS} {state['image']} {SERVE} 2>&1",
                check=False)
    assert "Waiting for creating a placement group of specs" in alone
    assert ("ValueError: Cannot provide a placement group of placement_group_specs=[{'GPU': 1.0}, {'GPU': 1.0}] "
            "within 5 seconds (the cluster has 1 alive node(s) with a GPU)") in alone
    ssh(state, HEAD, f"docker run -d --name sim-ray-engine {ENGINE_FLAGS} {state['image']} {SERVE}")
    # the window in which it must not bind: from here the engine is in its wait for the placement group, which
    # comes before any bind (standin_vllm.py's join_ray, then the server) and lasts until Ray has 2 GPU nodes
    wait_until(lambda: "Waiting for creating a placement group of specs" in
               ssh(state, HEAD, "docker logs sim-ray-engine 2>&1", check=False), 60, "the engine's wait for Ray")
    assert health(state) == "000"  # nothing listens yet

    start_ray(state, WORKER, f"--address {ADDRESSES[HEAD]}:{RAY_PORT}")
    wait_until(lambda: health(state) == "200", 90, "the engine to serve once Ray has 2 GPU nodes")
    # `ray status` is the autoscaler's report, a few seconds behind the cluster
    status = wait_until(lambda: status_with_nodes(state, 2), 30, "ray status: 2 nodes")
    assert "/2.0 GPU" in status
    nodes = ssh(state, HEAD, "docker exec sim-ray python3 -c \"import json, ray; ray.init(logging_level='ERROR'); "
                             "print(json.dumps(sorted([n['NodeManagerAddress'], n['Resources'].get('GPU')] "
                             "for n in ray.nodes() if n['Alive'])))\"")
    assert json.loads(nodes.splitlines()[-1]) == [[ADDRESSES[HEAD], 1.0], [ADDRESSES[WORKER], 1.0]]
    assert ssh(state, HEAD, CHAT).endswith(' 200')
    assert '"content": "The simulated Spark answers every"' in ssh(state, HEAD, CHAT)

    # the worker's Ray goes: the engine is dead (vLLM's Ray worker died), and stays dead when it comes back
    ssh(state, WORKER, "docker stop sim-ray")
    wait_until(lambda: health(state) == "503", 60, "the engine to notice the lost node")
    assert ssh(state, HEAD, CHAT, check=False).endswith(' 500')
    start_ray(state, WORKER, f"--address {ADDRESSES[HEAD]}:{RAY_PORT}")
    wait_until(lambda: status_with_nodes(state, 2), 60, "the worker to join again")
    assert health(state) == "503"
    logs = ssh(state, HEAD, "docker logs sim-ray-engine 2>&1")
    assert "EngineCore encountered a fatal error. ActorDiedError" in logs
