"""Two simulated Sparks as one serving unit over real Ray (spark-1 head, spark-2 worker) beside a single host
(spark-3): converged, checked, healed, refused on a broken fabric, rolled out and back as one unit.

The module converges the pair once and, at its end, converges inventory/sim.py again (three single hosts), so
the other e2e tests find the fleet they expect; each test repairs what it broke, but for a release left on a
host (a rollout's), which the next test's `pair` converges back."""

import json
import subprocess
import sys

import pytest

from sim import fleet
from sparkfleet.model.hubs import cache_dir

from .conftest import (
    INVENTORY,
    ROOT,
    chat_tokens,
    converge,
    sparkfleet,
    ssh,
    started_at,
    variant,
)

pytestmark = pytest.mark.e2e

PAIR = ("spark-1", "spark-2")
BIG_RECIPE, BIG_REPO = "qwen3-235b-a22b-gptq-int4", "Qwen/Qwen3-235B-A22B-GPTQ-Int4"  # ~116 GiB of weights


def pair_inventory(tmp_path, name: str, everywhere: dict | None = None, per_host: dict | None = None) -> str:
    """inventory/sim.py with spark-1 + spark-2 joined into one tensor-parallel group (the fabric addresses come
    from the sim's state), spark-3 single."""
    group = {"tensor_parallel_hosts": list(PAIR), "tensor_parallel_size": 2}
    per_host = per_host or {}
    hosts = {h: {**group, **per_host.get(h, {})} for h in PAIR}
    if "spark-3" in per_host:
        hosts["spark-3"] = per_host["spark-3"]
    return variant(tmp_path, name, everywhere or {}, hosts)


def chat(state, host: str) -> bool:
    """A short chat completion on the host's API, as a user sends it, answered with tokens."""
    return chat_tokens(state, host, max_tokens=4, timeout=10) == 4


def ray_status(state) -> tuple[int, str]:
    """Ray's own view, from its command line in the head's Ray container: (active nodes, its text)."""
    address = next(h["fabric_address"] for h in state["hosts"] if h["name"] == "spark-1")
    text = ssh(state, "spark-1", f"docker exec sparkfleet-ray ray status --address {address}:6379")
    active = text.split("Active:", 1)[-1].split("Pending:", 1)[0]
    return sum(" node_" in line for line in active.splitlines()), text


def release_ids(state) -> dict[str, str]:
    return {h: json.loads(ssh(state, h, "cat /etc/sparkfleet/release.json"))["release_id"]
            for h in ("spark-1", "spark-2", "spark-3")}


def status_rows(inventory: str) -> tuple[int, dict]:
    proc = sparkfleet("status", inventory, "--json", timeout=300)
    return proc.returncode, {r["host"]: r for r in json.loads(proc.stdout)["hosts"]}


@pytest.fixture(scope="module")
def pair_converged(sim_fleet, first_converge, tmp_path_factory):
    """The pair converged once for the module (its inventory and release ids); afterwards the fleet is three
    single hosts again."""
    inventory = pair_inventory(tmp_path_factory.mktemp("pair"), "pair")
    done = converge(inventory=inventory)
    assert done.returncode == 0, done.output[-6000:]
    yield inventory, release_ids(sim_fleet)
    back = converge()
    assert back.returncode == 0, back.output[-6000:]


@pytest.fixture
def pair(sim_fleet, pair_converged):
    """The pair and spark-3 on the pair inventory's releases: converged again first only when an earlier test
    left a host on another (a rollout), so the last test that does pays no converge back."""
    inventory, ids = pair_converged
    if release_ids(sim_fleet) != ids:
        again = converge(inventory=inventory)
        assert again.returncode == 0, again.output[-6000:]
        assert release_ids(sim_fleet) == ids
    return sim_fleet, inventory


def test_a_pair_and_a_single_host_converge_serve_and_reconverge_to_no_change(pair):
    state, inventory = pair
    nodes, text = ray_status(state)
    assert nodes == 2 and "/2.0 GPU" in text, text  # two members, 1 GPU each, as Ray itself reports
    assert chat(state, "spark-1") and chat(state, "spark-3")
    assert ssh(state, "spark-2", "systemctl is-active sparkfleet-vllm.service", check=False) != "active"
    ids = release_ids(state)
    assert ids["spark-1"] == ids["spark-2"] != ids["spark-3"]
    again = converge(inventory=inventory)
    assert again.returncode == 0 and not any(again.changed.values()), again.changed


def test_the_ray_containers_hold_no_api_key_and_no_token_value(pair):
    """What `docker inspect` shows of each member's Ray container (and the head's engine, a Ray driver): Ray's token
    auth on, the token's path, never its value; no API key in the Ray container."""
    state, _ = pair
    sums = set()
    for host in PAIR:
        token = ssh(state, host, "cat /etc/sparkfleet/ray.token")
        assert len(token) >= 32 and ssh(state, host, "stat -c %a:%U /etc/sparkfleet/ray.token") == "600:root"
        sums.add(ssh(state, host, "sha256sum < /etc/sparkfleet/ray.token"))
        text = ssh(state, host, "docker inspect sparkfleet-ray")
        env = json.loads(text)[0]["Config"]["Env"]
        assert {"RAY_AUTH_MODE=token", "RAY_AUTH_TOKEN_PATH=/etc/sparkfleet/ray.token"} <= set(env), env
        assert not [e for e in env if e.startswith(("VLLM_API_KEY=", "RAY_AUTH_TOKEN=", "SIM_TOKENS_PER_S="))], env
        assert token not in text and "sim-key" not in text
    assert token not in ssh(state, "spark-1", "docker inspect vllm")
    assert len(sums) == 1  # one token for the group


def test_a_host_without_the_groups_token_cannot_join_its_ray_and_the_pair_still_serves(pair):
    """spark-3 (on the fabric, in no group) tries the head's Ray port as a node without a token and with a wrong
    one, and as a driver: each is refused by Ray's token auth; the pair keeps its two nodes and serves."""
    state, _ = pair
    head = next(h["fabric_address"] for h in state["hosts"] if h["name"] == "spark-1")
    own = next(h["fabric_address"] for h in state["hosts"] if h["name"] == "spark-3")
    run = f"timeout 100 docker run --rm --network host --name sparkfleet-intruder-{{n}} {{env}} --entrypoint {{cmd}}"
    node = (f"{state['image']} start --address {head}:6379 --node-ip-address {own} --num-gpus 0 --num-cpus 1 "
            f"--object-store-memory 100000000 --disable-usage-stats")
    driver = f"{state['image']} -c 'import ray; ray.init(address=\"{head}:6379\"); print(\"JOINED\")'"
    tries = {"none": run.format(n="none", env="", cmd="ray") + " " + node,
             "wrong": run.format(n="wrong", env="-e RAY_AUTH_MODE=token -e RAY_AUTH_TOKEN=not-the-groups-token",
                                 cmd="ray") + " " + node,
             "driver": run.format(n="driver", env="", cmd="python3") + " " + driver}
    script = " ".join(f"( {cmd} > /tmp/intruder-{n}.log 2>&1; echo $? > /tmp/intruder-{n}.rc ) &"
                      for n, cmd in tries.items()) + " wait"
    try:
        ssh(state, "spark-3", script)
        for n in tries:
            rc = ssh(state, "spark-3", f"cat /tmp/intruder-{n}.rc")
            log = ssh(state, "spark-3", f"cat /tmp/intruder-{n}.log")
            assert rc not in ("0", "124") and "JOINED" not in log, (n, rc, log[-3000:])
            assert "InvalidAuthToken" in log or "Failed to connect to Ray cluster" in log, (n, log[-3000:])
    finally:
        ssh(state, "spark-3", "docker rm -f sparkfleet-intruder-none sparkfleet-intruder-wrong "
                              "sparkfleet-intruder-driver >/dev/null 2>&1; rm -f /tmp/intruder-*", check=False)
    nodes, text = ray_status(state)
    members = {h["name"]: h["fabric_address"] for h in state["hosts"] if h["name"] in PAIR}
    check = ssh(state, "spark-1", f"python3 /opt/sparkfleet/bin/sparkfleet-ray-check --address {head}:6379 "
                                  f"--node-ip {head} " + " ".join(f"--member {m}={a}" for m, a in members.items()))
    assert nodes == 2 and sorted(json.loads(check)["addresses"]) == sorted(members.values()), (text, check)
    assert chat(state, "spark-1")


def test_a_new_ray_token_restarts_the_groups_ray_and_engine_and_is_no_new_release(pair):
    """The controller's token file deleted (a rotation): the next converge ships a new token to both members,
    restarts both Ray nodes and the head's engine, and the release stays the same."""
    state, inventory = pair
    before, engine = release_ids(state), started_at(state, "spark-1")
    ray_started = {h: ssh(state, h, "docker inspect -f '{{.State.StartedAt}}' sparkfleet-ray") for h in PAIR}
    old = {h: ssh(state, h, "sha256sum < /etc/sparkfleet/ray.token") for h in PAIR}
    (cache_dir() / "ray-spark-1+spark-2.token").unlink()  # .cache/, or SPARKFLEET_CACHE (a named fleet's)
    done = converge(inventory=inventory)
    assert done.returncode == 0, done.output[-6000:]
    new = {h: ssh(state, h, "sha256sum < /etc/sparkfleet/ray.token") for h in PAIR}
    assert len(set(new.values())) == 1 and not set(new.values()) & set(old.values())
    assert all(ssh(state, h, "docker inspect -f '{{.State.StartedAt}}' sparkfleet-ray") != ray_started[h]
               for h in PAIR)
    assert started_at(state, "spark-1") != engine and release_ids(state) == before
    assert ray_status(state)[0] == 2 and chat(state, "spark-1")


def test_testinfra_checks_both_members_of_the_pair(pair):
    """The verification suite against the pair's inventory: the Ray checks run on each member (head and worker),
    the model is verified on each, and the worker's vLLM checks are skipped as not applying."""
    _, inventory = pair
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests/infra", "--inventory", inventory, "-v",
                           "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]
    passed = {line.split(" PASSED")[0] for line in proc.stdout.splitlines() if " PASSED" in line}
    for member in PAIR:
        ray_checks = [t for t in passed if "test_group.py::test_ray_" in t and member in t]
        assert len(ray_checks) == 3, (member, sorted(passed))
        assert f"tests/infra/test_converged.py::test_every_model_file_has_the_manifest_hash[{member}]" in passed, \
            (member, sorted(passed))
    assert any("test_a_worker_runs_no_vllm_unit" in t and "spark-2" in t for t in passed)


def test_ray_stopped_on_the_worker_makes_the_pair_unhealthy_until_a_converge(pair):
    state, inventory = pair
    ssh(state, "spark-2", "systemctl stop sparkfleet-ray.service")
    try:
        code, rows = status_rows(inventory)
        assert code == 1
        row = rows["spark-1+spark-2"]
        assert not row["healthy"] and [m["host"] for m in row["members"]] == list(PAIR), row
        assert rows["spark-3"]["healthy"]
    finally:
        healed = converge(inventory=inventory)
    assert healed.returncode == 0, healed.output[-6000:]
    code, rows = status_rows(inventory)
    assert code == 0 and rows["spark-1+spark-2"]["healthy"], rows
    assert chat(state, "spark-1")


@pytest.mark.parametrize("fault", ["down", "mtu"])
def test_a_broken_fabric_on_the_worker_stops_the_pair_and_the_single_host_converges(pair, tmp_path, fault):
    state, inventory = pair
    before = release_ids(state)
    engine_started = started_at(state, "spark-1")
    changed = pair_inventory(tmp_path, f"fabric-{fault}", {"max_model_len": 65536})
    if fault == "down":
        fleet.set_fabric("spark-2", up=False)
    else:
        fleet.set_fabric("spark-2", mtu=1500)
    try:
        result = converge(inventory=changed)
    finally:
        fleet.set_fabric("spark-2", up=True, mtu=9000)
    assert result.returncode != 0
    lines = [line for line in result.output.splitlines() if "spark-2" in line and "enp1s0f0np0" in line]
    assert lines, result.output[-6000:]
    assert ("down" in lines[0]) if fault == "down" else ("1500" in lines[0] and "9000" in lines[0]), lines
    after = release_ids(state)
    assert (after["spark-1"], after["spark-2"]) == (before["spark-1"], before["spark-2"])
    assert started_at(state, "spark-1") == engine_started
    assert after["spark-3"] != before["spark-3"] and chat(state, "spark-3")
    restored = converge(inventory=inventory)
    assert restored.returncode == 0, restored.output[-6000:]


def test_a_model_that_needs_two_sparks_is_refused_on_one_and_fits_the_pair(sim_fleet, tmp_path):
    def plan(name: str, hosts: tuple[str, ...], group: dict) -> subprocess.CompletedProcess:
        big = {"recipe": BIG_RECIPE, "model_repo": BIG_REPO, "gpu_memory_utilization": 0.88, **group}
        path = tmp_path / f"{name}.py"
        path.write_text(f"import runpy\n_sim = runpy.run_path({str(ROOT / INVENTORY)!r})\n"
                        f"sparks = [(n, {{**d, **{big!r}}}) for n, d in _sim['sparks'] if n in {hosts!r}]\n")
        return sparkfleet("plan", str(path), "--offline", timeout=300)

    one = plan("one", ("spark-3",), {})
    assert one.returncode == 2, one.stdout[-3000:] + one.stderr[-3000:]
    assert "spark-3" in one.stderr and "needs 2 Sparks" in one.stderr, one.stderr[-3000:]
    two = plan("two", PAIR, {"tensor_parallel_hosts": list(PAIR), "tensor_parallel_size": 2})
    assert two.returncode == 0, two.stdout[-3000:] + two.stderr[-3000:]
    assert "spark-1+spark-2" in two.stdout


def test_rollout_moves_the_pair_in_one_batch_and_a_failing_release_rolls_both_back(pair, tmp_path):
    state, _ = pair
    longer = pair_inventory(tmp_path, "longer", {"max_model_len": 131072})
    proc = sparkfleet("rollout", longer, "--batch", "1", "--json", timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    hosts = {h["host"]: h for h in report["hosts"]}
    assert hosts["spark-1"]["group"] == hosts["spark-2"]["group"] == "spark-1+spark-2"
    assert hosts["spark-1"]["batch"] == hosts["spark-2"]["batch"] != hosts["spark-3"]["batch"], hosts
    assert {hosts[h]["result"] for h in hosts} == {"converged"}
    good = release_ids(state)

    bad = pair_inventory(tmp_path, "bad", {"max_model_len": 65536},
                         {h: {"engine_env": {"SIM_FAIL_HEALTH": "1"}, "health_timeout_s": 20} for h in PAIR})
    proc = sparkfleet("rollout", bad, "--batch", "1", "--json", timeout=1500)
    assert proc.returncode != 0
    hosts = {h["host"]: h for h in json.loads(proc.stdout)["hosts"]}
    assert hosts["spark-1"]["result"] == hosts["spark-2"]["result"] == "rolled back", hosts
    after = release_ids(state)
    assert (after["spark-1"], after["spark-2"]) == (good["spark-1"], good["spark-2"])
    assert chat(state, "spark-1")
    assert ray_status(state)[0] == 2
