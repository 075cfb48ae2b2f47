"""The front door (HAProxy on door-1, a service host: no GPU, no Docker) in front of the simulated fleet: per-user keys, drain during a rollout,
health routing around a hung engine, cache affinity, status and bench. Probes go through the front door with
a user key, at 5 requests/s, alternating streaming and non-streaming chat, each with a 10 s limit and no retry.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from sparkfleet.contract.paths import VERIFIED_RECORD
from tools import bench_rollout

from tests.waiting import wait_until

from .conftest import HOSTS, ROOT, api_port, container, converge, fleet_out_of_step, ssh
from .paced import Paced

pytestmark = pytest.mark.e2e

MODEL = "Qwen3.5-35B-A3B"
USERS = {"alice": "alice-0123456789abcdef", "bob": "bob-0123456789abcdef"}
ENGINE_KEY = "sim-key"  # inventory/sim.py's api_key: the engines' key, which only the front door holds
DOOR = "door-1"  # the sim's service host: the front door of inventory/sim_front_door.py


def door_port() -> int:
    """The 127.0.0.1 port where door-1's front door port (8080) is published."""
    out = subprocess.run(["docker", "port", container(DOOR), "8080/tcp"], capture_output=True, text=True,
                         check=True).stdout
    return int(out.split()[0].rsplit(":", 1)[1])


def door_inventory(tmp_path, name: str, users: dict, everywhere: dict | None = None, door: dict | None = None) -> str:
    """inventory/sim_front_door.py (the Sparks, and door-1 in front_door and monitoring) with these users on the
    front door, `everywhere`'s settings on every host and `door`'s on door-1."""
    settings = {"front_door_users": users, "controller_front_door_url": f"http://127.0.0.1:{door_port()}",
                "drain_timeout_s": 30, "front_door_allow_http": True, **(everywhere or {}), **(door or {})}
    path = tmp_path / f"{name}.py"
    path.write_text(f"import runpy\n_sim = runpy.run_path({str(ROOT / 'inventory/sim_front_door.py')!r})\n"
                    f"sparks = [(n, {{**d, **{everywhere or {}!r}}}) for n, d in _sim['sparks']]\n"
                    f"front_door = [(n, {{**d, **{settings!r}}}) for n, d in _sim['front_door']]\n"
                    "monitoring = _sim['monitoring']\n")
    return str(path)


def deploy(inventory: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(ROOT / ".venv/bin/pyinfra"), "-y", inventory, "deploy.py", *extra], cwd=ROOT,
                          capture_output=True, text=True, timeout=900, check=False)


def sparkfleet(*args, timeout=900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparkfleet", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.fixture
def door(converged_fleet, tmp_path):
    """The fleet converged with its front door on door-1 (only door-1 changes: the engines keep their release)."""
    inventory = door_inventory(tmp_path, "door", USERS)
    done = deploy(inventory, "--limit", DOOR)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    url = f"http://127.0.0.1:{door_port()}"
    wait_until(lambda: backend_states(inventory) == {h: "in" for h in HOSTS}, 30)
    return inventory, url


def test_the_front_door_on_a_service_host_runs_no_gpu_stage_serves_the_fleet_and_converges_once(converged_fleet,
                                                                                                 tmp_path):
    """door-1 (a plain Debian box: no Docker, no nvidia-smi) converges as a service host: its own preflight, HAProxy,
    the front door; none of a Spark's stages. It serves chats to the three Sparks, and a second converge changes
    nothing."""
    inventory = door_inventory(tmp_path, "service-host", USERS)
    first = deploy(inventory, "--limit", DOOR)
    said = first.stdout + first.stderr
    assert first.returncode == 0, said[-4000:]
    assert "Front door | Front door answers on port 8080" in said, said[-3000:]  # (its preflight only reads)
    for spark_only in ("Preflight |", "Platform pins |", "NVIDIA Container Toolkit |", "Model |", "Service |",
                       "Health gate |", "Watchdog |", "docker", "nvidia"):
        assert spark_only not in said, (spark_only, said[-3000:])
    on_door = ssh(converged_fleet, DOOR, "command -v docker nvidia-smi nvidia-ctk; "
                                         "systemctl is-active sparkfleet-vllm sparkfleet-guard; "
                                         "systemctl is-active sparkfleet-front-door", check=False).split()
    assert on_door == ["inactive", "inactive", "active"], on_door  # no binary found, no engine, no guard
    url = f"http://127.0.0.1:{door_port()}"
    wait_until(lambda: backend_states(inventory) == {h: "in" for h in HOSTS}, 30)
    hello = [{"role": "user", "content": "hello from a service host"}]
    assert [chat(url, USERS["alice"], hello, stream)[0] for stream in (False, True, False)] == [200] * 3
    whole = converge(inventory=inventory)  # the Sparks gain their node exporters (door-1 monitors them)
    assert whole.returncode == 0, whole.output[-3000:]
    again = converge(inventory=inventory)  # the whole inventory: nothing changes, the door's stages come last
    assert again.returncode == 0, again.output[-3000:]
    assert {h: again.changed[h] for h in (*HOSTS, DOOR)} == {h: [] for h in (*HOSTS, DOOR)}
    point = again.order.index("The Sparks' stages done (the service hosts' follow)")
    assert all(not name.startswith(("Front door |", "Service host preflight |")) for name in again.order[:point])
    assert all(not name.startswith(("Watchdog |", "Guard | Guard enabled")) for name in again.order[point:])


def backend_states(inventory: str) -> dict[str, str]:
    proc = sparkfleet("status", inventory, "--json", timeout=120)
    door = json.loads(proc.stdout).get("front_door") or {}
    return {b["host"]: b["state"] for b in door.get("backends", [])}


def chat(url: str, key: str | None, messages: list, stream: bool, max_tokens: int = 8,
         timeout: float = 10) -> tuple[int, str, dict]:
    """(status, the whole body, the headers) of one chat completion; a streamed body is read to its end."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with requests.post(f"{url}/v1/chat/completions", headers=headers, timeout=timeout, stream=stream,
                       json={"model": MODEL, "messages": messages, "max_tokens": max_tokens,
                             "stream": stream}) as reply:
        body = reply.text if not stream else "".join(
            chunk.decode() for chunk in reply.iter_content(chunk_size=None))
        if stream and reply.status_code == 200 and "data: [DONE]" not in body:
            raise requests.ConnectionError("stream ended before [DONE]")
        return reply.status_code, body, dict(reply.headers)


class Probe(Paced):
    """Requests at a fixed rate through the front door, each on its own thread: (start, ok, why) per request."""

    def __init__(self, url: str, key: str, rate: float = 5.0):
        super().__init__(rate)
        self.url, self.key = url, key
        self.results: list[tuple[float, bool, str]] = []

    def one(self, n: int, started: float) -> None:
        messages = [{"role": "user", "content": f"probe {n}: say something"}]
        try:
            status, _, _ = chat(self.url, self.key, messages, stream=n % 2 == 0)
            ok, why = status == 200, f"HTTP {status}"
        except requests.RequestException as exc:
            ok, why = False, type(exc).__name__
        with self.lock:
            self.results.append((started, ok, why))

    @property
    def failures(self) -> list[tuple[float, bool, str]]:
        return [r for r in self.results if not r[1]]

    def answered(self) -> int:
        with self.lock:
            return len(self.results)

    def wait_for(self, n: int, what: str) -> None:
        """Until n more requests were answered (or failed): n / rate seconds of traffic, and each answer waited
        for, up to its own 10 s limit."""
        target = self.answered() + n
        wait_until(lambda: self.answered() >= target, n * self.interval + 30, what, step_s=0.2)


class DoorWatch(bench_rollout.DoorWatch):
    """door-1's front door polled on a thread (tools/bench_rollout.py's watch, over SSH), and the sim hub's byte
    count at the first departure."""

    def __init__(self, state: dict, hub: str):
        from sparkfleet.roles.front_door.records import runtime_command

        super().__init__(lambda: ssh(state, DOOR, runtime_command("show stat"), check=False), self._first)
        self.hub, self.hub_bytes_at_first_drain = hub, None

    def _first(self) -> None:
        self.hub_bytes_at_first_drain = hub_bytes(self.hub)


def hub_bytes(hub: str) -> int:
    return requests.get(f"{hub}/_sim/counters", timeout=10).json()["total_bytes"]


def fetched_s(stderr: str, host: str) -> float:
    """How long `host`'s model fetch took: the rollout's progress line ("fetched 12 files, 8.4 MB in 1 min 58 s")."""
    found = re.search(rf"^{host}: fetched \d+ files, .* in (?:(\d+) min )?(\d+) s$", stderr, re.M)
    assert found, stderr[-3000:]
    return 60 * int(found[1] or 0) + int(found[2])


def model_dirs(state: dict, root: str) -> dict[str, set[str]]:
    return {h: set(ssh(state, h, f"ls -A {shlex.quote(root)}").split()) for h in HOSTS}


def test_a_host_whose_disk_cannot_hold_old_and_new_halts_the_rollout_before_any_drain(door, sim_fleet, hub):
    """Issue 22: a new model commit, and spark-2's model disk (a tmpfs over its model root holding a copy of the
    running release, with room for half a model more) too small for the old release beside the new one. The
    staging fails there; the rollout halts before any host is drained (the front door polled), naming spark-2 and
    the disk; no host changes release. The disk, the hub, the lock and the other hosts' staged files are put
    back."""
    from .test_lock import lock, records, sim

    inventory, _ = door
    before = records(sim_fleet)
    running = before["spark-2"]["model_dir"]
    root = os.path.dirname(running)
    had = model_dirs(sim_fleet, root)
    used = int(ssh(sim_fleet, "spark-2", f"du -sb {shlex.quote(running)}").split()[0])
    original_lock = lock().read_bytes()
    sim("hub", "publish")
    small, copy = shlex.quote(root), shlex.quote(running)
    ssh(sim_fleet, "spark-2", f"cp -a {copy} /tmp/running && mount -t tmpfs -o size={used * 3 // 2} "
                              f"sparkfleet-sim-small {small} && mv /tmp/running {copy}")
    try:
        update = sparkfleet("update", inventory, timeout=300)
        assert update.returncode == 0, update.stderr[-3000:]
        with DoorWatch(sim_fleet, hub) as watch:
            proc = sparkfleet("rollout", inventory, "--batch", "1", "--json")
    finally:
        ssh(sim_fleet, "spark-2", f"umount {small}", check=False)
        lock().write_bytes(original_lock)
        sim("hub", "unpublish")
        for h, dirs in model_dirs(sim_fleet, root).items():  # what the other hosts staged for the gone commit
            made = [f"{small}/{shlex.quote(d)}" for d in sorted(dirs - had[h])]
            ssh(sim_fleet, h, f"rm -rf {' '.join(made)} {small}/.staging/*")
    assert proc.returncode != 0, proc.stdout[-2000:]
    hosts = {h["host"]: h for h in json.loads(proc.stdout)["hosts"]}
    assert [hosts[h]["result"] for h in HOSTS] == ["not reached", "failed", "not reached"], hosts
    assert re.search(r"^stage: failed on spark-2 after [\d.]+ s: halted, no host drained$", proc.stderr, re.M)
    disk = re.search(r"^stage: spark-2: free disk at .*: found [\d.]+ MiB, required [\d.]+ MiB for the model files "
                     r"still to fetch", proc.stderr, re.M)
    assert disk, proc.stderr[-3000:]
    assert hosts["spark-2"]["detail"].startswith("staging failed: spark-2: free disk at "), hosts["spark-2"]
    assert watch.left == {}, watch.left  # nobody was drained
    assert records(sim_fleet) == before
    assert backend_states(inventory) == {h: "in" for h in HOSTS}


def test_rollout_batch_1_stages_a_new_model_everywhere_first_and_fails_no_request_through_the_front_door(
        door, sim_fleet, hub):
    """Issue 22's staged rollout: a new commit of the chat model (sim hub publish, then `sparkfleet update`), the
    hub throttled so that the seed's fetch takes minutes; `rollout --batch 1` fetches and verifies it on every host
    before the first drain (the switch fetches nothing), so each host is out of the front door's rotation (its
    state, polled) for at most half that fetch; users' chats through it fail none. The lock, the hub and the
    release are put back (one converge, no fetch)."""
    from .test_lock import lock, records, sim
    from .test_rollout import hub_throttle

    inventory, url = door
    before = records(sim_fleet)
    old_dir = before["spark-1"]["model_dir"]
    sizes = ssh(sim_fleet, "spark-1", f"find {shlex.quote(old_dir)} -type f -printf '%s\\n'").split()
    original_lock = lock().read_bytes()
    sim("hub", "publish")
    try:
        update = sparkfleet("update", inventory, timeout=300)
        assert update.returncode == 0, update.stderr[-3000:]
        hub_throttle(hub, max(1, max(int(n) for n in sizes) // 60))  # the largest file alone takes 60 s
        with Probe(url, USERS["alice"]) as probe, DoorWatch(sim_fleet, hub) as watch:
            probe.wait_for(15, "requests through the door before the rollout")  # 3 s of them at 5/s
            proc = sparkfleet("rollout", inventory, "--batch", "1", "--json")
            probe.wait_for(15, "requests through the door after the rollout")  # on every host, the last one back
        hub_throttle(hub, None)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        report = json.loads(proc.stdout)
        after = records(sim_fleet)
        new_dir = after["spark-1"]["model_dir"]
        record = shlex.quote(f"{new_dir}/{VERIFIED_RECORD}")
        verified = {h: float(ssh(sim_fleet, h, f"stat -c %Y {record}")) for h in HOSTS}
        hub_bytes_after = hub_bytes(hub)
    finally:
        hub_throttle(hub, None)
        lock().write_bytes(original_lock)
        sim("hub", "unpublish")
        back = deploy(inventory)  # every host back on the release it had, its files kept: nothing to fetch
    fetch_s = fetched_s(proc.stderr, "spark-1")  # the seed's, from the hub; its peers fetch from it on the LAN
    print(f"staged rollout: {probe.seconds:.0f} s, the seed's fetch {fetch_s:g} s, phases {report['phases']}, out of "
          f"rotation (front door) {watch.out_s()}, (report) {[h['out_of_rotation_s'] for h in report['hosts']]}; "
          f"{len(probe.failures)} of {len(probe.results)} requests failed")
    assert back.returncode == 0, back.stdout[-3000:] + back.stderr[-3000:]
    wait_until(lambda: backend_states(inventory) == {h: "in" for h in HOSTS}, 60)
    assert {h["host"]: h["result"] for h in report["hosts"]} == {**{h: "converged" for h in HOSTS}, DOOR: "unchanged"}
    assert new_dir != old_dir and all(after[h]["model_dir"] == new_dir for h in HOSTS)
    assert report["phases"]["stage"]["hosts"] == list(HOSTS) and report["phases"]["switch"]["batches"] == 3
    assert fetch_s >= 30 and report["phases"]["stage"]["seconds"] >= fetch_s
    assert "stage: spark-1, spark-2, spark-3: the new release prepared" in proc.stderr
    first_drain = min(watch.left.values())
    assert all(verified[h] <= first_drain for h in HOSTS), (verified, first_drain)
    assert hub_bytes_after == watch.hub_bytes_at_first_drain  # the switch fetched nothing from the hub
    assert sorted(watch.out_s()) == list(HOSTS) and max(watch.out_s().values()) <= fetch_s / 2, watch.out_s()
    switched = [h for h in report["hosts"] if h["host"] in HOSTS]  # the service host is never out of rotation
    assert all(0 < h["out_of_rotation_s"] <= fetch_s / 2 for h in switched), report["hosts"]
    assert len(probe.results) >= 4 * probe.seconds - 5, (len(probe.results), probe.seconds)
    assert probe.failures == [], f"{len(probe.failures)} of {len(probe.results)} failed: {probe.failures[:5]}"
    assert {h: r["release_id"] for h, r in records(sim_fleet).items()} == \
        {h: r["release_id"] for h, r in before.items()}


def answers_fault(tmp_path, fault: str) -> str:
    """The door's inventory with the Sparks' stand-ins answering badly (engine_env SIM_ANSWER_FAULT, beside the
    inventory's own SIM_* knobs): a new release that passes the health gate."""
    path = tmp_path / f"answers-{fault}.py"
    path.write_text(Path(door_inventory(tmp_path, f"door-{fault}", USERS)).read_text() +
                    f"sparks = [(n, {{**d, 'engine_env': {{**d['engine_env'], 'SIM_ANSWER_FAULT': {fault!r}}}}})"
                    " for n, d in sparks]\n")
    return str(path)


def test_a_release_that_answers_wrong_is_stopped_at_the_canary_and_fails_no_request_through_the_front_door(
        door, sim_fleet, tmp_path):
    """Issue 52's quality gate under users' load: a release whose stand-in gives other answers (SIM_ANSWER_FAULT
    wrong) passes spark-1's health and speed gates, is evaluated there while drained against the running release's
    answers, and is rolled back: the rollout halts in one line naming a probe and both answers. Then one whose tool
    calls parse but break their schema (tool_args: the health gate's tool-call check passes) halts naming a tool
    probe. No host changes release, spark-1 answers as before (eval against the baseline the first rollout kept), no
    chat through the door fails; spark-1's quality and speed records are put back."""
    from sparkfleet.contract.paths import QUALITY_FILE, SPEED_FILE

    from .test_lock import records

    inventory, url = door
    before = records(sim_fleet)
    kept = " ".join(shlex.quote(f) for f in (QUALITY_FILE, SPEED_FILE))
    ssh(sim_fleet, "spark-1", f"for f in {kept}; do rm -f $f.e2e; [ ! -e $f ] || cp -a $f $f.e2e; done")
    found, took = {}, {}
    try:
        with Probe(url, USERS["alice"]) as probe:
            probe.wait_for(10, "requests through the door before the rollouts")
            for fault in ("wrong", "tool_args"):
                started = time.monotonic()
                found[fault] = sparkfleet("rollout", answers_fault(tmp_path, fault), "--batch", "1", "--json")
                took[fault] = time.monotonic() - started
            probe.wait_for(10, "requests through the door after the rollouts")
        again = sparkfleet("eval", inventory, "--limit", "spark-1", "--json", timeout=300)
    finally:
        ssh(sim_fleet, "spark-1", f"for f in {kept}; do if [ -e $f.e2e ]; then mv -f $f.e2e $f; else rm -f $f; fi; "
                                  "done")
    named = {}
    for fault, proc in found.items():
        assert proc.returncode == 1, proc.stderr[-3000:]
        report = json.loads(proc.stdout)
        hosts = {h["host"]: h for h in report["hosts"]}
        [check] = report["quality_gate"]["checks"]
        assert (check["host"], check["verdict"], report["quality_gate"]["skipped"]) == ("spark-1", "regressed", False)
        assert report["speed_gate"]["checks"][0]["verdict"] in ("passed", "baseline"), report["speed_gate"]
        [line] = [ln for ln in proc.stderr.splitlines() if ln.startswith("quality gate: spark-1: ") and "fails now" in
                  ln]
        probe_id = re.search(r": probe (\S+) passed in the baseline and fails now \(", line)
        assert probe_id and re.search(r'before ".*", now ".*"; rolled back; halted; override with --no-quality-gate '
                                      r"\([\d.]+ s\)$", line), line
        named[fault] = probe_id[1]
        assert hosts["spark-1"]["result"] == "rolled back" and "previous release restored" in hosts["spark-1"]["detail"]
        assert [hosts[h]["result"] for h in HOSTS[1:]] == ["not reached"] * 2, hosts
        assert all("quality gate" in hosts[h]["detail"] for h in HOSTS[1:]), hosts
        print(f"rollout with answers {fault}: halted by the quality gate in {took[fault]:.0f} s; the gate's "
              f"evaluations took {check['seconds']} s (baseline: {check['baseline']['source']}): {line}")
    assert named["wrong"] in ("arithmetic", "extraction"), named  # the exact probes: another answer than before
    assert named["tool_args"].startswith("tool-"), named
    assert {h: r["release_id"] for h, r in records(sim_fleet).items()} == \
        {h: r["release_id"] for h, r in before.items()}
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]  # spark-1 answers as before the rollouts
    assert [m["verdict"] for h in json.loads(again.stdout)["hosts"] for m in h["models"]] == ["passed"]
    assert len(probe.results) >= 4 * probe.seconds - 5, (len(probe.results), probe.seconds)
    assert probe.failures == [], f"{len(probe.failures)} of {len(probe.results)} failed: {probe.failures[:5]}"
    assert fleet_out_of_step(sim_fleet) == {}
    assert backend_states(inventory) == {h: "in" for h in HOSTS}


def test_a_rollout_killed_after_its_first_drain_leaves_nothing_out_after_the_next_converge(door, sim_fleet, tmp_path):
    """Issue 22: the controller's process killed (SIGKILL, its whole group) right after a batch was drained."""
    inventory, url = door
    changed = door_inventory(tmp_path, "changed", USERS, {"max_model_len": 131072})
    with Probe(url, USERS["alice"]) as probe:
        rollout = subprocess.Popen([sys.executable, "-m", "sparkfleet", "rollout", changed, "--batch", "1"], cwd=ROOT,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                   start_new_session=True)
        try:
            seen = next((line for line in iter(rollout.stderr.readline, "") if line.startswith("front door: ")
                         and line.rstrip().endswith(" out")), None)  # the first batch is out: kill it now
        finally:
            os.killpg(rollout.pid, signal.SIGKILL)
            rollout.wait()
            rollout.stderr.close()
        assert seen, "the rollout drained nothing"
        drained = seen.split()[2]
        status = sparkfleet("status", inventory, "--json", timeout=120)
        assert status.returncode != 0, status.stdout[-3000:]
        [out] = json.loads(status.stdout)["front_door"]["out_of_rotation"]
        assert (out["host"], out["held"]) == (drained, False), out
        assert out["reason"].startswith(f"held by a rollout that is gone (rollout pid {rollout.pid} "), out
        again = converge(inventory=inventory)
        assert again.returncode == 0, again.output[-4000:]
        assert any(op.startswith(f"Front door | {drained} back in") for op in again.changed[DOOR]), again.changed
        wait_until(lambda: backend_states(inventory) == {h: "in" for h in HOSTS}, 60)
    print(f"killed rollout: {len(probe.results)} requests in {probe.seconds:.0f} s, {len(probe.failures)} failed")
    assert probe.failures == [], f"{len(probe.failures)} of {len(probe.results)} failed: {probe.failures[:5]}"
    assert fleet_out_of_step(sim_fleet) == {}  # every host on the release it was planned, serving
    assert sparkfleet("status", inventory, "--json", timeout=120).returncode == 0


def prefix_counters(state) -> tuple[float, float]:
    """The fleet's (hits, queries) of vLLM's prefix cache, summed over the hosts' /metrics."""
    hits = queries = 0.0
    for host in HOSTS:
        text = requests.get(f"http://127.0.0.1:{api_port(state, host)}/metrics", timeout=5,
                            headers={"Authorization": f"Bearer {ENGINE_KEY}"}).text
        for line in text.splitlines():
            if line.startswith("vllm:prefix_cache_hits_total"):
                hits += float(line.rsplit(" ", 1)[1])
            elif line.startswith("vllm:prefix_cache_queries_total"):
                queries += float(line.rsplit(" ", 1)[1])
    return hits, queries


def conversations_hit_rate(state, salt: str, route) -> float:
    """20 conversations of 5 turns sharing a long system prompt, turn t of conversation c sent where
    route(c, t) says ((url, key)); the fleet's prefix-cache hit rate over them."""
    system = {"role": "system", "content": f"{salt} " + " ".join(f"rule {n}: answer in plain words." for n in
                                                                  range(150))}
    before = prefix_counters(state)

    def conversation(c: int) -> None:
        messages = [system, {"role": "user", "content": f"{salt} conversation {c}: tell me about Sparks"}]
        for t in range(5):
            url, key = route(c, t)
            status, body, _ = chat(url, key, messages, stream=False, max_tokens=16, timeout=30)
            assert status == 200, body
            messages += [json.loads(body)["choices"][0]["message"], {"role": "user", "content": f"and turn {t}?"}]

    threads = [threading.Thread(target=conversation, args=(c,)) for c in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    after = prefix_counters(state)
    return (after[0] - before[0]) / (after[1] - before[1])


def test_conversations_keep_their_prefix_cache_through_the_front_door(door, sim_fleet):
    _, url = door
    direct = [f"http://127.0.0.1:{api_port(sim_fleet, h)}" for h in HOSTS]
    one_host = conversations_hit_rate(sim_fleet, "one-host", lambda c, t: (direct[0], ENGINE_KEY))
    round_robin = conversations_hit_rate(sim_fleet, "round-robin",
                                         lambda c, t: (direct[(c * 5 + t) % 3], ENGINE_KEY))
    front_door = conversations_hit_rate(sim_fleet, "front-door", lambda c, t: (url, USERS["bob"]))
    print(f"prefix-cache hit rate: one host {one_host:.3f}, round robin {round_robin:.3f}, "
          f"front door {front_door:.3f}")
    assert front_door >= 0.9 * one_host
    assert front_door > round_robin


def test_a_removed_user_is_refused_after_one_converge_and_no_reply_carries_the_engine_key(door, tmp_path):
    inventory, url = door
    hello = [{"role": "user", "content": "hello"}]
    replies = [chat(url, USERS[user], hello, stream) for user in USERS for stream in (False, True)]
    assert [status for status, _, _ in replies] == [200] * 4
    assert chat(url, ENGINE_KEY, hello, False)[0] == 401  # the engines' key does not open the front door
    assert chat(url, None, hello, False)[0] == 401
    without_bob = door_inventory(tmp_path, "without-bob", {"alice": USERS["alice"]})
    done = deploy(without_bob, "--limit", DOOR)
    assert done.returncode == 0, done.stderr[-3000:]
    assert chat(url, USERS["bob"], hello, False)[0] == 401
    after = [chat(url, USERS["alice"], hello, stream) for stream in (False, True)]
    assert [status for status, _, _ in after] == [200, 200]
    for status, body, headers in replies + after:
        assert ENGINE_KEY not in body and ENGINE_KEY not in json.dumps(headers)
    for secret in (*USERS.values(), ENGINE_KEY):
        assert secret not in done.stdout + done.stderr
    again = deploy(inventory, "--limit", DOOR)  # bob back, as the other tests expect
    assert again.returncode == 0, again.stderr[-3000:]


def test_status_shows_the_front_door_and_fails_when_it_is_down(door, sim_fleet, tmp_path):
    inventory, url = door
    proc = sparkfleet("status", inventory, "--json", timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    front = json.loads(proc.stdout)["front_door"]
    assert front["url"] == url
    assert front["backends"] == [{"host": h, "state": "in"} for h in HOSTS]
    bench = sparkfleet("bench", inventory, "--front-door", "--concurrency", "1", "--requests", "2",
                       "--max-tokens", "8", "--out", str(tmp_path / "bench-front-door"))
    assert bench.returncode == 0, bench.stdout[-2000:] + bench.stderr[-2000:]
    assert url in bench.stdout
    ssh(sim_fleet, DOOR, "systemctl stop sparkfleet-front-door")
    try:
        down = sparkfleet("status", inventory, "--json", timeout=120)
        assert down.returncode != 0
        assert json.loads(down.stdout)["front_door"]["up"] is False
    finally:
        ssh(sim_fleet, DOOR, "systemctl start sparkfleet-front-door")


# --- drain / undrain (issue 21). Written without a simulator to run it on: the integrator runs it first. -----


def routed_to(sim_fleet, host: str) -> int:
    """Requests door-1's front door has sent to `host` (HAProxy's stot of engines/HOST; checks not counted)."""
    stat = ssh(sim_fleet, DOOR,
               "echo 'show stat' | socat stdio UNIX-CONNECT:/run/sparkfleet-front-door/admin.sock")
    return next(int(row["stot"]) for row in csv.DictReader(io.StringIO(stat.lstrip("# ")))
                if row["pxname"] == "engines" and row["svname"] == host)


def test_a_drained_host_stays_out_through_converges_reloads_and_restarts_until_undrained(door, sim_fleet):
    inventory, url = door
    assert converge(inventory=inventory).returncode == 0  # the baseline: this inventory, converged
    drained = sparkfleet("drain", inventory, "spark-2", "--json", timeout=300)
    assert drained.returncode == 0, drained.stderr[-2000:]
    assert json.loads(drained.stdout)["front_doors"] == [{"host": DOOR, "state": "drained"}]
    try:
        again = converge(inventory=inventory)
        assert again.returncode == 0 and all(again.changed[h] == [] for h in HOSTS), again.changed
        for how in ("reload", "restart"):
            ssh(sim_fleet, DOOR, f"systemctl {how} sparkfleet-front-door")
            wait_until(lambda: backend_states(inventory).get("spark-2") == "drained", 30)
        before = routed_to(sim_fleet, "spark-2")
        for n in range(12):
            assert chat(url, USERS["alice"], [{"role": "user", "content": f"drained {n}"}], stream=False)[0] == 200
        assert routed_to(sim_fleet, "spark-2") == before
        status = sparkfleet("status", inventory, "--json", timeout=120)  # drained is not unhealthy
        assert status.returncode == 0, status.stdout[-3000:] + status.stderr[-2000:]
        assert {"host": "spark-2", "state": "drained"} in json.loads(status.stdout)["front_door"]["backends"]
    finally:
        undrained = sparkfleet("undrain", inventory, "spark-2", "--json", timeout=300)
    assert undrained.returncode == 0, undrained.stderr[-2000:]
    assert json.loads(undrained.stdout)["drained"] is False
    wait_until(lambda: backend_states(inventory) == {h: "in" for h in HOSTS}, 60)
    before = routed_to(sim_fleet, "spark-2")
    for n in range(12):  # twelve conversations: the hash sends some to spark-2
        assert chat(url, USERS["alice"], [{"role": "user", "content": f"back {n}"}], stream=False)[0] == 200
    assert routed_to(sim_fleet, "spark-2") > before


def test_usage_is_counted_per_user_and_a_user_past_their_rate_gets_429_while_others_are_served(
        converged_fleet, tmp_path):
    import openai

    carol = "carol-0123456789abcdef"
    users = {**USERS, "carol": {"key": carol, "requests_per_minute": 4}}
    inventory = door_inventory(tmp_path, "usage", users, door={"monitoring_scrape_interval_s": 5})
    done = deploy(inventory, "--limit", DOOR)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    url = f"http://127.0.0.1:{door_port()}"
    wait_until(lambda: backend_states(inventory) == {h: "in" for h in HOSTS}, 30)

    def client(key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=30)

    def usage_now() -> tuple[dict, str]:
        done = sparkfleet("usage", inventory, "--json", timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout)["users"], done.stdout

    start, _ = usage_now()  # the door keeps its counts across converges and restarts: earlier tests' are in them

    def grew(found: dict, user: str, field: str, model: str | None = None) -> int:
        def of(users: dict) -> int:
            row = users.get(user, {})
            return (row.get("models", {}).get(model, {}) if model else row).get(field, 0)
        return of(found) - of(start)

    def ask(key: str, n: int, stream: bool = False):
        reply = client(key).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"usage question {n}"}], max_tokens=8, stream=stream)
        return list(reply) if stream else reply

    alice = [ask(USERS["alice"], n) for n in range(5)]
    bob = [ask(USERS["bob"], n) for n in range(2)] + [ask(USERS["bob"], 2, stream=True)]
    assert all(r.usage.completion_tokens for r in alice) and bob[-1]
    for n in range(4):
        ask(carol, n)
    with pytest.raises(openai.RateLimitError) as refused:
        ask(carol, 4)
    assert refused.value.response.headers["retry-after"] == "60"
    assert ask(USERS["alice"], 5).usage.completion_tokens  # still served

    def reported():  # the door reports what its snapshot holds: written every 5 s (files/sparkfleet-usage-save)
        users, text = usage_now()
        return (users, text) if grew(users, "alice", "requests") >= 6 and grew(users, "carol", "limited") else None

    found, shown = wait_until(reported, 30, "the usage snapshot holds every request", step_s=1)
    assert grew(found, "alice", "requests") >= 5 and grew(found, "bob", "requests") >= 3
    assert grew(found, "alice", "prompt_tokens", MODEL) >= sum(r.usage.prompt_tokens for r in alice) > 0
    assert grew(found, "alice", "completion_tokens") >= sum(r.usage.completion_tokens for r in alice) > 0
    # not the stream
    assert grew(found, "bob", "completion_tokens") == sum(r.usage.completion_tokens for r in bob[:2]) > 0
    assert grew(found, "carol", "requests") == 4 and grew(found, "carol", "limited") == 1
    for key in (*USERS.values(), carol, ENGINE_KEY):
        assert key not in shown
    table = sparkfleet("usage", inventory, timeout=120)
    assert table.returncode == 0 and "carol" in table.stdout and MODEL in table.stdout

    def in_prometheus() -> dict[str, int]:  # the same counters, as door-1's Prometheus scraped them
        query = shlex.quote("query=sum by (user) (sparkfleet_user_requests_total)")
        answer = json.loads(ssh(converged_fleet, DOOR, "curl -fsS --get --data-urlencode "
                                f"{query} http://127.0.0.1:9090/api/v1/query"))
        return {r["metric"]["user"]: int(float(r["value"][1])) for r in answer["data"]["result"]}

    counted = {name: found[name]["requests"] for name in ("alice", "bob", "carol")}
    wait_until(lambda: {n: in_prometheus().get(n) for n in counted} == counted, 60)
