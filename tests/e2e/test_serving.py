"""Serving, not just running: the watchdog and the converge heal an engine that stops answering,
leave a healthy or slowly starting one alone, and name a lost GPU. Default watchdog settings
(a probe every 30 s, a restart after 3 failures)."""

import json
import time

import pytest

from sim import fleet

from .conftest import HOSTS, api_port, converge, ssh, started_at

pytestmark = pytest.mark.e2e

HEAL_WITHIN_S = 180


def watchdog_state(state, host) -> dict:
    return json.loads(ssh(state, host, "cat /var/lib/sparkfleet/watchdog.json 2>/dev/null || echo '{}'") or "{}")


def answers(state, host) -> bool:
    """A 1-token chat completion from the controller, as a user would send it."""
    import requests

    try:
        reply = requests.post(f"http://127.0.0.1:{api_port(state, host)}/v1/chat/completions", timeout=5,
                              headers={"Authorization": "Bearer sim-key"},
                              json={"model": "Qwen3.5-35B-A3B", "max_tokens": 1,
                                    "messages": [{"role": "user", "content": "ping"}]})
        return reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 1
    except (requests.RequestException, ValueError, KeyError):
        return False


def wait_until(check, timeout_s, step_s=3.0) -> float:
    """Seconds until check() held; AssertionError past timeout_s."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if check():
            return time.monotonic() - t0
        time.sleep(step_s)
    raise AssertionError(f"not within {timeout_s} s")


def started_or_none(state, host) -> str | None:
    """The engine container's start time; None while there is none (between a stop and a start)."""
    return ssh(state, host, "docker inspect -f '{{.State.StartedAt}}' vllm 2>/dev/null", check=False) or None


def restarts_total(state) -> dict:
    return {h: watchdog_state(state, h).get("restarts_total", 0) for h in HOSTS}


@pytest.fixture()
def serving_fleet(sim_fleet, first_converge):
    """Every host answering and known to its watchdog; whatever a test broke is repaired after it."""
    for host in HOSTS:
        wait_until(lambda h=host: answers(sim_fleet, h) and watchdog_state(sim_fleet, h).get("last_result") == "ok",
                   HEAL_WITHIN_S)
    yield sim_fleet
    for host in HOSTS:
        fleet.set_engine(host, fault=None, load_delay_s=2, crash_on_start=False)
        ssh(sim_fleet, host, "docker unpause vllm 2>/dev/null; true")
        if not answers(sim_fleet, host):
            ssh(sim_fleet, host, "/opt/sparkfleet/bin/sparkfleet-watchdog --restart test-cleanup")
    for host in HOSTS:
        wait_until(lambda h=host: answers(sim_fleet, h), HEAL_WITHIN_S)


def test_watchdog_heals_a_paused_and_a_generation_hung_engine_alone(serving_fleet):
    state = serving_fleet
    untouched = started_at(state, "spark-3")
    before = restarts_total(state)
    ssh(state, "spark-1", "docker pause vllm")
    fleet.set_engine("spark-2", live=True, fault="generation-hang")
    assert not answers(state, "spark-1") and not answers(state, "spark-2")
    healed_1 = wait_until(lambda: answers(state, "spark-1"), HEAL_WITHIN_S)
    healed_2 = wait_until(lambda: answers(state, "spark-2"), HEAL_WITHIN_S)
    after = restarts_total(state)
    assert after == {"spark-1": before["spark-1"] + 1, "spark-2": before["spark-2"] + 1,
                     "spark-3": before["spark-3"]}, (before, after, healed_1, healed_2)
    assert started_at(state, "spark-3") == untouched
    journal = ssh(state, "spark-2", "journalctl -u sparkfleet-watchdog.service -p warning --no-pager -n 20")
    assert "chat failed: 1-token chat completion" in journal and "restarting sparkfleet-vllm.service" in journal
    nothing = converge()
    assert nothing.returncode == 0 and not any(nothing.changed.values()), nothing.changed


def test_converge_right_after_a_hang_restarts_and_gates_that_host(serving_fleet):
    state = serving_fleet
    others = {h: started_at(state, h) for h in ("spark-1", "spark-3")}
    ssh(state, "spark-2", "docker pause vllm")
    result = converge()
    assert result.returncode == 0, result.output[-3000:]
    healed = "Watchdog | Qwen3.5-35B-A3B is serving (else restarted and gated)"
    assert [h for h in HOSTS if healed in result.changed[h]] == ["spark-2"], result.changed
    assert answers(state, "spark-2")
    assert {h: started_at(state, h) for h in others} == others
    assert watchdog_state(state, "spark-2")["last_restart"]["by"] == "converge"


def test_lost_gpu_in_the_engine_container_is_named_and_healed(serving_fleet):
    state = serving_fleet
    before = started_at(state, "spark-3")
    fleet.lose_container_gpu("spark-3")
    assert "GB10" in ssh(state, "spark-3", "nvidia-smi -L")  # the host still sees it
    lost = ssh(state, "spark-3", "/opt/sparkfleet/bin/sparkfleet-watchdog --check", check=False)
    probe = json.loads(ssh(state, "spark-3", "/opt/sparkfleet/bin/sparkfleet-watchdog --probe"))
    assert (probe["failed"], probe["gpu_visible"]) == ("gpu", False), (lost, probe)
    assert probe["gpu_detail"] == "Failed to initialize NVML: Unknown Error"
    wait_until(lambda: started_or_none(state, "spark-3") not in (None, before) and answers(state, "spark-3"),
               HEAL_WITHIN_S)
    wait_until(lambda: watchdog_state(state, "spark-3").get("gpu_visible") is True, 60)


def test_slow_start_is_not_killed_and_a_healthy_fleet_is_left_alone(serving_fleet):
    state = serving_fleet
    before = restarts_total(state)
    probes = {h: watchdog_state(state, h)["probes"] for h in HOSTS}
    fleet.set_engine("spark-1", load_delay_s=100)  # more than three 30 s probe intervals
    ssh(state, "spark-1", "systemctl restart sparkfleet-vllm.service")
    wait_until(lambda: started_or_none(state, "spark-1"), 30, step_s=1)
    slow = started_at(state, "spark-1")
    took = wait_until(lambda: answers(state, "spark-1"), 200, step_s=5)
    assert took >= 90 and started_at(state, "spark-1") == slow
    fleet.set_engine("spark-1", load_delay_s=2)
    assert restarts_total(state) == before
    ticks = {h: watchdog_state(state, h)["probes"] - probes[h] for h in HOSTS}
    assert min(ticks.values()) >= 3, ticks
    journal = ssh(state, "spark-1", "journalctl -u sparkfleet-watchdog.service --no-pager -n 30")
    assert "is starting" in journal


def unit_state(state, host) -> str:
    return ssh(state, host, "systemctl is-active sparkfleet-vllm.service", check=False)


def test_a_first_start_needs_a_container_that_sees_the_gpu(serving_fleet):
    """The unit not running (a first start), GPU containers blind while the host's nvidia-smi works: the
    converge stops that host before the service stage, naming the GPU; once containers see it, one
    converge starts and gates the engine."""
    state = serving_fleet
    others = {h: started_at(state, h) for h in ("spark-1", "spark-2")}
    ssh(state, "spark-3", "systemctl stop sparkfleet-vllm.service")
    fleet.set_gpu("spark-3", containers=False)
    try:
        assert "GB10" in ssh(state, "spark-3", "nvidia-smi -L")
        blocked = converge()
        assert blocked.returncode != 0
        assert [h for h in HOSTS if blocked.host_failed(h)] == ["spark-3"], blocked.failed
        assert blocked.failed["spark-3"][0].endswith("A container started like the engine sees the GPU")
        assert "a container started like the engine cannot see the GPU (docker run --gpus all)" in blocked.output
        assert "Failed to initialize NVML: Unknown Error" in blocked.output
        assert unit_state(state, "spark-3") == "inactive"
    finally:
        fleet.set_gpu("spark-3", containers=True)
    healed = converge()
    assert healed.returncode == 0, healed.output[-3000:]
    assert answers(state, "spark-3") and unit_state(state, "spark-3") == "active"
    assert {h: started_at(state, h) for h in others} == others
