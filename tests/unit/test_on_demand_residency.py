"""On-demand engines stay a minimum time before another start may stop them (`on_demand_min_resident_s`): without
it one key holder asking two models that do not fit together, in turn, makes them evict each other on every
request (each start minutes of loading). The eviction (files/sparkfleet_host/eviction.py `make_room`) runs here
against the planner's own memory plan, with a fake clock (no sleep) and a fake `systemctl` (stop, is-active, the
time each unit became active) at the subprocess boundary, and the guard's counts of the last requests."""

from __future__ import annotations

import subprocess

import pytest

from sparkfleet.contract import shared
from sparkfleet.contract.formats import memory_plan_json
from sparkfleet.release.plan import plan_hosts
from tests.unit.helpers import host_data
from tests.unit.test_services import refused

CHAT, A, B, C = ("sparkfleet-vllm.service", "sparkfleet-vllm-embed.service", "sparkfleet-vllm-embed-b.service",
                 "sparkfleet-vllm-embed-c.service")
PROXY = {A: "sparkfleet-ondemand-embed.service", B: "sparkfleet-ondemand-embed-b.service",
         C: "sparkfleet-ondemand-embed-c.service"}
LISTENER = {A: "service_embed", B: "service_embed-b", C: "service_embed-c"}
ON_DEMAND = {"recipe": "qwen3-embedding-0.6b", "on_demand": True}


def memory_file(tmp_path, share: float = 0.4, three: bool = False, **settings):
    """The planner's memory plan: the chat model always on at 0.5, two (or three) on-demand engines of `share`."""
    services = {"embed": {**ON_DEMAND, "gpu_memory_utilization": share},
                "embed-b": {**ON_DEMAND, "gpu_memory_utilization": share, "api_port": 8005,
                            "served_model_name": "embed-b"}}
    if three:
        services["embed-c"] = {**ON_DEMAND, "gpu_memory_utilization": share, "api_port": 8006,
                               "served_model_name": "embed-c"}
    memory = plan_hosts([("spark-a", host_data(gpu_memory_utilization=0.5, services=services, **settings))])[0]
    path = tmp_path / "memory.json"
    path.write_text(memory_plan_json(memory.memory_plan))
    return path


class Host:
    """A host's systemd and guard as the eviction sees them, on a fake clock. Per unit: `leaving` the monotonic
    second its start began (systemd's InactiveExitTimestampMonotonic), `active` when it became active (for an
    on-demand engine's proxy: once the engine answered, `load_s` later), `asked` its last request through the
    guard. `sleep` advances the clock: a start that waits, waits on this clock."""

    def __init__(self, load_s: float = 0):
        self.now = 1000.0
        self.load_s = load_s
        self.leaving: dict[str, float] = {}
        self.active: dict[str, float] = {}
        self.asked: dict[str, float] = {}
        self.stopped: list[str] = []
        self.slept: list[float] = []
        self.unreadable: set[str] = set()  # units whose `systemctl show` answers nothing

    # the clock (eviction.time)
    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.slept.append(seconds)
        self.now += seconds

    @property
    def started(self) -> set[str]:
        return set(self.active)

    def start(self, unit: str, asked: bool = True, since: float | None = None) -> None:
        """`unit` active now; its start began at `since` (now); `asked`: by a request through the guard (else by
        the converge's gate, through the socket)."""
        self.leaving[unit] = self.now if since is None else since
        self.active[unit] = self.now
        if unit in PROXY:  # an on-demand engine's proxy: active once the engine answered
            self.active[PROXY[unit]] = self.now + self.load_s
        if asked:
            self.asked[unit] = self.leaving[unit]

    def stop(self, unit: str) -> None:
        for name in (unit, PROXY.get(unit, "")):
            self.active.pop(name, None)

    def run(self, argv, **kwargs):
        assert argv[0] == "systemctl", argv
        out = ""
        if argv[1] == "stop":
            self.stopped.append(argv[-1])
            self.stop(argv[-1])
        elif argv[1] == "is-active":
            out = "".join("active\n" if u in self.active else "inactive\n" for u in argv[2:] if u != "--")
        elif argv[1] == "show":
            unit = argv[-1]
            if unit in self.unreadable:
                return subprocess.CompletedProcess(argv, 1, "", "")
            times = {"InactiveExitTimestampMonotonic": self.leaving.get(unit),
                     "ActiveEnterTimestampMonotonic": self.active.get(unit)}
            out = "".join(f"{key}={int(t * 1_000_000) if t is not None else 0}\n" for key, t in times.items()
                          if f"--property={key}" in argv)
        else:
            raise AssertionError(argv)
        return subprocess.CompletedProcess(argv, 0, out, "")

    def stats(self, socket_path) -> str:
        rows = [f"{LISTENER[u]},engine,{int(self.now - t)}" for u, t in self.asked.items() if u in LISTENER]
        return "\n".join(["# pxname,svname,lastsess", *rows]) + "\n"

    def running(self, shares: dict[str, float]) -> dict[str, float]:
        return {u: s for u, s in shares.items() if u in self.active}


@pytest.fixture
def host(monkeypatch):
    fake = Host()
    eviction = shared.eviction
    monkeypatch.setattr(eviction, "time", fake, raising=False)
    monkeypatch.setattr(eviction.subprocess, "run", fake.run)
    monkeypatch.setattr(eviction, "ask_stats", fake.stats)
    return fake


def room(path, unit, running, share=0.4, lines=None):
    return shared.eviction.make_room(path, unit, running, share, 0.95,
                                     log=(lines.append if lines is not None else lambda line: None))


def test_two_models_asked_in_turn_swap_at_most_once_per_residency_not_on_every_request(host, tmp_path):
    """The hostile pattern: one key holder asks A, then B, then A ... every 5 s for an hour. Each swap still
    happens (the request waits, it is not lost), but no more than once per `on_demand_min_resident_s` (300 s by
    default): before, every request stopped the other model (720 evictions)."""
    path = memory_file(tmp_path)
    shares = {CHAT: 0.5, A: 0.4, B: 0.4}
    host.start(CHAT)
    served, waits = 0, []
    end = host.now + 3600
    turn = 0
    while host.now < end:
        unit = (A, B)[turn % 2]
        turn += 1
        arrived = host.now
        host.asked[unit] = arrived  # the guard hands the request on at once: systemd's socket holds it
        if unit not in host.active:
            left = room(path, unit, host.running(shares), shares[unit])
            waits.append(host.now - arrived)
            assert shared.memory.within_budget([*left.values(), shares[unit]], 0.95)[1], (turn, left)
            host.start(unit, since=arrived)
        served += 1
        host.sleep(5)
    assert CHAT not in host.stopped
    assert served == turn and len(host.stopped) <= 3600 // 300 + 1, len(host.stopped)
    assert max(waits) <= 300


def test_a_young_engine_is_passed_over_for_an_older_one_even_when_it_is_the_least_recently_used(host, tmp_path):
    """A started 40 s ago and not asked since; B resident 400 s, asked 1 s ago: C's start stops B at once."""
    path = memory_file(tmp_path, share=0.2, three=True)
    host.start(CHAT)
    host.start(B)
    host.now += 360
    host.start(A)
    host.now += 39
    host.asked[B] = host.now
    host.now += 1
    lines: list[str] = []
    left = room(path, C, host.running({CHAT: 0.5, A: 0.2, B: 0.2}), 0.2, lines)
    assert (host.stopped, host.slept, left) == ([B], [], {CHAT: 0.5, A: 0.2})
    assert lines == [f"stopping {B} (on demand, the least recently used) to make room for {C}"]


def test_a_start_waits_out_the_youngest_needed_residency_then_stops_it(host, tmp_path):
    """B's start finds only A, answering for 40 s: it waits the 260 s left (on the fake clock), then stops A."""
    path = memory_file(tmp_path)
    host.start(CHAT)
    host.start(A)
    host.now += 40
    lines: list[str] = []
    left = room(path, B, host.running({CHAT: 0.5, A: 0.4}), 0.4, lines)
    assert (host.slept, host.stopped, left) == ([260.0], [A], {CHAT: 0.5})
    assert lines[0] == (f"{B} waits 260 s: {A} has served for 40 s and stays at least 300 s "
                        "(on_demand_min_resident_s)")


def test_residency_counts_from_the_first_answer_not_the_start(host, tmp_path):
    """A loaded for 200 s and has answered for 50: residency is the time it served (its proxy's start), so B
    waits 250 s, not 50."""
    host.load_s = 200
    path = memory_file(tmp_path)
    host.start(CHAT)
    host.start(A)
    host.now += 250
    room(path, B, host.running({CHAT: 0.5, A: 0.4}), 0.4)
    assert (host.slept, host.stopped) == ([250.0], [A])


def test_an_engine_that_idles_out_during_the_wait_is_not_stopped_again(host, tmp_path):
    """A stops by itself (its idle time) while B's start waits: nothing to stop once the wait ends."""
    path = memory_file(tmp_path)
    host.start(CHAT)
    host.start(A)
    host.now += 100
    real_sleep = host.sleep

    def idle_out(seconds):
        real_sleep(seconds)
        host.stop(A)

    host.sleep = idle_out  # type: ignore[method-assign]
    left = room(path, B, host.running({CHAT: 0.5, A: 0.4}), 0.4)
    assert (host.slept, host.stopped, left) == ([200.0], [], {CHAT: 0.5})


def test_an_engine_only_the_converges_gate_started_is_not_protected(host, tmp_path):
    """A converge that changed A and B starts each once through its socket (never through the guard): B's start
    stops A at once instead of waiting out a residency nobody used; so does one last asked before its start."""
    path = memory_file(tmp_path)
    host.start(CHAT)
    host.asked[A] = host.now - 30  # a request before this run of A
    host.start(A, asked=False)
    host.now += 5
    assert room(path, B, host.running({CHAT: 0.5, A: 0.4})) == {CHAT: 0.5}
    assert (host.stopped, host.slept) == ([A], [])


def test_the_request_that_started_an_engine_counts_as_asked_though_the_start_waited(host, tmp_path):
    """A's request came at t, its start waited 200 s (another residency) and loaded 100 s: the guard counts that
    request 300 s ago, before A became active; A is still the asked engine it protects (served 0 s: B waits)."""
    host.load_s = 100
    path = memory_file(tmp_path)
    host.start(CHAT)
    arrived = host.now
    host.now += 200
    host.start(A, since=arrived)
    host.now += 100
    room(path, B, host.running({CHAT: 0.5, A: 0.4}), 0.4)
    assert (host.slept, host.stopped) == ([300.0], [A])


def test_a_residency_longer_than_the_hold_fails_the_start_at_once_with_the_reason(host, tmp_path):
    """A residency that would outlast what the guard holds a request (the plan's start wait, health_timeout_s):
    no wait, nothing stopped, one line naming the engine, how long it stays and the setting (the start then fails:
    the client reads 502)."""
    path = memory_file(tmp_path, on_demand_min_resident_s=1800, health_timeout_s=600)
    host.start(CHAT)
    host.start(A)
    host.now += 100
    lines: list[str] = []
    left = room(path, B, host.running({CHAT: 0.5, A: 0.4}), 0.4, lines)
    assert (host.slept, host.stopped, left) == ([], [], {CHAT: 0.5, A: 0.4})
    assert lines == [f"{B} cannot start for 1700 s: {A} has served for 100 s and stays at least 1800 s "
                     "(on_demand_min_resident_s), longer than a request is held (600 s): retry later"]


def test_no_residency_and_an_unreadable_time_stop_at_once_as_before(host, tmp_path):
    """`on_demand_min_resident_s = 0` stops the least recently used at once; so does a unit whose activation time
    systemd does not give (an engine is never kept forever on a reading that failed)."""
    path = memory_file(tmp_path, on_demand_min_resident_s=0)
    host.start(CHAT)
    host.start(A)
    assert room(path, B, host.running({CHAT: 0.5, A: 0.4})) == {CHAT: 0.5}
    assert (host.stopped, host.slept) == ([A], [])
    path = memory_file(tmp_path)
    host.start(A)
    host.unreadable.add(A)
    assert room(path, B, host.running({CHAT: 0.5, A: 0.4})) == {CHAT: 0.5}
    assert (host.stopped, host.slept) == ([A, A], [])


def test_waiting_is_pointless_where_only_always_on_engines_stand_in_the_way(host, tmp_path):
    """B's 0.4 beside the chat model's 0.5 and a hand-raised always-on share: even A's going would not make room,
    so no wait and nothing stopped (the start fails naming them)."""
    path = memory_file(tmp_path)
    host.start(CHAT)
    host.start(A)
    left = room(path, B, {CHAT: 0.6, A: 0.4}, 0.4)
    assert (host.slept, host.stopped, left) == ([], [], {CHAT: 0.6, A: 0.4})


def test_the_plan_carries_the_residency_and_each_proxy(tmp_path):
    import json

    memory = json.loads(memory_file(tmp_path, on_demand_min_resident_s=120).read_text())
    assert memory["min_resident_s"] == 120
    assert memory["shares"]["embed"]["proxy"] == PROXY[A] and "proxy" not in memory["shares"]["chat"]
    assert shared.eviction.read_on_demand(tmp_path / "memory.json").min_resident_s == 120
    no_on_demand = plan_hosts([("spark-a", host_data())])[0].memory_plan
    assert "min_resident_s" not in no_on_demand  # a host without on-demand engines: its plan as before


@pytest.mark.parametrize("value, why", [
    (-1, "greater than or equal to 0"),
    (3601, "less than or equal to 3600"),
    ("300s", "valid integer"),
    (1.5, "valid integer"),
])
def test_hostile_residencies_are_refused_naming_the_key(value, why):
    [line] = refused(on_demand_min_resident_s=value)
    assert "`on_demand_min_resident_s`" in line and why in line, line
