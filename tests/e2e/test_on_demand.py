"""Several models on one Spark: the host's vLLM model and the real llama.cpp always on, two vLLM models on demand
(started by their first request through the front door, stopped after their idle time, the least recently used one
stopped to make room for the other), with the watchdog, `status` and a converge leaving an idle one alone."""

from __future__ import annotations

import json
import time

from openai import OpenAI

from sim import fleet
from tests.e2e.conftest import converge, sparkfleet, ssh, started_at
from tests.waiting import wait_until

HOST = "spark-1"
IDLE_S = 20
LOAD_S = 3  # the vLLM stand-in's load time (its knob: the host's knob file wins over SIM_LOAD_DELAY_S)
RESIDENT_S = 10  # on_demand_min_resident_s: a model asked through the door serves this long before it may be stopped


def active(state: dict, *units: str) -> list[str]:
    return ssh(state, HOST, f"systemctl is-active {' '.join(units)} || true").split()


def watchdog_state(state: dict, name: str) -> dict:
    """The watchdog's record of one service (each tick counts a probe and writes its last action)."""
    return json.loads(ssh(state, HOST, f"cat /var/lib/sparkfleet/watchdog-{name}.json"))


def test_always_on_and_on_demand_models_share_one_spark(converged_fleet, tmp_path):
    from .test_front_door import USERS, deploy, door_inventory, door_port

    hub, images = converged_fleet["hub"], converged_fleet["engine_images"]
    on_demand = {"recipe": "qwen3.5-35b-a3b-fp8", "gpu_memory_utilization": 0.32, "max_model_len": 4096,
                 "on_demand": True, "on_demand_idle_s": IDLE_S}
    services = {
        "llama": {"recipe": "qwen3-8b-gguf", "model_repo": hub["gguf_repo"], "model_files": list(hub["gguf_files"]),
                  "engine_image": images["llamacpp"], "llamacpp_version": images["llamacpp"].rpartition("-b")[2],
                  "served_model_name": "tiny-llama", "max_model_len": 2048, "api_port": 8005},
        # each fits beside the always-on pair (0.4 + llama's + 0.32), both together do not (> 0.95)
        "long": {**on_demand, "served_model_name": "Qwen3.5-35B-A3B-long", "api_port": 8003},
        "short": {**on_demand, "served_model_name": "Qwen3.5-35B-A3B-short", "api_port": 8004},
    }
    base = door_inventory(tmp_path, "door", USERS)
    several = tmp_path / "several.py"

    def write(services: dict) -> str:
        several.write_text(
            f"import runpy\n_d = runpy.run_path({base!r})\n"
            f"_own = {{'services': {services!r}, 'gpu_memory_utilization': 0.4, 'watchdog_interval_s': 5, "
            f"'on_demand_min_resident_s': {RESIDENT_S}}}\n"
            f"sparks = [(n, {{**d, **_own}} if n == {HOST!r} else d) for n, d in _d['sparks']]\n"
            "front_door = _d['front_door']\nmonitoring = _d['monitoring']\n")
        return str(several)

    inventory = write(services)
    fleet.set_engine(HOST, load_delay_s=LOAD_S)
    try:
        first = converge(inventory=inventory)
        assert first.returncode == 0 and not any(first.failed.values()), first.output[-5000:]
        client = OpenAI(base_url=f"http://127.0.0.1:{door_port()}/v1", api_key=USERS["alice"], max_retries=0)
        listed = sorted(m.id for m in client.models.list().data)  # the stopped ones too
        assert listed == ["Qwen3.5-35B-A3B", "Qwen3.5-35B-A3B-long", "Qwen3.5-35B-A3B-short", "tiny-llama"], listed
        for model in ("Qwen3.5-35B-A3B", "tiny-llama"):  # always on: vLLM (the stand-in) and llama.cpp (real)
            reply = client.chat.completions.create(model=model, max_tokens=4,
                                                   messages=[{"role": "user", "content": "hello"}])
            assert reply.model == model and reply.usage.completion_tokens > 0, reply

        # after the health gate started each once, both idle out; the sockets keep listening
        wait_until(lambda: active(converged_fleet, "sparkfleet-vllm-long", "sparkfleet-vllm-short") ==
                   ["inactive", "inactive"], 90, "both on-demand models stopped after their idle time")
        assert active(converged_fleet, "sparkfleet-ondemand-long.socket", "sparkfleet-ondemand-short.socket") == [
            "active", "active"]
        always = (started_at(converged_fleet, HOST), ssh(converged_fleet, HOST,
                                                         "docker inspect -f '{{.State.StartedAt}}' vllm-llama"))

        # the first request to a stopped model is held while it starts, then streamed
        asked = time.monotonic()
        stream = client.chat.completions.create(model="Qwen3.5-35B-A3B-long", max_tokens=8, stream=True,
                                                messages=[{"role": "user", "content": "wake up"}])
        first_token = next(c for c in stream if c.choices and (c.choices[0].delta.content
                                                               or getattr(c.choices[0].delta, "reasoning", None)))
        answered = time.monotonic()
        waited = answered - asked
        print(f"\nfirst token from the stopped on-demand model after {waited:.2f} s (load time {LOAD_S} s)")
        assert first_token and LOAD_S <= waited < 60, waited
        assert active(converged_fleet, "sparkfleet-vllm-long") == ["active"]

        # the other on-demand model does not fit beside it: the least recently used on-demand one makes room, once
        # it has served its minimum residency (the request waits for the rest, then is answered)
        since = ssh(converged_fleet, HOST, "date +%s")
        reply = client.chat.completions.create(model="Qwen3.5-35B-A3B-short", max_tokens=4,
                                               messages=[{"role": "user", "content": "hello"}])
        assert reply.usage.completion_tokens > 0
        assert time.monotonic() - answered >= RESIDENT_S - 2  # long began serving just before its first token
        waits = ssh(converged_fleet, HOST, f"journalctl -u sparkfleet-vllm-short --since @{since} --no-pager -o cat"
                                           " | grep -F ' waits ' || true")
        assert ("sparkfleet-vllm-short.service waits" in waits and "sparkfleet-vllm-long.service has served for"
                in waits and f"stays at least {RESIDENT_S} s (on_demand_min_resident_s)" in waits), waits
        assert active(converged_fleet, "sparkfleet-vllm-long", "sparkfleet-vllm-short") == ["inactive", "active"]
        room = ssh(converged_fleet, HOST, f"journalctl -u sparkfleet-vllm-short --since @{since} --no-pager -o cat"
                                          " | grep -F 'to make room' || true")
        assert "stopping sparkfleet-vllm-long.service (on demand, the least recently used)" in room, room
        assert (started_at(converged_fleet, HOST), ssh(converged_fleet, HOST, "docker inspect -f "
                "'{{.State.StartedAt}}' vllm-llama")) == always  # no always-on engine was stopped for it

        # idle again: neither the watchdog (a probe every 5 s) nor status counts the stop as a problem
        wait_until(lambda: active(converged_fleet, "sparkfleet-vllm-short") == ["inactive"], 90,
                   "the on-demand model stopped after its idle time")
        # a watchdog tick after the stop (a probe every 5 s) that saw it stopped: the window in which it would
        # have restarted it
        ticks = watchdog_state(converged_fleet, "short")["probes"]
        wait_until(lambda: (w := watchdog_state(converged_fleet, "short"))["probes"] > ticks
                   and w["last_action"] == "idle-stopped", 30, "a watchdog tick after the stop")
        assert active(converged_fleet, "sparkfleet-vllm-short", "sparkfleet-vllm-long") == ["inactive", "inactive"]
        assert '"last_action": "idle-stopped"' in ssh(converged_fleet, HOST,
                                                      "cat /var/lib/sparkfleet/watchdog-short.json")
        status = sparkfleet("status", inventory, "--json")
        row = next(r for r in json.loads(status.stdout)["hosts"] if r["host"] == HOST)
        assert status.returncode == 0 and row["healthy"], status.stdout[-3000:]
        states = {name: (svc.get("state"), svc["serving"]) for name, svc in row["ssh"]["services"].items()}
        assert states["long"] == states["short"] == ("idle-stopped", True), states
        assert row["ssh"]["services"]["long"]["last_request_s"] is not None

        # a new release of one model (its context) touches no other engine, and a converge after it changes nothing
        services["short"]["max_model_len"] = 2048
        changed = converge(inventory=write(services))
        assert changed.returncode == 0 and not any(changed.failed.values()), changed.output[-5000:]
        assert (started_at(converged_fleet, HOST), ssh(converged_fleet, HOST, "docker inspect -f "
                "'{{.State.StartedAt}}' vllm-llama")) == always
        assert active(converged_fleet, "sparkfleet-vllm-long") == ["inactive"]  # idle-stopped, left so
        again = converge(inventory=inventory)
        assert again.returncode == 0 and not any(again.changed.values()), again.changed
    finally:
        fleet.set_engine(HOST, load_delay_s=2)  # the stand-in's default
        back = deploy(base)
    assert back.returncode == 0, back.stdout[-3000:] + back.stderr[-3000:]
    assert ssh(converged_fleet, HOST, "ls /etc/systemd/system | grep -c '^sparkfleet-ondemand-' || true") == "0"
