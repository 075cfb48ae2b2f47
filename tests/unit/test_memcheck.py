"""files/sparkfleet-memcheck, the real helper, against a memory plan the planner wrote: it reads that shape and
applies the planner's own budget rule. It runs in a private mount namespace where /proc/meminfo and
/proc/sys/vm/drop_caches are files of the test (no page cache of this machine is dropped), the helper's own
/proc/<pid>/cgroup names the unit it starts for, and `systemctl` is a stand-in naming which units are active or
activating; it skips where `unshare -rm` is not allowed."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from sparkfleet import FILES_DIR
from sparkfleet.contract import serving
from sparkfleet.contract.formats import memory_plan_json
from sparkfleet.contract import shared
from sparkfleet.release.plan import plan_hosts
from tests.unit.helpers import Recorder, Replier, host_data

MEMCHECK = FILES_DIR / "sparkfleet-memcheck"
RAG = {"embed": {"recipe": "qwen3-embedding-0.6b"}, "rerank": {"recipe": "qwen3-reranker-0.6b"}}
# 128 GB total, 120 GB available: the chat's 0.88 (112.6 GB) fits, 0.95 (121.6 GB) does not
MEMINFO = "MemTotal:       125000000 kB\nMemFree:        117187500 kB\nMemAvailable:   117187500 kB\n"
SYSTEMCTL = """#!/bin/sh
if [ "$1" = stop ]; then echo "$2" >> "$STOPPED"; exit 0; fi
[ "$1" = is-active ] || exit 1
shift
for unit in "$@"; do
    case " $ACTIVE " in *" $unit "*) echo active; continue;; esac
    case " $ACTIVATING " in *" $unit "*) echo activating;; *) echo inactive;; esac
done
"""
CHAT, EMBED, RERANK = "sparkfleet-vllm.service", "sparkfleet-vllm-embed.service", "sparkfleet-vllm-rerank.service"


@pytest.fixture
def memcheck(tmp_path):
    """Runs the helper as a unit's ExecStartPre would: (share, active units; the unit it runs in, units
    activating, a plan of other settings) -> (exit status, stdout, stderr)."""
    (tmp_path / "meminfo").write_text(MEMINFO)
    (tmp_path / "drop_caches").write_text("")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "systemctl").write_text(SYSTEMCTL)
    (tmp_path / "bin" / "systemctl").chmod(0o755)
    probe = subprocess.run(["unshare", "-rm", "mount", "--bind", str(tmp_path / "meminfo"), "/proc/meminfo"],
                           capture_output=True, check=False)
    if probe.returncode:
        pytest.skip("unshare -rm (a private mount namespace) is not allowed here")
    plan_file = tmp_path / "memory.json"

    def run(share: str, *active: str, unit: str = "", activating: tuple[str, ...] = (), wait_s: int = 60,
            stats: str | None = None, **settings) -> tuple[int, str, str]:
        host_plan = plan_hosts([("spark-a", host_data(**{"services": RAG, **settings}))])[0]
        memory = host_plan.memory_plan  # as the converge writes it, the serving file moved beside it
        (tmp_path / "serving.json").write_text(serving.serving_file(host_plan.settings))
        memory["start"].update(wait_s=wait_s, serving=str(tmp_path / "serving.json"))
        if stats:
            memory["guard_stats"] = stats
        plan_file.write_text(memory_plan_json(memory))
        (tmp_path / "cgroup").write_text(f"0::/system.slice/{unit or 'ssh.service'}\n")
        inner = (f"mount --bind {tmp_path}/meminfo /proc/meminfo && "
                 f"mount --bind {tmp_path}/drop_caches /proc/sys/vm/drop_caches && "
                 f"mount --bind {tmp_path}/cgroup /proc/$$/cgroup && "
                 f"exec {shlex.quote(sys.executable)} {MEMCHECK} {share} {plan_file}")
        proc = subprocess.run(["unshare", "-rm", "sh", "-c", inner], capture_output=True, text=True, check=False,
                              env={"PATH": f"{tmp_path}/bin:/usr/bin:/bin", "ACTIVE": " ".join(active),
                                   "STOPPED": str(tmp_path / "stopped"),
                                   "ACTIVATING": " ".join(activating)})
        return proc.returncode, proc.stdout, proc.stderr

    return run


def test_a_start_that_fits_the_planners_budget_passes(memcheck):
    """The chat model starting beside its two running services: 0.88 + 0.03 + 0.03 = 0.94 <= 0.95."""
    rc, out, err = memcheck("0.88", "sparkfleet-vllm-embed.service", "sparkfleet-vllm-rerank.service")
    assert (rc, err) == (0, ""), err
    assert out == ("sparkfleet-memcheck: MemAvailable 111.8 GiB covers the budget of 104.9 GiB (running: "
                   "sparkfleet-vllm-embed.service 0.03, sparkfleet-vllm-rerank.service 0.03)\n")


def test_a_start_past_the_planners_budget_fails_with_one_line(memcheck):
    """A unit asking 0.1 beside the running chat (0.88) and rerank (0.03): 1.01 > 0.95, read from the plan."""
    rc, out, err = memcheck("0.1", "sparkfleet-vllm.service", "sparkfleet-vllm-rerank.service")
    assert (rc, out) == (1, "")
    assert err.splitlines() == [
        "sparkfleet-memcheck: running units hold 0.91 of the budget 0.95 (sparkfleet-vllm-rerank.service 0.03, "
        "sparkfleet-vllm.service 0.88): this unit's 0.1 does not fit; converge the host (its plan lowers a share) "
        "or stop a service"]


def test_short_memory_fails_with_one_line_naming_the_running_units(memcheck):
    rc, out, err = memcheck("0.95")
    assert (rc, out) == (1, "")
    assert err.splitlines() == [
        "sparkfleet-memcheck: MemAvailable 111.8 GiB < budget 113.2 GiB (gpu_memory_utilization 0.95 x MemTotal "
        "119.2 GiB); running: no other sparkfleet engine: stop other models or containers, or lower "
        "gpu_memory_utilization"]


# --- one engine loads at a time: a unit waits for the engines before it in the plan's start order ----------------


def test_a_service_waits_until_the_chat_model_loading_before_it_answers(memcheck):
    """The chat engine running but still loading (its /health answers 503 twice): the embedding service's start
    waits until it answers, then checks its memory."""
    engine = Recorder({}, statuses=(503, 503))
    try:
        rc, out, err = memcheck("0.03", CHAT, unit=EMBED, api_port=engine.port - 10000)
    finally:
        engine.close()
    assert (rc, err) == (0, ""), err
    assert [path for _, path, _, _ in engine.seen] == ["/health"] * 3  # asked until it answered
    waited, checked = out.splitlines()
    assert waited.startswith(f"sparkfleet-memcheck: {EMBED} waited ") and waited.endswith(
        f" s for {CHAT} to answer (engines load one at a time)"), waited
    assert checked.startswith("sparkfleet-memcheck: MemAvailable "), checked


def test_a_unit_still_starting_before_it_is_waited_for_and_one_stopped_is_not(memcheck):
    """rerank starts after the chat model and embed: embed activating (its pre-start steps) is waited for until the
    wait ends, the chat model, stopped, is not; past the wait the unit starts anyway and the memory check decides."""
    rc, out, err = memcheck("0.03", unit=RERANK, activating=(EMBED,), wait_s=3)
    assert (rc, err.splitlines()) == (0, [
        f"sparkfleet-memcheck: {EMBED} still loading after 3 s: starting {RERANK} anyway (the memory check decides)"])
    assert out.startswith("sparkfleet-memcheck: MemAvailable ") and "waited" not in out


def test_the_first_engine_waits_for_none_and_a_unit_outside_the_plan_neither(memcheck):
    """The chat model starts first: services starting beside it do not hold it back; neither does an older unit's
    check (a unit the plan does not name)."""
    for unit in (CHAT, "sparkfleet-vllm-old.service"):
        rc, out, err = memcheck("0.03", activating=(EMBED, RERANK), unit=unit, wait_s=30)
        assert (rc, err, "waited" in out) == (0, "", False), (unit, out, err)


def test_start_before_and_own_unit_read_the_plan_and_the_cgroup(tmp_path):
    memory = plan_hosts([("spark-a", host_data(services=RAG))])[0].memory_plan
    path = tmp_path / "memory.json"
    path.write_text(memory_plan_json(memory))
    assert shared.memory.start_before(path, RERANK) == ([(CHAT, 18000), (EMBED, 18001)], 900.0,
                                                      "/etc/sparkfleet/serving.json")
    assert shared.memory.start_before(path, CHAT)[0] == []
    del memory["start"]  # an older release's plan: no order, nobody waits
    path.write_text(json.dumps(memory))
    assert shared.memory.start_before(path, RERANK) == ([], 0, None)
    assert shared.memory.own_unit(f"0::/system.slice/{EMBED}\n") == EMBED
    assert shared.memory.own_unit(f"12:pids:/system.slice/{EMBED}\n1:name=systemd:/system.slice/{EMBED}\n") == EMBED
    assert shared.memory.own_unit("0::/user.slice/user-0.slice/session-1.scope\n") is None


# --- on-demand models: the least recently used one makes room, an always-on one never ---------------------------

ON_DEMAND = {"embed": {"recipe": "qwen3-embedding-0.6b", "gpu_memory_utilization": 0.2, "on_demand": True},
             "embed-b": {"recipe": "qwen3-embedding-0.6b", "gpu_memory_utilization": 0.2, "on_demand": True,
                         "api_port": 8005, "served_model_name": "embed-b"},
             "rerank": {"recipe": "qwen3-reranker-0.6b", "gpu_memory_utilization": 0.2, "on_demand": True}}
EMBED_B = "sparkfleet-vllm-embed-b.service"


def guard_stats(path, lastsess: dict[str, int]) -> Replier:
    """The guard's stats socket: `show stat` answered with each listener's seconds since its last request."""
    import socket

    header = "# pxname,svname,qcur,scur,lastsess,status,"
    rows = [f"{name},engine,0,0,{seconds},no check," for name, seconds in lastsess.items()]
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.listen()
    return Replier(sock, "\n".join([header, *rows, "stats,FRONTEND,,,,OPEN,"]).encode() + b"\n\n")


@pytest.mark.parametrize("lastsess, stopped", [
    ({"service_embed": 300, "service_embed-b": 5}, EMBED),   # embed asked 5 min ago, embed-b 5 s ago
    ({"service_embed": 3, "service_embed-b": -1}, EMBED_B),  # embed-b never asked since the guard started
])
def test_an_on_demand_start_stops_the_least_recently_used_on_demand_engine_and_no_always_on_one(
        memcheck, tmp_path, lastsess, stopped):
    """rerank starting on demand beside the chat model (0.5) and two on-demand engines (0.2 each): 1.1 > 0.95, so one
    of those is stopped, the one whose last request is oldest; the chat model is never a candidate."""
    stats = guard_stats(tmp_path / "stats.sock", lastsess)
    try:
        rc, out, err = memcheck("0.2", CHAT, EMBED, EMBED_B, unit=RERANK, stats=str(tmp_path / "stats.sock"),
                                gpu_memory_utilization=0.5, services=ON_DEMAND, wait_s=0)
    finally:
        stats.close()
    assert rc == 0 and "does not fit" not in err, err  # (no engine answers here: the start order's wait is 0)
    assert (tmp_path / "stopped").read_text().split() == [stopped]
    assert out.splitlines()[0] == (f"sparkfleet-memcheck: stopping {stopped} (on demand, the least recently used) "
                                   f"to make room for {RERANK}")


def test_an_always_on_engine_is_never_stopped_for_an_on_demand_one(memcheck, tmp_path):
    """The running engines are all always-on (a plan a person edited by hand, or a share raised since): the start
    fails naming them, and nothing is stopped."""
    rc, out, err = memcheck("0.5", CHAT, "sparkfleet-vllm-rerank.service", unit=EMBED, gpu_memory_utilization=0.5,
                            services={**RAG, "embed": {**RAG["embed"], "on_demand": True,
                                                       "gpu_memory_utilization": 0.4}}, wait_s=0)
    assert rc == 1 and "does not fit" in err and not (tmp_path / "stopped").exists()


def test_last_requests_reads_haproxys_own_header():
    csv = "# pxname,svname,lastsess,qcur\nservice_a,engine,12,0\nservice_b,engine,-1,0\nchat,FRONTEND,,\n"
    assert shared.eviction.last_requests(csv) == {"service_a": 12.0, "service_b": None}
    assert shared.eviction.last_requests("") == {} and shared.eviction.last_requests("garbage") == {}


def test_the_eviction_stops_on_demand_engines_least_recently_used_first_and_only_until_the_start_fits(
        tmp_path, monkeypatch):
    """The eviction's own rule (files/sparkfleet_host/eviction.py), without a host: of three running on-demand
    engines the one asked longest ago goes first and one never asked before it; it stops as soon as the starting
    unit fits, never touches the always-on chat engine nor the unit starting."""
    memory = plan_hosts([("spark-a", host_data(gpu_memory_utilization=0.5, services=ON_DEMAND))])[0].memory_plan
    memory["guard_stats"] = str(tmp_path / "stats.sock")
    memory["min_resident_s"] = 0  # the order alone here; the residency: test_on_demand_residency.py
    path = tmp_path / "memory.json"
    path.write_text(memory_plan_json(memory))
    eviction, stopped = shared.eviction, []
    monkeypatch.setattr(eviction, "ask_stats", lambda socket_path: (
        "# pxname,svname,lastsess\nservice_embed,engine,300\nservice_embed-b,engine,-1\nservice_rerank,engine,5\n"))
    monkeypatch.setattr(eviction.subprocess, "run", lambda argv, **kw: stopped.append(argv))
    assert eviction.least_recently_used([RERANK, EMBED, EMBED_B], eviction.on_demand_units(path)[0],
                                        eviction.ask_stats("")) == [EMBED_B, EMBED, RERANK]
    running = {CHAT: 0.5, EMBED: 0.2, EMBED_B: 0.2}
    lines: list[str] = []
    left = eviction.make_room(path, RERANK, running, 0.4, 0.95, log=lines.append)  # 0.9 + 0.4: two must go
    assert stopped == [["systemctl", "stop", EMBED_B], ["systemctl", "stop", EMBED]]
    assert left == {CHAT: 0.5} and len(lines) == 2
    stopped.clear()
    assert eviction.make_room(path, RERANK, running, 0.2, 0.95, log=lines.append) == {CHAT: 0.5, EMBED: 0.2}
    assert stopped == [["systemctl", "stop", EMBED_B]]  # one is enough: 0.7 + 0.2
    assert lines[0] == f"stopping {EMBED_B} (on demand, the least recently used) to make room for {RERANK}"
