"""Two Sparks, one model: the tensor-parallel group's settings, plan, units, environment and fit.

Figures for Qwen3-235B-A22B GPTQ-Int4 are worked by hand from recipes/qwen3-235b-a22b-gptq-int4.toml:
94 layers, 4 KV heads of 128, bf16 KV cache, 124,531,203,072 bytes of weights, budget 0.88 x 128e9 = 112,640,000,000
per Spark, reserve 3 GiB = 3,221,225,472.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest

from sparkfleet import cli
from sparkfleet.model.fit import check_fit, fit_report, kv_bytes_per_token
from sparkfleet.model.manifest import Manifest, ManifestFile
from sparkfleet.contract.recipes import recipe
from sparkfleet.release.plan import TensorParallelGroup, plan_hosts
from sparkfleet.contract.settings import SettingsError

from .helpers import host_data, qwen35_config

BIG = "qwen3-235b-a22b-gptq-int4"
BIG_WEIGHTS = 124_531_203_072
PAIR = ["spark-1", "spark-2"]
MANIFEST = Manifest("modelscope", "Qwen/Qwen3.5-35B-A3B-FP8", "master", "f" * 40,
                    (ManifestFile("model-00001-of-00001.safetensors", 35_000_000_000, sha256="a" * 64),))


def hub(s):
    return MANIFEST, qwen35_config(), None


def member(address: str, **overrides) -> dict:
    return host_data(**{"tensor_parallel_hosts": PAIR, "tensor_parallel_size": 2, "fabric_address": address,
                        **overrides})


def pair(first: dict | None = None, second: dict | None = None, *more) -> list[tuple[str, dict]]:
    return [("spark-1", member("192.168.100.1", **(first or {}))),
            ("spark-2", member("192.168.100.2", **(second or {}))), *more]


def problems_of(hosts, resolve=hub) -> list[str]:
    with pytest.raises(SettingsError) as caught:
        plan_hosts(hosts, resolve=resolve)
    return caught.value.problems


def never(s):
    raise AssertionError("the hub was asked although the settings alone were refused")


# --- the group's settings --------------------------------------------------------------------------------------


def test_a_pair_plans_as_one_group_head_first():
    head, worker, single = plan_hosts(pair() + [("spark-3", host_data())], resolve=hub)
    assert head.group == worker.group == TensorParallelGroup(("spark-1", "spark-2"), ("192.168.100.1", "192.168.100.2"),
                                                             "enp1s0f0np0", 9000, 6379)
    assert (head.role, worker.role, single.role) == ("head", "worker", "single")
    assert (head.runs_engine, worker.runs_engine, single.runs_engine) == (True, False, True)
    group = head.group
    assert (group.head, group.name, group.size, group.ray_address) == ("spark-1", "spark-1+spark-2", 2,
                                                                       "192.168.100.1:6379")
    assert group.address_of("spark-2") == "192.168.100.2" and single.group is None


@pytest.mark.parametrize("first,second,expected", [
    ({"tensor_parallel_size": 3}, {"tensor_parallel_size": 3},
     "spark-1: setting `tensor_parallel_size` = 3 but tensor_parallel_hosts lists 2 hosts: "
     "set tensor_parallel_size = 2"),
    ({"fabric_address": None}, {},
     "spark-1: setting `fabric_address` is missing: a member of spark-1+spark-2 needs its IPv4 address on "
     "enp1s0f0np0; set it in this host's inventory data"),
    ({}, {"fabric_address": "192.168.100.1"},
     "spark-2: setting `fabric_address` = '192.168.100.1' is also spark-1's: give each member of spark-1+spark-2 "
     "its own address on the fabric"),
    ({}, {"engine_image": "vllm/vllm-openai:v0.34.0"},
     "spark-2: setting `engine_image` = 'vllm/vllm-openai:v0.34.0' differs from the head spark-1's "
     "'vllm/vllm-openai:v0.33.0': a tensor-parallel group serves one release: set the same `engine_image` on every "
     "member of spark-1+spark-2"),
    ({}, {"model_revision": "v2"},
     "spark-2: setting `model_revision` = 'v2' differs from the head spark-1's 'master': a tensor-parallel group "
     "serves one release: set the same `model_revision` on every member of spark-1+spark-2"),
    ({}, {"fabric_mtu": 1500},
     "spark-2: setting `fabric_mtu` = 1500 differs from the head spark-1's 9000: a tensor-parallel group serves one "
     "release: set the same `fabric_mtu` on every member of spark-1+spark-2"),
    ({}, {"tensor_parallel_hosts": ["spark-2", "spark-1"]},
     "spark-2: setting `tensor_parallel_hosts` = ['spark-2', 'spark-1'], but the head spark-1 lists "
     "['spark-1', 'spark-2']: give every member the same list (a group's data is the usual place); a host is in one "
     "group at most"),
    ({"docker_network": "sparkfleet"}, {"docker_network": "sparkfleet"},
     "spark-1: setting `docker_network` = 'sparkfleet': Ray and NCCL reach the other members from the host's "
     "network: set docker_network = \"host\""),
    ({"services": {"embed": {"recipe": "qwen3-embedding-0.6b"}}}, {},
     "spark-1: setting `services` on a member of spark-1+spark-2: the group's model takes every member's GPU memory: "
     "move the services to a single host"),
    ({"engine_env": {"NCCL_IB_GID_INDEX": "3"}}, {"engine_env": {"NCCL_IB_GID_INDEX": "3"}},
     "spark-1: setting `engine_env` sets NCCL_IB_GID_INDEX on a member of a tensor-parallel group: the RoCE GID index "
     "drifts across reboots, and NCCL picks the right one itself: remove it"),
    ({"engine_env": {"NCCL_SOCKET_IFNAME": "eth0", "VLLM_HOST_IP": "10.0.0.1"}}, {},
     "spark-1: setting `engine_env` sets NCCL_SOCKET_IFNAME, VLLM_HOST_IP, which sparkfleet derives from "
     "fabric_interface, fabric_address and ray_port: remove it (set those settings instead)"),
    ({"ray_start_args": ["--num-cpus", "4", "--port=7000"]}, {"ray_start_args": ["--num-cpus", "4", "--port=7000"]},
     "spark-1: setting `ray_start_args`: `--port` is set by sparkfleet from ray_port: remove it"),
])
def test_a_group_problem_is_one_line_naming_host_key_and_fix(first, second, expected):
    assert expected in problems_of(pair(first, second), resolve=never)


def test_a_list_without_the_host_itself_or_with_a_host_twice_is_refused():
    found = problems_of([("spark-1", member("192.168.100.1", tensor_parallel_hosts=["spark-2", "spark-2"]))],
                        resolve=never)
    assert ("spark-1: setting `tensor_parallel_hosts` = ['spark-2', 'spark-2'] does not name spark-1: list every "
            "member of the group, this host included (the head first)") in found
    assert ("spark-1: setting `tensor_parallel_hosts` = ['spark-2', 'spark-2'] names spark-2 more than once: list "
            "each member once") in found


def test_a_group_of_one_is_refused():
    [problem] = problems_of([("spark-1", host_data(tensor_parallel_hosts=["spark-1"], fabric_address="192.168.100.1"))],
                            resolve=never)
    assert problem == ("spark-1: setting `tensor_parallel_hosts` = ['spark-1'] has one host: list 2 or more, or set "
                       "tensor_parallel_hosts = [] for a single host")


def test_a_member_missing_from_the_run_is_named():
    found = problems_of(pair()[:1], resolve=never)
    assert found == ["spark-1: setting `tensor_parallel_hosts` = ['spark-1', 'spark-2'] names spark-2, which is not "
                     "among the hosts of this run: add it to the inventory, or plan the whole group (--host/--limit "
                     "the group, not one member)"]
    assert problems_of(pair()[1:], resolve=never) == [found[0].replace("spark-1:", "spark-2:", 1)
                                                      .replace("names spark-2", "names spark-1")]


def test_a_member_whose_head_is_a_single_host_is_refused():
    found = problems_of([("spark-1", host_data()), pair()[1]], resolve=never)
    assert found == ["spark-2: setting `tensor_parallel_hosts` = ['spark-1', 'spark-2'] names spark-1 as the head, "
                     "whose own list is []: give every member the same list (a group's data is the usual place)"]


def test_a_host_in_two_groups_is_refused():
    other = host_data(tensor_parallel_hosts=["spark-3", "spark-2"], tensor_parallel_size=2,
                      fabric_address="192.168.100.3")
    found = problems_of(pair() + [("spark-3", other)], resolve=never)
    assert ("spark-2: setting `tensor_parallel_hosts` = ['spark-1', 'spark-2'], but the head spark-3 lists "
            "['spark-3', 'spark-2']: give every member the same list (a group's data is the usual place); a host is "
            "in one group at most") in found


def test_tensor_parallel_on_a_single_host_is_refused_naming_tensor_parallel_hosts():
    [problem] = problems_of([("spark-x", host_data(tensor_parallel_size=2))], resolve=never)
    assert problem == ("spark-x: tensor_parallel_size=2: one Spark has one GPU: set tensor_parallel_hosts to the 2 "
                       "hosts that serve this model together (the head first), or tensor_parallel_size = 1")


@pytest.mark.parametrize("key,value,reason", [
    ("fabric_interface", "-i eth0", "must be a network interface name"),
    ("fabric_interface", "enp1s0f0np0-too-long", "must be a network interface name"),
    ("fabric_address", "192.168.100.300", "must be an IPv4 address"),
    ("fabric_address", "fe80::1", "must be an IPv4 address"),
    ("fabric_address", "127.0.0.1", "must be this member's unicast IPv4 address"),
    ("fabric_mtu", 1000, "greater than or equal to 1280"),
    ("ray_port", 70000, "less than or equal to 65535"),
])
def test_fabric_settings_are_typed(key, value, reason):
    [problem] = problems_of([("spark-x", host_data(**{key: value}))], resolve=never)
    assert problem.startswith(f"spark-x: setting `{key}` = {value!r} is invalid: ") and reason in problem


# --- release, engine, environment and units ----------------------------------------------------------------------


def test_members_share_one_release_id_that_the_group_changes():
    head, worker, single = plan_hosts(pair() + [("spark-3", host_data())], resolve=hub)
    assert head.release_id == worker.release_id and len(head.release_id) == 12
    assert head.release_id != single.release_id
    moved = plan_hosts(pair({}, {"fabric_address": "192.168.100.9"}), resolve=hub)
    assert moved[0].release_id == moved[1].release_id != head.release_id
    ray = plan_hosts(pair({"ray_port": 6380}, {"ray_port": 6380}), resolve=hub)
    assert ray[0].release_id not in (head.release_id, None)
    args = plan_hosts(pair({"ray_start_args": ["--num-cpus", "1"]}, {"ray_start_args": ["--num-cpus", "1"]}),
                      resolve=hub)
    assert args[0].release_id != head.release_id


def test_the_head_runs_vllm_over_ray_and_a_worker_records_the_heads_arguments():
    head, worker = plan_hosts(pair(), resolve=hub)
    assert head.engine_args[-4:] == ["--tensor-parallel-size", "2", "--distributed-executor-backend", "ray"]
    assert worker.engine_args == head.engine_args
    assert head.docker_options[-6:] == ["--volume", "/var/lib/sparkfleet/ray:/tmp/ray", "--pid", "host",
                                        "--volume", "/etc/sparkfleet/ray.token:/etc/sparkfleet/ray.token:ro"]
    with pytest.raises(ValueError, match="spark-2 is a worker of spark-1[+]spark-2: it runs no vLLM unit"):
        worker.render_unit()
    record = worker.release_record()
    assert record["role"] == "worker" and record["group"]["members"] == PAIR
    assert record["group"]["addresses"] == ["192.168.100.1", "192.168.100.2"]
    assert record["release_id"] == head.release_record()["release_id"]
    assert "role" not in plan_hosts([("spark-3", host_data())], resolve=hub)[0].release_record()
    # what a rollback brings back: the head's Ray node before its engine, a worker's Ray node alone
    assert (head.release_record()["units"], record["units"]) == (
        ["sparkfleet-ray.service", "sparkfleet-vllm.service"], ["sparkfleet-ray.service"])


def test_the_backend_flag_is_owned_by_the_group_settings():
    [problem] = problems_of([("spark-x", host_data(extra_engine_args=["--distributed-executor-backend", "ray"]))],
                            resolve=never)
    assert problem == ("spark-x: setting `extra_engine_args`: `--distributed-executor-backend` is set by sparkfleet "
                       "from `tensor_parallel_hosts`: set `tensor_parallel_hosts` instead")


def test_each_member_gets_its_fabric_environment():
    head, worker = plan_hosts(pair({"engine_env": {"SIM_TOKENS_PER_S": "50"}, "sim_engine_knobs": True},
                                   {"engine_env": {"SIM_TOKENS_PER_S": "50"}, "sim_engine_knobs": True}), resolve=hub)
    assert worker.render_engine_env().splitlines()[1:] == [
        "GLOO_SOCKET_IFNAME=enp1s0f0np0",
        "MASTER_ADDR=192.168.100.1",
        "NCCL_SOCKET_IFNAME=enp1s0f0np0",
        "RAY_ADDRESS=192.168.100.1:6379",
        "RAY_AUTH_MODE=token",
        "RAY_AUTH_TOKEN_PATH=/etc/sparkfleet/ray.token",
        "RAY_memory_monitor_refresh_ms=0",
        "SIM_TOKENS_PER_S=50",
        "TP_SOCKET_IFNAME=enp1s0f0np0",
        "UCX_NET_DEVICES=enp1s0f0np0",
        "VLLM_HOST_IP=192.168.100.2",
    ]
    assert "VLLM_HOST_IP=192.168.100.1" in head.render_engine_env().splitlines()
    single = plan_hosts([("spark-3", host_data())], resolve=hub)[0].render_engine_env()
    assert "RAY" not in single and "NCCL" not in single and "NCCL_IB_GID_INDEX" not in head.render_engine_env()


def _exec_start(unit: str) -> list[str]:
    """ExecStart's argv as systemd reads it (continuation lines joined)."""
    line = next(line for line in unit.replace("\\\n", " ").splitlines() if line.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart=").replace("$$", "$").replace("%%", "%"))


def test_the_ray_units_look_like_their_template():
    head, worker = plan_hosts(pair({"ray_start_args": ["--num-cpus", "1"]}, {"ray_start_args": ["--num-cpus", "1"]}),
                              resolve=hub)
    model_dir = head.model_dir
    def common(address):
        env = {"GLOO_SOCKET_IFNAME": "enp1s0f0np0", "MASTER_ADDR": "192.168.100.1", "NCCL_SOCKET_IFNAME": "enp1s0f0np0",
               "RAY_ADDRESS": "192.168.100.1:6379", "RAY_AUTH_MODE": "token",
               "RAY_AUTH_TOKEN_PATH": "/etc/sparkfleet/ray.token", "RAY_memory_monitor_refresh_ms": "0",
               "TP_SOCKET_IFNAME": "enp1s0f0np0", "UCX_NET_DEVICES": "enp1s0f0np0", "VLLM_HOST_IP": address}
        return ["/usr/bin/docker", "run", "--rm", "--name", "sparkfleet-ray", "--gpus", "all", "--ipc", "host",
                "--network", "host", "--shm-size", "1g", *[a for k, v in env.items() for a in ("--env", f"{k}={v}")],
                "--volume", "/var/lib/sparkfleet/ray:/tmp/ray",
                "--volume", "/etc/sparkfleet/ray.token:/etc/sparkfleet/ray.token:ro",
                "--volume", f"{model_dir}:{model_dir}:ro", "--entrypoint", "ray", "vllm/vllm-openai:v0.33.0",
                "start", "--block"]
    assert _exec_start(head.render_ray_unit()) == common("192.168.100.1") + [
        "--node-ip-address", "192.168.100.1", "--num-gpus", "1", "--disable-usage-stats",
        "--head", "--port", "6379", "--include-dashboard", "false", "--num-cpus", "1"]
    worker_unit = worker.render_ray_unit()
    assert _exec_start(worker_unit) == common("192.168.100.2") + [
        "--node-ip-address", "192.168.100.2", "--num-gpus", "1", "--disable-usage-stats",
        "--address", "192.168.100.1:6379", "--num-cpus", "1"]
    lines = worker_unit.splitlines()
    assert lines[0] == f"# Managed by sparkfleet: release {worker.chat_release_id}. Local edits are overwritten."
    description = f"Description=Ray worker of tensor-parallel group spark-1+spark-2 (release {worker.chat_release_id})"
    assert description in lines
    assert {"Restart=always", "RestartSec=5", "ExecStartPre=-/usr/bin/docker rm -f sparkfleet-ray",
            "ExecStop=/usr/bin/docker stop --time 30 sparkfleet-ray", "WantedBy=multi-user.target"} <= set(lines)
    with pytest.raises(ValueError, match="spark-3 is a single host: it runs no Ray unit"):
        plan_hosts([("spark-3", host_data())], resolve=hub)[0].render_ray_unit()


def test_the_ray_unit_quotes_its_values_for_systemd():
    odd = ["--resources", '{"fabric": 1}', "--labels=50%"]
    head = plan_hosts(pair({"ray_start_args": odd}, {"ray_start_args": odd}), resolve=hub)[0]
    text = head.render_ray_unit()
    assert '    --resources "{\\"fabric\\": 1}" \\' in text.splitlines() and "    --labels=50%%" in text.splitlines()
    assert _exec_start(text)[-3:] == odd


def test_the_heads_vllm_unit_binds_to_its_ray_node():
    head, _ = plan_hosts(pair(), resolve=hub)
    lines = head.render_unit().splitlines()
    assert {"Wants=sparkfleet-ray.service", "After=sparkfleet-ray.service",
            "BindsTo=sparkfleet-ray.service"} <= set(lines)
    argv = _exec_start(head.render_unit())
    assert argv[argv.index("vllm/vllm-openai:v0.33.0") - 6:][:6] == [
        "--volume", "/var/lib/sparkfleet/ray:/tmp/ray", "--pid", "host",
        "--volume", "/etc/sparkfleet/ray.token:/etc/sparkfleet/ray.token:ro"]
    single = plan_hosts([("spark-3", host_data())], resolve=hub)[0].render_unit()
    assert "sparkfleet-ray" not in single and "/tmp/ray" not in single


# --- Ray's token auth ------------------------------------------------------------------------------------------

SECRETS = {"api_key": "sk-the-api-key-0123456789", "sim_engine_knobs": True,
           "engine_env": {"SIM_TOKENS_PER_S": "50", "SIM_SECRET": "s3cr3t-env"}}


def test_the_ray_units_turn_on_token_auth_and_carry_neither_the_api_key_nor_engine_env():
    for plan in plan_hosts(pair(SECRETS, SECRETS), resolve=hub):
        unit = plan.render_ray_unit()
        argv = _exec_start(unit)
        env = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--env"]
        assert {"RAY_AUTH_MODE=token", "RAY_AUTH_TOKEN_PATH=/etc/sparkfleet/ray.token"} <= set(env), env
        assert "/etc/sparkfleet/ray.token:/etc/sparkfleet/ray.token:ro" in argv
        assert "--env-file" not in argv and "engine.env" not in unit
        for secret in ("sk-the-api-key-0123456789", "s3cr3t-env", "SIM_SECRET", "VLLM_API_KEY", "RAY_AUTH_TOKEN="):
            assert secret not in unit, secret
    head = plan_hosts(pair(SECRETS, SECRETS), resolve=hub)[0]
    assert {"RAY_AUTH_MODE=token", "RAY_AUTH_TOKEN_PATH=/etc/sparkfleet/ray.token"} <= set(
        head.render_engine_env().splitlines())  # the head's engine joins the cluster as a driver


def test_plan_json_shows_each_members_ray_unit_and_environment_never_the_token(tmp_path, capsys, monkeypatch):
    from sparkfleet.controller.fleet_token import ray_token
    monkeypatch.setattr("sparkfleet.controller.inventory.hub_resolver", never)
    token = ray_token("spark-1+spark-2")  # made on the controller before the plan, as a converge leaves it
    path = _inventory(tmp_path, PAIR_INVENTORY)
    assert cli.main(["plan", path, "--offline", "--json"]) == 0
    out = capsys.readouterr().out
    assert token not in out
    head, worker = json.loads(out)["hosts"]
    for host, address in ((head, "192.168.100.1"), (worker, "192.168.100.2")):
        assert host["ray_env"] == {
            "GLOO_SOCKET_IFNAME": "enp1s0f0np0", "MASTER_ADDR": "192.168.100.1", "NCCL_SOCKET_IFNAME": "enp1s0f0np0",
            "RAY_ADDRESS": "192.168.100.1:6379", "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": "/etc/sparkfleet/ray.token", "RAY_memory_monitor_refresh_ms": "0",
            "TP_SOCKET_IFNAME": "enp1s0f0np0", "UCX_NET_DEVICES": "enp1s0f0np0", "VLLM_HOST_IP": address}
        assert "--env RAY_AUTH_MODE=token" in host["ray_unit"]
    single = plan_hosts([("spark-3", host_data())], resolve=hub)[0].to_dict()
    assert single["ray_env"] is None and "RAY_AUTH" not in json.dumps(single)


def test_a_new_ray_token_changes_no_release_and_no_unit():
    from sparkfleet.controller.fleet_token import ray_token, token_path, ray_token_name
    first = ray_token("spark-1+spark-2")
    before = [(p.release_id, p.render_ray_unit(), p.render_engine_env()) for p in plan_hosts(pair(), resolve=hub)]
    token_path(ray_token_name("spark-1+spark-2")).unlink()  # rotation: the controller's file deleted
    second = ray_token("spark-1+spark-2")
    after = [(p.release_id, p.render_ray_unit(), p.render_engine_env()) for p in plan_hosts(pair(), resolve=hub)]
    assert first != second and before == after
    assert not any(t in repr(before) for t in (first, second))


def test_each_group_has_its_own_ray_token_kept_root_only_on_the_controller():
    import os
    from sparkfleet.controller.fleet_token import fleet_token, ray_token, ray_token_name, token_path
    pair_token = ray_token("spark-1+spark-2")
    assert ray_token("spark-1+spark-2") == pair_token  # every member of the group gets the same one
    assert ray_token("spark-3+spark-4") != pair_token != fleet_token()
    assert ray_token_name("spark-1+spark-2") == "ray-spark-1+spark-2.token"
    assert ray_token_name("../etc/x+y") == "ray-.._etc_x+y.token"  # a path never leaves the cache directory
    path = token_path(ray_token_name("spark-1+spark-2"))
    assert os.stat(path).st_mode & 0o777 == 0o600 and path.parent == token_path().parent


def test_a_ray_token_file_readable_by_others_is_refused_naming_the_fix():
    import os
    from sparkfleet.controller.fleet_token import FleetTokenError, ray_token, ray_token_name, token_path
    ray_token("spark-1+spark-2")
    path = token_path(ray_token_name("spark-1+spark-2"))
    os.chmod(path, 0o644)
    with pytest.raises(FleetTokenError) as caught:
        ray_token("spark-1+spark-2")
    assert str(caught.value) == (f"{path}: the Ray token of spark-1+spark-2's file is readable by others (mode 644): "
                                 f"run `chmod 600 {path}`")


@pytest.mark.parametrize("env", [{"RAY_AUTH_MODE": "disabled"}, {"RAY_AUTH_TOKEN": "guessable"},
                                 {"RAY_AUTH_TOKEN_PATH": "/tmp/t"}])
def test_engine_env_cannot_turn_off_or_replace_the_groups_ray_token(env):
    found = problems_of(pair({"engine_env": env}), resolve=never)
    [key] = env
    assert (f"spark-1: setting `engine_env` sets {key} on a member of spark-1+spark-2: sparkfleet turns on Ray's "
            f"token auth with the group's own token (made on the controller, shipped as /etc/sparkfleet/ray.token): "
            f"remove it") in found
    assert not any(value in " ".join(found) for value in env.values())


def _ray_check_in_a_container(tmp_path, version: str, auth: bool | None) -> subprocess.CompletedProcess:
    """sparkfleet-ray-check's in-container script against a stand-in `ray` package: `auth` None is a Ray without
    token auth (older than 2.52), else whether RAY_AUTH_MODE=token is in force."""
    from .test_pair_preflight import rc
    package = tmp_path / "ray"
    package.mkdir()
    (package / "__init__.py").write_text(
        f"__version__ = {version!r}\ndef init(**kwargs): pass\n"
        "def nodes(): return [{'Alive': True, 'NodeManagerAddress': '10.0.0.1', 'Resources': {'GPU': 1.0}}]\n")
    if auth is not None:
        (package / "_raylet.py").write_text(
            "class AuthenticationMode:\n    DISABLED, TOKEN = 0, 1\n"
            f"def get_authentication_mode(): return AuthenticationMode.{'TOKEN' if auth else 'DISABLED'}\n")
    return subprocess.run([sys.executable, "-c", rc.IN_CONTAINER, "10.0.0.1:6379", "10.0.0.1"],
                          env={**os.environ, "PYTHONPATH": str(tmp_path)}, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("version,auth", [("2.51.0", None), ("2.60.0", False)])
def test_the_ray_check_refuses_a_ray_without_token_auth(tmp_path, version, auth):
    done = _ray_check_in_a_container(tmp_path, version, auth)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip() == (f"Ray {version} here runs without token auth (anyone on the fabric could join): "
                                   f"sparkfleet needs Ray >= 2.52 in engine_image, with RAY_AUTH_MODE=token (the Ray "
                                   f"unit sets it)")


def test_the_ray_check_reads_the_nodes_where_token_auth_is_on(tmp_path):
    from .test_pair_preflight import rc
    done = _ray_check_in_a_container(tmp_path, "2.60.0", True)
    assert done.returncode == 0, done.stderr
    assert rc.read_nodes(done.stdout) == [{"alive": True, "address": "10.0.0.1", "gpus": 1.0}]


# --- fit for N GPUs ---------------------------------------------------------------------------------------------


def test_the_kv_cache_per_gpu_splits_the_kv_heads_or_replicates_one():
    config = recipe(BIG).model.config
    # 2 x 94 layers x KV heads per GPU x 128 x 2 bytes: 4, 2, 1 and (4 heads cannot split 8 ways) still 1
    assert [kv_bytes_per_token(config, "auto", n) for n in (1, 2, 4, 8)] == [192_512, 96_256, 48_128, 48_128]


def test_the_big_model_needs_two_sparks_and_fits_two():
    config = recipe(BIG).model.config
    one = fit_report(config, BIG_WEIGHTS, max_model_len=40960)
    assert one.kv_memory_bytes == 112_640_000_000 - BIG_WEIGHTS - 3_221_225_472 == -15_112_428_544
    assert (one.fits, one.sparks_needed, one.weights_per_gpu_bytes) == (False, 2, BIG_WEIGHTS)
    assert check_fit(one) == (
        "the model does not fit one Spark at gpu_memory_utilization=0.88 (weights 116.0 GiB, budget 104.9 GiB per "
        "Spark, max_model_len=40960): needs 2 Sparks: set tensor_parallel_hosts with 2 hosts and "
        "tensor_parallel_size = 2")
    two = fit_report(config, BIG_WEIGHTS, max_model_len=40960, tensor_parallel_size=2)
    assert two.weights_per_gpu_bytes == 62_265_601_536 and two.budget_bytes == 112_640_000_000
    # 112,640,000,000 - 62,265,601,536 - 3,221,225,472
    assert two.kv_memory_bytes == 47_153_172_992 and two.kv_bytes_per_token == 96_256
    # 40,960 x 96,256 = 3,942,645,760 per sequence: 11.96; 8,192 x 96,256 = 788,529,152: 59.8
    assert (two.fits, two.seqs_at_max_model_len, two.seqs_at_8192, two.largest_context) == (True, 11, 59, 40960)
    assert check_fit(two) is None


def test_a_group_too_small_for_its_model_is_told_how_many_it_needs():
    config = recipe(BIG).model.config
    # 0.5 x 128e9 = 64e9 per member: half the weights and the reserve (65.5e9) do not fit; a quarter does
    # (64e9 - 31,132,800,768 - 3,221,225,472 = 29,645,973,760 >= 40,960 x 48,128)
    two = fit_report(config, BIG_WEIGHTS, gpu_memory_utilization=0.5, max_model_len=40960, tensor_parallel_size=2)
    assert two.sparks_needed == 4
    assert check_fit(two) == (
        "the model does not fit 2 Sparks at gpu_memory_utilization=0.5 (weights 116.0 GiB (58.0 GiB per GPU on 2), "
        "budget 59.6 GiB per Spark, max_model_len=40960): needs 4 Sparks: set tensor_parallel_hosts with 4 hosts and "
        "tensor_parallel_size = 4")


def test_one_spark_figures_are_unchanged_by_tensor_parallel_support():
    one = fit_report(qwen35_config(), 35_000_000_000)
    assert (one.tensor_parallel_size, one.weights_per_gpu_bytes, one.sparks_needed) == (1, 35_000_000_000, 1)
    assert one.kv_bytes_per_token == 20_480


# --- the plan command ---------------------------------------------------------------------------------------------


def _inventory(tmp_path, text: str) -> str:
    path = tmp_path / "fleet.py"
    path.write_text(text)
    return str(path)


def test_plan_refuses_the_big_model_on_one_spark_offline(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sparkfleet.controller.inventory.hub_resolver", never)
    path = _inventory(tmp_path, f"sparks = [('spark-x', {{'ssh_hostname': '10.0.0.9', 'recipe': {BIG!r}}})]\n")
    assert cli.main(["plan", path, "--offline"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[1].startswith("spark-x: the model does not fit one Spark")
    assert err.splitlines()[1].endswith("needs 2 Sparks: set tensor_parallel_hosts with 2 hosts and "
                                        "tensor_parallel_size = 2")


PAIR_INVENTORY = f"""
_group = {{"recipe": {BIG!r}, "tensor_parallel_hosts": ["spark-1", "spark-2"], "tensor_parallel_size": 2}}
pair = ([("spark-1", {{"ssh_hostname": "10.0.0.1", "fabric_address": "192.168.100.1"}}),
         ("spark-2", {{"ssh_hostname": "10.0.0.2", "fabric_address": "192.168.100.2"}})], _group)
"""


def test_plan_shows_the_big_model_fitting_a_pair(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sparkfleet.controller.inventory.hub_resolver", never)
    path = _inventory(tmp_path, PAIR_INVENTORY)
    assert cli.main(["plan", path, "--offline", "--json"]) == 0
    head, worker = json.loads(capsys.readouterr().out)["hosts"]
    assert (head["role"], worker["role"]) == ("head", "worker")
    assert head["group"]["name"] == worker["group"]["name"] == "spark-1+spark-2"
    assert worker["unit"] is None and "--head" in head["ray_unit"]
    assert "--address 192.168.100.1:6379" in worker["ray_unit"]
    for host in (head, worker):
        assert host["fit"]["fits"] and host["fit"]["tensor_parallel_size"] == 2
        assert host["fit"]["weights_per_gpu_bytes"] == 62_265_601_536 and host["fit"]["kv_bytes_per_token"] == 96_256
    assert cli.main(["plan", path, "--offline"]) == 0
    out = " ".join(line.strip(" │") for line in capsys.readouterr().out.splitlines())
    assert "spark-1+spark-2 (2 Sparks, tensor parallel over Ray)" in out
    assert ("budget 104.9 GiB = weights 58.0 (116.0 / 2 GPUs; recipe qwen3-235b-a22b-gptq-int4, offline) "
            "+ reserve 3.0 + KV 43.9 GiB") in out
    assert "96,256 B/token" in out and "worker: a Ray node; the head serves" in out
