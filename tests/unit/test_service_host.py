"""Service hosts (only in the groups front_door and/or monitoring): their role from the groups, their own
preflight (OS, memory, disk, the Sparks within reach), the plans of a mixed inventory, and the converge that runs
no Spark stage on them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sparkfleet.contract.monitoring import SERVICE_ROLE, is_service_host
from sparkfleet.contract.settings import GROUPS_KEY, SettingsError, parse_settings
from sparkfleet.roles.front_door import plan as fd_plan
from sparkfleet.controller.inventory import spark_hosts
from sparkfleet.host.facts import Unreadable, parse_os_release, parse_tcp_reach
from sparkfleet.host.preflight import ServiceFacts, service_preflight_problems
from sparkfleet.release.plan import plan_hosts

from .helpers import KEY, host_data
from . import test_run

stand_ins = test_run.stand_ins  # the converge's stages replaced by stand-ins (a fixture)

GIB = 1024**3
USERS = {"alice": "alice-key-0123456789abcdef"}


@pytest.mark.parametrize("groups, service", [
    (["front_door"], True), (["monitoring"], True), (["front_door", "monitoring"], True),
    (["all", "front_door"], True), ([], False), (["all"], False), (["sparks"], False),
    (["sparks", "front_door"], False),  # a Spark that also runs the front door is a Spark
])
def test_the_role_comes_from_the_groups(groups, service):
    assert is_service_host(groups) is service


@pytest.mark.parametrize("groups, service", [
    ({"sparks": ["a", "b"], "front_door": ["d"], "monitoring": ["d"]}, {"d"}),
    ({"sparks": ["a", "b"], "front_door": ["a"]}, set()),  # a Spark's own front door: every host holds `sparks`
    ({"sparks": ["a"], "front_door": ["a"]}, set()),  # one host in every group
    ({"front_door": ["d"]}, {"d"}),  # an inventory of one service host
    ({"sparks": ["a", "b", "d"], "front_door": ["d"]}, set()),  # d is in `sparks`: a Spark
])
def test_the_role_comes_from_the_inventory_files_groups_not_the_one_pyinfra_adds(tmp_path, groups, service):
    """pyinfra adds a group named after the inventory file, holding every host: it makes no host a Spark."""
    from sparkfleet.controller.inventory import load_hosts

    path = tmp_path / "office.py"
    path.write_text("".join(f"{name} = [(h, {{'ssh_hostname': '10.0.0.1'}}) for h in {members!r}]\n"
                            for name, members in groups.items()))
    found = {name for name, data in load_hosts(str(path)) if is_service_host(data[GROUPS_KEY])}
    assert found == service


def mixed(door_data=None, **spark_data):
    """Offline plans of two Sparks and door-1, a service host in front_door and monitoring."""
    spark = {"api_host": "0.0.0.0", "api_key": KEY, "front_door_users": USERS, "front_door_allow_http": True,
             "backend_key_in_clear": True, **spark_data}
    hosts = [(name, host_data(**spark, lan_address=f"10.0.0.{n}", **{GROUPS_KEY: ["sparks"]}))
             for n, name in ((1, "spark-1"), (2, "spark-2"))]
    door = host_data(front_door_users=USERS, front_door_allow_http=True, lan_address="10.0.0.9", backend_key_in_clear=True,
                     **{GROUPS_KEY: ["front_door", "monitoring"], **(door_data or {})})
    return hosts + [("door-1", door)]


def test_a_mixed_inventory_plans_the_service_host_minimal_and_the_sparks_as_before():
    plans = plan_hosts(mixed(), resolve=False)
    assert [p.name for p in plans] == ["spark-1", "spark-2", "door-1"]  # inventory order
    door = plans[-1]
    assert (door.role, door.is_service, door.runs_engine, door.units) == (SERVICE_ROLE, True, False, [])
    assert (door.manifest, door.release_id, door.group, door.services) == (None, None, None, [])
    assert door.to_dict() == {"name": "door-1", "role": "service", "release_id": None, "lan_address": "10.0.0.9"}
    assert [p.role for p in plans[:2]] == ["single", "single"] and all(p.engine_args for p in plans[:2])


def test_a_service_host_needs_no_engine_setting_that_a_spark_would_be_refused_for():
    """No api_key, an unknown model, too little memory for it: nothing of a release is checked on door-1."""
    plans = plan_hosts(mixed({"model_repo": "nobody/unknown", "host_memory_gb": 1, "api_key": None}), resolve=False)
    assert plans[-1].role == SERVICE_ROLE
    with pytest.raises(SettingsError, match="door-1: setting `front_door_port` = 0"):
        plan_hosts(mixed({"front_door_port": 0}), resolve=False)  # its own settings are still typed


def test_the_front_door_on_a_service_host_has_the_sparks_as_backends():
    plans = {p.name: p for p in plan_hosts(mixed(), resolve=False)}
    door = fd_plan.front_door_plan("door-1", plans)
    assert door.backends == (fd_plan.Backend("spark-1", "10.0.0.1", 8000), fd_plan.Backend("spark-2", "10.0.0.2", 8000))
    assert "door-1" not in door.config()


def test_readers_of_engines_skip_the_service_hosts():
    assert [name for name, _ in spark_hosts(mixed())] == ["spark-1", "spark-2"]


def facts(**over):
    base = dict(os_release={"ID": "debian"}, meminfo={"MemTotal": 2 * 1024**2}, free_bytes=10 * GIB,
                python="3.11", reach={"10.0.0.1:8000": "ok", "10.0.0.2:8000": "refused"})
    return ServiceFacts(**{**base, **over})


def problems(data=None, **over):
    return service_preflight_problems("door-1", parse_settings("door-1", host_data(**(data or {}))), facts(**over))


def test_a_fit_service_host_passes_and_a_refused_port_counts_as_reached():
    """A refusal is the Spark's own answer (its guard not up yet on a first converge): the path is there."""
    assert problems() == []
    assert problems(os_release={"ID": "ubuntu", "ID_LIKE": "debian"}) == []
    assert problems(os_release={"ID": "linuxmint", "ID_LIKE": "ubuntu debian"}) == []


def test_low_memory_is_one_line_naming_the_host_and_the_fix():
    assert problems(meminfo={"MemTotal": 512 * 1024}) == [
        "door-1: memory (MemTotal): found 0.5 GiB, required >= 1 GiB: use a host with more memory, or lower "
        "service_min_memory_gib"]
    assert problems({"service_min_memory_gib": 0.25}, meminfo={"MemTotal": 512 * 1024}) == []


def test_an_unreachable_spark_is_one_line_naming_it_and_the_fix():
    assert problems(reach={"10.0.0.1:8000": "ok", "10.0.0.2:8000": "unreachable"}) == [
        "door-1: cannot reach the Spark API at 10.0.0.2:8000 (TCP, no answer in 3 s): check that the Spark is up "
        "and on this LAN, its lan_address is right, and no firewall between them drops the port"]


def test_other_os_low_disk_and_no_python_are_refused_each_once():
    found = problems(os_release={"ID": "fedora", "ID_LIKE": "rhel"}, free_bytes=GIB, python=None)
    assert [line.split(":")[1] for line in found] == [" operating system", " free disk at /", " python3"]
    assert all(line.startswith("door-1: ") for line in found)
    assert "found 1.0 GiB, required >= 2 GiB" in found[1]


def test_unreadable_host_output_stops_the_host_before_any_comparison():
    found = problems(meminfo=Unreadable("/proc/meminfo", "no MemTotal line"))
    assert found == ["door-1: /proc/meminfo: no MemTotal line: fix or remove it by hand; sparkfleet changes nothing "
                     "on doubt"]


def test_hostile_reach_and_os_output_is_data():
    """Only the targets asked about, with a known verdict, count; anything else the host prints is ignored."""
    targets = ["10.0.0.1:8000", "10.0.0.2:8000"]
    lines = ["10.0.0.1:8000 ok", "10.0.0.2:8000 yes", "10.0.0.3:8000 ok", "10.0.0.2:8000 ok; rm -rf /", ""]
    assert parse_tcp_reach(lines, targets) == {"10.0.0.1:8000": "ok", "10.0.0.2:8000": "unreachable"}
    assert parse_tcp_reach([], targets) == {t: "unreachable" for t in targets}
    assert parse_os_release(['ID="debian"', "ID_LIKE=", "NAME=$(reboot)", "garbage"]) == {"ID": "debian",
                                                                                        "ID_LIKE": ""}


def test_the_reach_probe_quotes_every_target_and_drops_what_is_not_an_address():
    from sparkfleet.host.facts import TcpReach

    fact = TcpReach()
    command = fact.command([("10.0.0.1", 8000), ("spark-2.lan", 8000), ("x; reboot", 8000), ("$(id)", 1)])
    text = command.get_raw_value()
    assert fact.targets == ["10.0.0.1:8000", "spark-2.lan:8000"]
    assert "reboot" not in text and "$(id)" not in text
    assert "bash -c ': < /dev/tcp/$0/$1' 10.0.0.1 8000 2>&1" in text


def test_the_reach_probe_tells_a_listener_from_a_refusal_on_loopback():
    import socket
    import subprocess

    from sparkfleet.host.facts import TcpReach

    with socket.socket() as listening, socket.socket() as closed:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        closed.bind(("127.0.0.1", 0))  # bound, not listening: a connection is refused
        ports = [listening.getsockname()[1], closed.getsockname()[1]]
        fact = TcpReach()
        command = fact.command([("127.0.0.1", port) for port in ports]).get_raw_value()
        out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=20).stdout
    assert fact.process(out.splitlines()) == {f"127.0.0.1:{ports[0]}": "ok", f"127.0.0.1:{ports[1]}": "refused"}


def test_converge_of_a_service_host_runs_its_preflight_and_roles_only(stand_ins, monkeypatch):
    from pyinfra.context import ctx_host

    import sparkfleet.tasks as tasks

    calls, _, results, _ = stand_ins
    door = SimpleNamespace(name="door-1", role=SERVICE_ROLE)
    results["service_preflight"] = "facts"
    monkeypatch.setattr(tasks, "plans", lambda state: {"door-1": door})
    with ctx_host.use(SimpleNamespace(name="door-1", groups=["front_door", "monitoring"])):
        tasks.converge(door)
    assert calls == {"service_preflight": {"plan": door}, "guard": {"plan": door},
                     "front_door": {"plan": door, "plans": {"door-1": door}},
                     "monitoring": {"plan": door, "plans": {"door-1": door}, "groups": {}},
                     "no_backup": {}, "no_backup_target": {}}  # after its roles: its usage's backup, here none

    calls.clear()
    results["service_preflight"] = None  # not fit: nothing after its preflight
    with ctx_host.use(SimpleNamespace(name="door-1", groups=["front_door"])):
        tasks.converge(door)
    assert calls == {"service_preflight": {"plan": door}}
