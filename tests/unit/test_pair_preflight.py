"""A tensor-parallel group's host side: the fabric facts (and what a hostile host prints), the pair preflight's
one line per problem, the Ray check helper (files/sparkfleet-ray-check) and the Ray gate operation."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pyinfra_testing.operations import make_operation_tests

from sparkfleet.host.facts import (
    FABRIC_ABSENT,
    FabricInterface,
    FabricLink,
    FabricReach,
    RayCheck,
    Unreadable,
    parse_fabric_link,
    parse_fabric_reach,
    parse_ray_check,
)
from sparkfleet.host.nvidia_smi import GpuReport
from sparkfleet.host.preflight import MemberFacts, pair_problems
from sparkfleet.release.group import TensorParallelGroup

ROOT = Path(__file__).resolve().parents[2]
RAY_CHECK = ROOT / "files" / "sparkfleet-ray-check"
IFACE = "enp1s0f0np0"
PAIR = TensorParallelGroup(("spark-1", "spark-2"), ("10.0.0.1", "10.0.0.2"), IFACE, 9000, 6379)

TestRayJoined = make_operation_tests("sparkfleet.tasks", "health.ray_joined",
                                     Path(__file__).parent / "operations" / "ray_joined")


def ip_json(**link) -> list[str]:
    """`ip -j addr show dev enp1s0f0np0` of a healthy port (one line, as iproute2 prints it), with overrides."""
    good = {"ifindex": 4, "ifname": IFACE, "flags": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"], "mtu": 9000,
            "qdisc": "mq", "operstate": "UP", "group": "default", "link_type": "ether",
            "addr_info": [{"family": "inet", "local": "10.0.0.2", "prefixlen": 24, "scope": "global"},
                          {"family": "inet6", "local": "fe80::1", "prefixlen": 64, "scope": "link"}]}
    return [json.dumps([{**good, **link}])]


# --- the fabric interface fact ---

def test_a_healthy_port_reads_up_with_its_mtu_and_ipv4_addresses():
    assert parse_fabric_link(ip_json(), IFACE) == FabricLink(IFACE, True, admin_up=True, carrier=True, mtu=9000,
                                                             addresses=("10.0.0.2",))


def test_a_missing_interface_is_not_unreadable():
    assert parse_fabric_link([FABRIC_ABSENT], IFACE) == FabricLink(IFACE, exists=False)


def test_down_and_no_carrier_are_told_apart():
    down = parse_fabric_link(ip_json(flags=["BROADCAST", "MULTICAST"], operstate="DOWN"), IFACE)
    assert (down.admin_up, down.carrier) == (False, False)
    no_cable = parse_fabric_link(ip_json(flags=["NO-CARRIER", "BROADCAST", "MULTICAST", "UP"], operstate="DOWN"),
                                 IFACE)
    assert (no_cable.admin_up, no_cable.carrier) == (True, False)
    # a driver that reports no operstate: UP and LOWER_UP decide
    assert parse_fabric_link(ip_json(operstate="UNKNOWN"), IFACE).carrier is True


@pytest.mark.parametrize("lines, problem", [
    (['Option "-j" is unknown, try "ip -help".'],
     "printed 'Option \"-j\" is unknown, try \"ip -help\".', not JSON (iproute2 too old for -j?)"),
    (["{not json"], "printed '{not json', not JSON (iproute2 too old for -j?)"),
    (['{"ifname": "enp1s0f0np0"}'], "printed '{\"ifname\": \"enp1s0f0np0\"}', not one object for enp1s0f0np0"),
    (["[]"], "printed '[]', not one object for enp1s0f0np0"),
    (ip_json(mtu=10**12), "`mtu` reads '1000000000000', not an MTU Linux allows (68..65536)"),
    (ip_json(mtu=True), "`mtu` reads 'True', not an MTU Linux allows (68..65536)"),
    (ip_json(mtu="9000"), "`mtu` reads '9000', not an MTU Linux allows (68..65536)"),
    (ip_json(mtu=-1), "`mtu` reads '-1', not an MTU Linux allows (68..65536)"),
    (ip_json(flags="UP,LOWER_UP"), "`flags` is not a list of names"),
    (ip_json(addr_info={"family": "inet"}), "`addr_info` is not a list of objects"),
    (ip_json(addr_info=[{"family": "inet", "local": "10.0.0.2; reboot"}]),
     "an inet address reads '10.0.0.2; reboot', not an IPv4 address"),
    (ip_json(addr_info=[{"family": "inet", "local": "010.000.000.002"}]),
     "an inet address reads '010.000.000.002', not an IPv4 address"),
])
def test_hostile_or_broken_ip_output_is_unreadable(lines, problem):
    assert parse_fabric_link(lines, IFACE) == Unreadable(f"ip -j addr show dev {IFACE}", problem)


def test_another_interfaces_answer_is_not_taken_for_the_fabric():
    found = parse_fabric_link(ip_json(ifname="enp1s0f0np0; rm -rf /"), IFACE)
    assert isinstance(found, Unreadable) and found.problem.endswith("not one object for enp1s0f0np0")
    two = [json.dumps(json.loads(ip_json()[0]) * 2)]
    assert isinstance(parse_fabric_link(two, IFACE), Unreadable)


def test_a_huge_answer_is_not_believed():
    found = parse_fabric_link(["[" + " " * 1_000_001 + "]"], IFACE)
    assert found == Unreadable(f"ip -j addr show dev {IFACE}", "printed 1000003 characters, more than one interface has")


def test_the_interface_name_is_quoted_where_it_reaches_the_shell():
    command = FabricInterface().command(interface="x'; reboot").get_raw_value()
    assert command == ("if [ -e '/sys/class/net/x'\"'\"'; reboot' ]; then ip -j addr show dev 'x'\"'\"'; reboot' 2>&1; "
                       "else echo @@sparkfleet-no-interface ; fi")


# --- reachability over the fabric ---

def test_reach_reads_one_verdict_per_address_asked():
    lines = ["10.0.0.2 ok", "10.0.0.3 failed"]
    assert parse_fabric_reach(lines, ["10.0.0.2", "10.0.0.3"]) == {"10.0.0.2": True, "10.0.0.3": False}


def test_reach_ignores_lines_it_did_not_ask_for_and_counts_silence_as_unreachable():
    lines = ["10.0.0.9 ok", "10.0.0.2 ok; rm -rf /", "10.0.0.2  ok", "garbage", ""]
    assert parse_fabric_reach(lines, ["10.0.0.2", "10.0.0.3"]) == {"10.0.0.2": False, "10.0.0.3": False}


def test_reach_without_ping_is_unreadable_not_unreachable():
    assert parse_fabric_reach(["@@sparkfleet-no-ping"], ["10.0.0.2"]) == Unreadable(
        "ping", "not installed: apt-get install iputils-ping")


def test_reach_pings_out_of_the_fabric_port_and_only_ipv4_addresses_reach_the_shell():
    fact = FabricReach()
    command = fact.command(interface=IFACE, addresses=["10.0.0.2", "10.0.0.3; reboot"]).get_raw_value()
    assert command == ("if ! command -v ping >/dev/null; then echo @@sparkfleet-no-ping ; exit 0; fi; "
                       "if ping -c 1 -W 2 -I enp1s0f0np0 10.0.0.2 >/dev/null 2>&1; then echo '10.0.0.2 ok' ; "
                       "else echo '10.0.0.2 failed' ; fi;")
    assert fact.process(["10.0.0.2 ok"]) == {"10.0.0.2": True}


# --- the Ray check fact ---

def test_ray_check_fact_reads_the_helpers_verdict():
    ok = json.dumps({"alive_nodes": 2, "gpus": [1, 1], "addresses": ["10.0.0.1", "10.0.0.2"], "missing": [],
                     "error": None})
    assert parse_ray_check(["some ray log line", ok]) == {"ok": True, "detail": "2 alive nodes, 1 GPU each"}
    short = json.dumps({"alive_nodes": 1, "gpus": [1], "addresses": ["10.0.0.1"],
                        "missing": ["spark-2 (10.0.0.2) is not an alive node in Ray's node list"], "error": None})
    assert parse_ray_check([short]) == {"ok": False,
                                        "detail": "spark-2 (10.0.0.2) is not an alive node in Ray's node list"}


@pytest.mark.parametrize("lines", [[], ["{}"], ["not json"], ['{"alive_nodes": 2, "missing": "none"}'],
                                   ['{"alive_nodes": true, "missing": []}'], ['{"alive_nodes": 2, "missing": [1]}'],
                                   ["[]"]])
def test_ray_check_fact_takes_anything_else_for_not_joined(lines):
    assert parse_ray_check(lines)["ok"] is False


def test_ray_check_fact_quotes_every_argument():
    command = RayCheck().command(address="10.0.0.1:6379", node_ip="10.0.0.2",
                                 members={"spark-2": "10.0.0.2; reboot"}).get_raw_value()
    assert command == ("if [ -x /opt/sparkfleet/bin/sparkfleet-ray-check ]; then python3 "
                       "/opt/sparkfleet/bin/sparkfleet-ray-check --address 10.0.0.1:6379 --node-ip 10.0.0.2 "
                       "--member 'spark-2=10.0.0.2; reboot' 2>/dev/null; else echo '{}'; fi; true")


# --- the pair preflight ---

GB10 = GpuReport("NVIDIA GB10", "580.95.05", "13.0")


def member(address: str, peer: str, **overrides) -> MemberFacts:
    link = FabricLink(IFACE, True, admin_up=True, carrier=True, mtu=9000, addresses=(address,))
    return MemberFacts(**{"gpu": GB10, "link": link, "reach": {peer: True}, **overrides})


def pair(**workers) -> dict[str, MemberFacts]:
    """spark-1 (head) healthy; spark-2 with `workers` overrides."""
    return {"spark-1": member("10.0.0.1", "10.0.0.2"), "spark-2": member("10.0.0.2", "10.0.0.1", **workers)}


def down_link(**overrides) -> FabricLink:
    return FabricLink(IFACE, True, **{"admin_up": True, "carrier": True, "mtu": 9000, "addresses": ("10.0.0.2",),
                                      **overrides})


def test_a_healthy_pair_passes():
    assert pair_problems(PAIR, pair()) == []


def test_the_mtu_fallback_is_one_line_with_the_fix():
    assert pair_problems(PAIR, pair(link=down_link(mtu=1500))) == [
        "spark-2: fabric interface enp1s0f0np0: MTU 1500, required 9000: set the MTU to 9000 on enp1s0f0np0 and "
        "persist it (netplan); it falls back to 1500 after some reboots"]


def test_a_port_that_is_down_is_one_line_not_also_two_unreachable_ones():
    facts = pair(link=down_link(admin_up=False, carrier=False), reach={"10.0.0.1": False})
    facts["spark-1"] = member("10.0.0.1", "10.0.0.2", reach={"10.0.0.2": False})
    assert pair_problems(PAIR, facts) == [
        "spark-2: fabric interface enp1s0f0np0: down: `ip link set enp1s0f0np0 up` and persist it (netplan)"]


def test_no_carrier_a_missing_port_and_a_missing_address_each_say_so():
    assert pair_problems(PAIR, pair(link=down_link(carrier=False))) == [
        "spark-2: fabric interface enp1s0f0np0: up but no link (no carrier): check the cable and the peer's port"]
    assert pair_problems(PAIR, pair(link=FabricLink(IFACE, exists=False))) == [
        "spark-2: fabric interface enp1s0f0np0: not found on the host: cable the ConnectX-7 port and set "
        "fabric_interface to its name (`ip link` lists them)"]
    assert pair_problems(PAIR, pair(link=down_link(addresses=("10.0.0.7",)))) == [
        "spark-2: fabric interface enp1s0f0np0: has 10.0.0.7, not its fabric_address 10.0.0.2: add 10.0.0.2 to "
        "enp1s0f0np0 (netplan) or correct fabric_address"]
    assert pair_problems(PAIR, pair(link=down_link(addresses=()))) == [
        "spark-2: fabric interface enp1s0f0np0: has no IPv4 address, not its fabric_address 10.0.0.2: add 10.0.0.2 "
        "to enp1s0f0np0 (netplan) or correct fabric_address"]


def test_every_problem_of_a_member_is_its_own_line():
    found = pair_problems(PAIR, pair(link=down_link(admin_up=False, mtu=1500, addresses=())))
    assert [line.split(": ")[2].split(" ")[0] for line in found] == ["down", "has", "MTU"]


def test_a_one_way_failure_names_the_member_that_cannot_reach():
    assert pair_problems(PAIR, pair(reach={"10.0.0.1": False})) == [
        "spark-2: cannot reach spark-1 at 10.0.0.1 over enp1s0f0np0 (ping): check the cable, both ports' addresses "
        "and a firewall"]


def test_a_wrong_mtu_still_checks_reachability():
    facts = pair(link=down_link(mtu=1500), reach={"10.0.0.1": False})
    assert [line.split(",")[0] for line in pair_problems(PAIR, facts)] == [
        "spark-2: fabric interface enp1s0f0np0: MTU 1500",
        "spark-2: cannot reach spark-1 at 10.0.0.1 over enp1s0f0np0 (ping): check the cable"]


def test_driver_and_cuda_must_match_the_head():
    assert pair_problems(PAIR, pair(gpu=GpuReport("NVIDIA GB10", "580.82.09", "13.1"))) == [
        "spark-2: NVIDIA driver 580.82.09, the head spark-1 has 580.95.05: every member of spark-1+spark-2 needs the "
        "same (upgrade the older one and reboot)",
        "spark-2: CUDA version 13.1, the head spark-1 has 13.0: every member of spark-1+spark-2 needs the same "
        "(upgrade the older one and reboot)"]


def test_the_kernel_must_match_the_heads():
    facts = {"spark-1": member("10.0.0.1", "10.0.0.2", kernel="6.17.0-1032-nvidia"),
             "spark-2": member("10.0.0.2", "10.0.0.1", kernel="7.0.0-1019-nvidia")}
    assert pair_problems(PAIR, facts) == [
        "spark-2: kernel 7.0.0-1019-nvidia, the head spark-1 has 6.17.0-1032-nvidia: every member of spark-1+spark-2 "
        "needs the same (upgrade the older one and reboot)"]
    facts["spark-2"] = member("10.0.0.2", "10.0.0.1", kernel=None)  # not read: its own preflight says why
    assert pair_problems(PAIR, facts) == []


def test_a_member_without_a_driver_is_left_to_its_own_preflight():
    facts = pair(gpu=GpuReport(None, None, None, error="nvidia-smi: not found"), fit=False)
    assert pair_problems(PAIR, facts) == ["spark-2: failed its own preflight: no member of spark-1+spark-2 is changed"]


def test_a_member_that_could_not_be_read_stops_the_group():
    facts = pair()
    del facts["spark-2"]
    assert pair_problems(PAIR, facts) == [
        "spark-2: its facts could not be read (not connected?): no member of spark-1+spark-2 is changed"]


def test_unreadable_link_and_reach_are_lines_not_guesses():
    bad_link = Unreadable("ip -j addr show dev enp1s0f0np0", "printed '{', not JSON (iproute2 too old for -j?)")
    assert pair_problems(PAIR, pair(link=bad_link)) == [bad_link.line("spark-2")]
    no_ping = Unreadable("ping", "not installed: apt-get install iputils-ping")
    assert pair_problems(PAIR, pair(reach=no_ping)) == [
        "spark-2: ping: not installed: apt-get install iputils-ping: fix or remove it by hand; sparkfleet changes "
        "nothing on doubt"]


def test_a_group_of_three_checks_every_pair():
    trio = TensorParallelGroup(("a", "b", "c"), ("10.0.0.1", "10.0.0.2", "10.0.0.3"), IFACE, 9000, 6379)
    link = {n: FabricLink(IFACE, True, True, True, 9000, (a,)) for n, a in zip(trio.members, trio.addresses)}
    facts = {"a": MemberFacts(GB10, link["a"], {"10.0.0.2": True, "10.0.0.3": False}),
             "b": MemberFacts(GB10, link["b"], {"10.0.0.1": True, "10.0.0.3": True}),
             "c": MemberFacts(GB10, link["c"], {"10.0.0.1": True, "10.0.0.2": True})}
    assert [line.split(" over ")[0] for line in pair_problems(trio, facts)] == ["a: cannot reach c at 10.0.0.3"]


# --- files/sparkfleet-ray-check ---

def load_ray_check():
    loader = importlib.machinery.SourceFileLoader("sparkfleet_ray_check", str(RAY_CHECK))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


rc = load_ray_check()
NODES = [{"alive": True, "address": "10.0.0.1", "gpus": 1.0}, {"alive": True, "address": "10.0.0.2", "gpus": 1.0},
         {"alive": False, "address": "10.0.0.2", "gpus": 1.0}]
MEMBERS = {"spark-1": "10.0.0.1", "spark-2": "10.0.0.2"}


def test_read_nodes_takes_the_last_line_and_summarize_counts_the_alive():
    nodes = rc.read_nodes("2026-01-01 INFO worker.py:1 -- connecting\n" + json.dumps(NODES) + "\n")
    assert rc.summarize(nodes) == {"alive_nodes": 2, "gpus": [1.0, 1.0], "addresses": ["10.0.0.1", "10.0.0.2"]}


@pytest.mark.parametrize("text", ["", "not json", "{}", '[{"alive": "yes", "address": "10.0.0.1", "gpus": 1}]',
                                  '[{"alive": true, "address": 7, "gpus": 1}]',
                                  '[{"alive": true, "address": "10.0.0.1", "gpus": true}]',
                                  json.dumps([NODES[0]] * 1025)])
def test_read_nodes_refuses_what_is_not_a_node_table(text):
    with pytest.raises(ValueError):
        rc.read_nodes(text)


def test_missing_names_each_member_not_alive_with_one_gpu():
    assert rc.missing(rc.summarize(NODES), MEMBERS) == []
    alone = rc.summarize(NODES[:1])
    assert rc.missing(alone, MEMBERS) == ["spark-2 (10.0.0.2) is not an alive node in Ray's node list"]
    blind = rc.summarize([NODES[0], {**NODES[1], "gpus": 0}])
    assert rc.missing(blind, MEMBERS) == ["spark-2 (10.0.0.2) has 0 GPUs in Ray, not 1"]
    doubled = rc.summarize([NODES[0], NODES[1], NODES[1]])
    assert rc.missing(doubled, MEMBERS) == ["spark-2 (10.0.0.2) has 2 GPUs in Ray, not 1"]


def fake_docker(tmp_path, script: str) -> dict:
    """An environment whose `docker` is `script` (sh): the helper runs without Docker or Ray."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text("#!/bin/sh\n" + script)
    (bin_dir / "docker").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def run_check(env, *members: str) -> subprocess.CompletedProcess:
    member_args = [arg for m in members for arg in ("--member", m)]
    return subprocess.run([sys.executable, str(RAY_CHECK), "--address", "10.0.0.1:6379", "--node-ip", "10.0.0.1",
                           *member_args], env=env, capture_output=True, text=True, timeout=30, check=False)


def test_the_helper_passes_when_ray_sees_every_member(tmp_path):
    env = fake_docker(tmp_path, f"echo 'ray: connecting'; echo '{json.dumps(NODES)}'\n")
    done = run_check(env, "spark-1=10.0.0.1", "spark-2=10.0.0.2")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"alive_nodes": 2, "gpus": [1.0, 1.0], "addresses": ["10.0.0.1", "10.0.0.2"],
                                       "missing": [], "error": None}


def test_the_helper_names_the_missing_member_and_exits_1(tmp_path):
    env = fake_docker(tmp_path, f"echo '{json.dumps(NODES[:1])}'\n")
    done = run_check(env, "spark-1=10.0.0.1", "spark-2=10.0.0.2")
    assert done.returncode == 1
    assert done.stderr.strip() == ("ray-check: Ray at 10.0.0.1:6379 sees 1 alive node(s), expected 2 with 1 GPU each: "
                                   "spark-2 (10.0.0.2) is not an alive node in Ray's node list")


def test_the_helper_reports_a_ray_that_does_not_answer(tmp_path):
    env = fake_docker(tmp_path, "echo 'Error: No such container: sparkfleet-ray' >&2; exit 1\n")
    done = run_check(env, "spark-1=10.0.0.1")
    assert done.returncode == 1
    assert json.loads(done.stdout)["missing"] == [
        "Ray in sparkfleet-ray did not answer (exit 1): Error: No such container: sparkfleet-ray"]
