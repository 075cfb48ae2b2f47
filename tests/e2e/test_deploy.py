"""The deploy, end to end, on three simulated Sparks: converge, re-converge, verify, survive."""

import json

import pytest
from openai import OpenAI

from tests.waiting import wait_until

from .conftest import HOSTS, api_port, converge, run_pytest_infra, started_at

pytestmark = pytest.mark.e2e

API_KEY = "sim-key"  # inventory/sim.py


def chat(state, host, timeout=60.0) -> str:
    client = OpenAI(base_url=f"http://127.0.0.1:{api_port(state, host)}/v1", api_key=API_KEY, timeout=timeout)
    reply = client.chat.completions.create(model="Qwen3.5-35B-A3B", max_tokens=8,
                                           messages=[{"role": "user", "content": "hello"}],
                                           extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert reply.usage.completion_tokens > 0
    return reply.choices[0].message.content


def test_first_converge_succeeds_everywhere(first_converge):
    assert first_converge.returncode == 0, first_converge.output[-4000:]
    for host in HOSTS:
        assert not first_converge.failed[host], (host, first_converge.failed[host])
        assert any("health" in name.lower() or "answers" in name for name in first_converge.changed[host])


def test_each_host_answers_a_chat_completion(converged_fleet):
    for host in HOSTS:
        assert chat(converged_fleet, host)


def test_second_converge_changes_nothing_and_restarts_nothing(converged_fleet):
    sim_fleet = converged_fleet
    before = {host: started_at(sim_fleet, host) for host in HOSTS}
    again = converge()
    assert again.returncode == 0, again.output[-4000:]
    assert again.changed == {host: [] for host in HOSTS}
    assert {host: started_at(sim_fleet, host) for host in HOSTS} == before


def test_testinfra_suite_passes_against_the_sim(converged_fleet):
    proc = run_pytest_infra("--full-verify")
    assert proc.returncode == 0, proc.stdout[-4000:]
    # front-door checks skip hosts outside its group; a host with no service passes the one services check that
    # applies (no unit of a dropped service is left) and skips the 4 of its services; every host has a guard (3 checks)
    # and, in a fleet without backups, neither a backup timer nor the target's jail (2 checks: tests/infra/test_backup)
    assert f"{16 * len(HOSTS)} passed, {12 + 4 * len(HOSTS)} skipped" in proc.stdout
    assert "host key" not in proc.stdout


def test_rebooted_host_serves_again_without_a_deploy(converged_fleet):
    from sim import fleet

    sim_fleet = converged_fleet
    fleet.reboot("spark-3")
    wait_until(lambda: chat(sim_fleet, "spark-3", timeout=10), 240, "spark-3 answering after its reboot", step_s=3,
               ignore=(Exception,))


REFUSED = {"580.95.99": "a driver this test refuses"}


@pytest.mark.parametrize("knobs,needle,data", [
    ({"spark-2": {"driver": "550.54.14"}, "spark-3": {"present": False}},
     {"spark-2": "NVIDIA driver: found 550.54.14, required >= 580.95.05", "spark-3": "GPU driver: found nvidia-smi printed no driver line"}, {}),
    ({"spark-2": {"name": "NVIDIA H100 PCIe"}, "spark-3": {"driver": "580.95.99"}},
     {"spark-2": "GPU: found NVIDIA H100 PCIe, required NVIDIA GB10",
      "spark-3": "spark-3: NVIDIA driver 580.95.99 is refused (refused_drivers '580.95.99'): a driver this test "
                 "refuses"}, {"refused_drivers": REFUSED}),
])
def test_preflight_fault_fails_that_host_alone(converged_fleet, knobs, needle, data):
    from sim import fleet

    sim_fleet = converged_fleet
    before = {host: started_at(sim_fleet, host) for host in knobs}
    try:
        for host, gpu in knobs.items():
            fleet.set_gpu(host, **gpu)
        result = converge(*(arg for key, value in data.items() for arg in ("--data", f"{key}={json.dumps(value)}")))
    finally:
        for host in knobs:
            fleet.set_gpu(host, present=True, name="NVIDIA GB10", driver="580.95.05", cuda="13.0")
    assert result.returncode != 0
    for host in HOSTS:
        if host in knobs:
            assert result.failed[host] and result.changed[host] == [], (host, result.changed[host])
            assert needle[host] in result.output and f"{host}: " in result.output
            assert started_at(sim_fleet, host) == before[host]
        else:
            assert not result.failed[host] and result.changed[host] == []
