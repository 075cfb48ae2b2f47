"""Three engines on the simulated fleet (inventory/sim_engines.py): spark-1 on vLLM (stand-in), spark-2 on SGLang
(stand-in), spark-3 on the real llama.cpp `llama-server` serving a tiny GGUF the sim hub generated. Each passes its
health gate and testinfra, answers through the one front door by its model name, shows its engine in `status`,
and a second converge changes nothing; llama.cpp answers the official openai client with real tokens, `bench`
measures it beside its roofline, its watchdog heals it; a rollout switches spark-3 to vLLM and a rollback returns
it to llama.cpp with no download. The module leaves the fleet as the demo does (inventory/sim_front_door.py)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import pytest
import requests
from openai import OpenAI

from sparkfleet.contract import engines, paths

from .conftest import ROOT, api_port, converge, ssh
from .test_front_door import door_port
from tests.waiting import seconds_until  # noqa: I001

pytestmark = pytest.mark.e2e

INVENTORY = "inventory/sim_engines.py"
DEMO_INVENTORY = "inventory/sim_front_door.py"
SPARKS = ("spark-1", "spark-2", "spark-3")
USER, USER_KEY = "alice", "alice-0123456789abcdef"
BACKEND_KEY = "sim-key"
HEAL_WITHIN_S = 120
QUICK_WATCHDOG = {"watchdog_interval_s": 10, "watchdog_failures": 2}  # spark-3's: a pause heals in about 30 s


def engines_inventory(tmp_path) -> str:
    """inventory/sim_engines.py with a user on its front door (reached on the controller's published port) and a
    quick watchdog on spark-3."""
    door = {"front_door_users": {USER: USER_KEY}, "controller_front_door_url": f"http://127.0.0.1:{door_port()}",
            "front_door_allow_http": True}
    path = tmp_path / "engines.py"
    path.write_text(f"import runpy\n_sim = runpy.run_path({str(ROOT / INVENTORY)!r})\n"
                    f"sparks = [(n, {{**d, **({QUICK_WATCHDOG!r} if n == 'spark-3' else {{}})}}) "
                    "for n, d in _sim['sparks']]\n"
                    f"front_door = [(n, {{**d, **{door!r}}}) for n, d in _sim['front_door']]\n"
                    "monitoring = _sim.get('monitoring', [])\n")
    return str(path)


def plans(inventory: str) -> dict:
    """The inventory's plans as a converge makes them (the hub and the registry asked: the sim's small share of
    memory fits the models' real bytes, not the recipes' offline figures). Imported here, as conftest does: pyinfra's
    CLI, which the inventory loader imports, monkey-patches threading with gevent, which deadlocks an xdist worker
    that imports it at collection."""
    from sparkfleet.controller.inventory import load_hosts
    from sparkfleet.model.hubs import hub_resolver
    from sparkfleet.release.image import image_resolver
    from sparkfleet.release.plan import plan_hosts

    return {p.name: p for p in plan_hosts(load_hosts(str(ROOT / inventory)), resolve=hub_resolver,
                                          resolve_image=image_resolver)}


def sparkfleet(*args, timeout=900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparkfleet", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, check=False)


def engine_counter(state, host: str, engine: str) -> float:
    """The engine's generated-tokens counter, read on the host's loopback (the guard wants the key on the LAN)."""
    name = engines.metrics(engine).generation_tokens
    port = paths.engine_port(8000)
    text = ssh(state, host, f"curl -fsS -m 5 -H 'Authorization: Bearer {BACKEND_KEY}' "
                            f"http://127.0.0.1:{port}/metrics", check=False)
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


wait_until = functools.partial(seconds_until, step_s=2.0)  # the seconds until check() held


def answers(state, host: str, model: str) -> bool:
    try:
        reply = requests.post(f"http://127.0.0.1:{api_port(state, host)}/v1/chat/completions", timeout=10,
                              headers={"Authorization": f"Bearer {BACKEND_KEY}"},
                              json={"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        return reply.status_code == 200
    except requests.RequestException:
        return False


@pytest.fixture(scope="module")
def three_engines(sim_fleet, first_converge, tmp_path_factory):
    """The fleet converged on three engines; afterwards the default fleet (the one `make e2e` leaves up) is
    converged back to the demo's inventory (the other fleets are taken down after the run)."""
    inventory = engines_inventory(tmp_path_factory.mktemp("engines"))
    done = converge(inventory=inventory)
    assert done.returncode == 0, done.output[-6000:]
    yield sim_fleet, inventory, plans(inventory)
    if os.environ.get("SPARKFLEET_SIM_FLEET", "default") in ("", "default"):
        back = converge(inventory=DEMO_INVENTORY)
        assert back.returncode == 0, back.output[-4000:]


def test_each_engine_answers_through_the_front_door_by_model_name_and_a_second_converge_changes_nothing(
        three_engines):
    state, inventory, planned = three_engines
    assert {n: planned[n].settings.engine for n in SPARKS} == {"spark-1": "vllm", "spark-2": "sglang",
                                                                "spark-3": "llamacpp"}
    client = OpenAI(base_url=f"http://127.0.0.1:{door_port()}/v1", api_key=USER_KEY, max_retries=0, timeout=60)
    for host in SPARKS:
        p = planned[host]
        before = engine_counter(state, host, p.settings.engine)
        reply = client.chat.completions.create(model=p.settings.served_model_name, max_tokens=8,
                                               messages=[{"role": "user", "content": "Say hello."}])
        assert reply.usage.completion_tokens > 0, host
        assert engine_counter(state, host, p.settings.engine) > before, f"{host}'s engine did not generate it"
    again = converge(inventory=inventory)
    assert again.returncode == 0, again.output[-4000:]
    assert {h: ops for h, ops in again.changed.items() if ops} == {}


def test_llamacpp_is_real_and_answers_the_openai_client(three_engines):
    state, _, planned = three_engines
    s = planned["spark-3"].settings
    props = json.loads(ssh(state, "spark-3", f"curl -fsS -m 5 -H 'Authorization: Bearer {BACKEND_KEY}' "
                                             f"http://127.0.0.1:{paths.engine_port(s.api_port)}/props"))
    version = ssh(state, "spark-3", f"docker exec {s.container_name} llama-server --version 2>&1 || true")
    assert props["build_info"] and props["build_info"].split("-")[0].lstrip("b") in version, (props, version)
    client = OpenAI(base_url=f"http://127.0.0.1:{api_port(state, 'spark-3')}/v1", api_key=BACKEND_KEY,
                    max_retries=0, timeout=60)
    reply = client.chat.completions.create(model=s.served_model_name, max_tokens=16,
                                           messages=[{"role": "user", "content": "Tell me a story."}])
    assert reply.usage.completion_tokens > 0 and reply.choices[0].message.content
    with pytest.raises(Exception):  # the engine's own key check, behind the guard's
        OpenAI(base_url=f"http://127.0.0.1:{api_port(state, 'spark-3')}/v1", api_key="wrong-key-0123456789",
               max_retries=0, timeout=30).models.list()


def test_status_shows_each_engine_and_testinfra_passes(three_engines):
    state, inventory, planned = three_engines
    status = sparkfleet("status", inventory, "--json")
    assert status.returncode == 0, status.stdout[-3000:] + status.stderr[-3000:]
    rows = {row["host"]: row for row in json.loads(status.stdout)["hosts"]}
    assert {h: rows[h]["engine"] for h in SPARKS} == {h: planned[h].settings.engine for h in SPARKS}
    infra = subprocess.run([sys.executable, "-m", "pytest", "tests/infra", "--inventory", inventory, "-q",
                            "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert infra.returncode == 0, infra.stdout[-4000:]


def test_bench_measures_llamacpp_beside_its_roofline(three_engines, tmp_path):
    _, inventory, _ = three_engines
    proc = sparkfleet("bench", inventory, "--host", "spark-3", "--concurrency", "1", "--max-tokens", "32",
                      "--out", str(tmp_path), timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["single_stream_decode_tokens_per_s"] > 0
    assert result["roofline_tokens_per_s"] and result["decode_vs_roofline"] > 0
    assert "tokens/s" in proc.stdout


def test_a_paused_llamacpp_engine_is_healed_by_the_watchdog(three_engines):
    state, _, planned = three_engines
    s = planned["spark-3"].settings
    ssh(state, "spark-3", f"docker pause {s.container_name}")
    try:
        wait_until(lambda: not answers(state, "spark-3", s.served_model_name), 30)
        healed = wait_until(lambda: answers(state, "spark-3", s.served_model_name), HEAL_WITHIN_S,
                            explain=lambda: ssh(state, "spark-3", "cat /var/lib/sparkfleet/watchdog.json", check=False))
    finally:
        ssh(state, "spark-3", f"docker unpause {s.container_name} 2>/dev/null; true")
    assert healed < HEAL_WITHIN_S
    journal = ssh(state, "spark-3", "journalctl -u sparkfleet-watchdog.service --no-pager -n 50")
    assert "restart" in journal.lower()


def test_a_rollout_switches_spark3_to_vllm_and_a_rollback_returns_it_to_llamacpp_without_download(three_engines,
                                                                                                    tmp_path):
    state, inventory, planned = three_engines
    switched = tmp_path / "switched.py"
    switched.write_text(f"import runpy\n_e = runpy.run_path({inventory!r})\n"
                        f"_vllm = dict(runpy.run_path({str(ROOT / INVENTORY)!r})['sparks'])['spark-1']\n"
                        "sparks = [(n, {**_vllm, **{k: v for k, v in d.items() if k.startswith('ssh_') or k in "
                        "('lan_address', 'controller_api_url', 'fabric_address')}} if n == 'spark-3' else d)"
                        " for n, d in _e['sparks']]\n"
                        "front_door = _e['front_door']\nmonitoring = _e['monitoring']\n")
    hub = state["hub"]["controller_url"]
    rolled = sparkfleet("rollout", str(switched), "--limit", "spark-3", "--no-speed-gate", timeout=1200)
    assert rolled.returncode == 0, rolled.stdout[-3000:] + rolled.stderr[-3000:]
    record = json.loads(ssh(state, "spark-3", f"cat {paths.RELEASE_FILE}"))
    assert record["engine"] == "vllm" and record["previous"]["engine"] == "llamacpp"
    assert answers(state, "spark-3", plans(str(switched))["spark-3"].settings.served_model_name)
    counters = requests.get(f"{hub}/_sim/counters", timeout=10).json()
    back = sparkfleet("rollback", str(switched), "--limit", "spark-3", timeout=900)
    assert back.returncode == 0, back.stdout[-3000:] + back.stderr[-3000:]
    assert json.loads(ssh(state, "spark-3", f"cat {paths.RELEASE_FILE}"))["engine"] == "llamacpp"
    assert answers(state, "spark-3", planned["spark-3"].settings.served_model_name)
    assert requests.get(f"{hub}/_sim/counters", timeout=10).json() == counters, "the rollback downloaded"

