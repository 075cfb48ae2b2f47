"""Rolling a release across the simulated fleet: batches, a live probe, rollback, halts, status."""

import json
import re
import shlex
import threading
import time
import urllib.request

import pytest
import requests

from .conftest import (INVENTORY, HOSTS, api_port, chat_tokens, converge, fleet_out_of_step, sparkfleet, ssh,
                       started_at, variant)

pytestmark = pytest.mark.e2e


def served_max_len(state, host) -> int | None:
    port = api_port(state, host)
    try:
        reply = requests.get(f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": "Bearer sim-key"},
                             timeout=3)
        return reply.json()["data"][0]["max_model_len"]
    except (requests.RequestException, ValueError, KeyError):
        return None


def answers_chat(state, host) -> bool:
    return chat_tokens(state, host) >= 1


class Probe(threading.Thread):
    """Counts, over and over, how many hosts answer a chat completion."""

    def __init__(self, state):
        super().__init__(daemon=True)
        self.state, self.counts, self.stop = state, [], threading.Event()

    def run(self):
        while not self.stop.is_set():
            self.counts.append(sum(answers_chat(self.state, h) for h in HOSTS))
            time.sleep(0.2)


def report(proc) -> dict:
    return {h["host"]: h for h in json.loads(proc.stdout)["hosts"]}


@pytest.fixture
def serving_fleet(sim_fleet, first_converge):
    """Every host serving a release of record, whichever (a test that reads the release it starts from needs
    no converge back to inventory/sim.py's); converged first only when one does not answer."""
    def serving(h):
        recorded = ssh(sim_fleet, h, "test -s /etc/sparkfleet/release.json && echo yes", check=False) == "yes"
        return recorded and answers_chat(sim_fleet, h)

    if not all(serving(h) for h in HOSTS):
        again = converge()
        assert again.returncode == 0, again.output[-4000:]
        assert all(serving(h) for h in HOSTS)
    return sim_fleet


def test_new_release_rolls_in_batches_of_one_while_two_hosts_serve(sim_fleet, converged_fleet, tmp_path):
    probe = Probe(sim_fleet)
    probe.start()
    try:
        proc = sparkfleet("rollout", variant(tmp_path, "longer", {"max_model_len": 131072}), "--batch", "1",
                          "--json")
    finally:
        probe.stop.set()
        probe.join(10)
    assert proc.returncode == 0, proc.stderr[-3000:]
    hosts = report(proc)
    assert [hosts[h]["result"] for h in HOSTS] == ["converged"] * 3
    assert all(hosts[h]["old_release"] != hosts[h]["new_release"] for h in HOSTS)
    assert [served_max_len(sim_fleet, h) for h in HOSTS] == [131072] * 3
    assert len(probe.counts) > 20 and min(probe.counts) >= 2, probe.counts


def test_release_failing_health_on_the_second_host_is_rolled_back_and_halts(sim_fleet, serving_fleet, tmp_path):
    bad = variant(tmp_path, "bad", {"max_model_len": 65536},
                  {"spark-2": {"engine_env": {"SIM_FAIL_HEALTH": "1"}, "health_timeout_s": 15}})
    before = {h: json.loads(ssh(sim_fleet, h, "cat /etc/sparkfleet/release.json"))["release_id"] for h in HOSTS}
    served_before = {h: served_max_len(sim_fleet, h) for h in HOSTS}
    assert served_before["spark-2"] != 65536
    proc = sparkfleet("rollout", bad, "--batch", "1", "--json")
    assert proc.returncode != 0
    hosts = report(proc)
    assert hosts["spark-1"]["result"] == "converged" and served_max_len(sim_fleet, "spark-1") == 65536
    assert hosts["spark-2"]["result"] == "rolled back" and "previous release restored" in hosts["spark-2"]["detail"]
    assert answers_chat(sim_fleet, "spark-2") and served_max_len(sim_fleet, "spark-2") == served_before["spark-2"]
    assert json.loads(ssh(sim_fleet, "spark-2", "cat /etc/sparkfleet/release.json"))["release_id"] == before["spark-2"]
    # the engine env rolled back holds today's values of the old release's names only; what is kept for a
    # second rollback is names, never values (engine_env is a secret setting)
    live, kept = (ssh(sim_fleet, "spark-2", f"cat /etc/sparkfleet/{f}") for f in ("engine.env", "previous/engine.env"))
    assert "SIM_FAIL_HEALTH" not in live and kept.splitlines() == ["#key SIM_FAIL_HEALTH"]
    assert hosts["spark-3"]["result"] == "not reached"
    assert served_max_len(sim_fleet, "spark-3") == served_before["spark-3"]
    assert json.loads(ssh(sim_fleet, "spark-3", "cat /etc/sparkfleet/release.json"))["release_id"] == before["spark-3"]


def test_unreachable_host_halts_the_rollout_and_status_says_so(sim_fleet, converged_fleet):
    from sim import fleet

    untouched = served_max_len(sim_fleet, "spark-3")
    fleet.stop_host("spark-2")
    try:
        status = sparkfleet("status", "inventory/sim.py", "--json")
        assert status.returncode != 0
        rows = {r["host"]: r for r in json.loads(status.stdout)["hosts"]}
        assert not rows["spark-2"]["healthy"] and "unreachable over SSH" in rows["spark-2"]["error"]
        assert rows["spark-1"]["healthy"] and rows["spark-1"]["ssh"]["model_verified"] is True

        proc = sparkfleet("rollout", "inventory/sim.py", "--batch", "1", "--max-fail", "0", "--json")
        assert proc.returncode != 0
        hosts = report(proc)
        # staging (issue 22) reaches every host before any batch: the unreachable one halts the rollout there
        assert [hosts[h]["result"] for h in HOSTS] == ["not reached", "unreachable", "not reached"], hosts
        assert "halted: staging failed on spark-2; no host was drained" in hosts["spark-3"]["detail"], hosts
        assert served_max_len(sim_fleet, "spark-3") == untouched
    finally:
        fleet.start_host("spark-2")
    proc = sparkfleet("rollout", "inventory/sim.py", "--batch", "2", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    status = sparkfleet("status", "inventory/sim.py", "--json")
    assert status.returncode == 0, status.stdout
    rows = json.loads(status.stdout)["hosts"]
    assert {r["ssh"]["release_id"] for r in rows} == {hosts["spark-1"]["new_release"]}
    assert all(r["ssh"]["toolkit"] == "1.18.1-1" and r["ssh"]["driver"] == "580.95.05" for r in rows)


def hub_throttle(hub: str, bps: int | None) -> None:
    """The sim hub's rate per download (None: as fast as it goes), as tools/bench_converge.py sets it."""
    body = json.dumps({"throttle_bps": bps}).encode()
    request = urllib.request.Request(f"{hub}/_sim/knobs", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=10).read()


def test_a_rollout_shows_the_fetch_and_the_engine_start_of_each_host(sim_fleet, converged_fleet, hub):
    """Issue 21's progress on long work: spark-1's model directory is removed, so a rollout of the same release
    (`--limit spark-1`: it fetches from the hub, throttled so the fetch takes >= 10 s) fetches it again and
    restarts the engine (12 s to load); its stderr shows the fetch with bytes and a rate, then vLLM's start
    phases. The release does not change: the fleet is left as it was, serving."""
    from sim import fleet

    model_dir = json.loads(ssh(sim_fleet, "spark-1", "cat /etc/sparkfleet/release.json"))["model_dir"]
    sizes = ssh(sim_fleet, "spark-1", f"find {shlex.quote(model_dir)} -type f -printf '%s\\n'").split()
    fleet.set_engine("spark-1", load_delay_s=12)
    hub_throttle(hub, max(1, max(int(n) for n in sizes) // 14))  # the largest file alone takes 14 s
    try:
        ssh(sim_fleet, "spark-1", f"rm -rf {shlex.quote(model_dir)}")
        started = time.monotonic()
        proc = sparkfleet("rollout", INVENTORY, "--limit", "spark-1", "--json")
        took = time.monotonic() - started
    finally:
        hub_throttle(hub, None)
        fleet.set_engine("spark-1", load_delay_s=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report(proc)["spark-1"]["result"] == "converged" and took > 24
    lines = proc.stderr.splitlines()
    fetching = [line for line in lines if re.fullmatch(
        r"spark-1: fetch \d+/\d+ files, [\d.]+ of [\d.]+ [kMG]?B, [\d.]+ [kMG]?B/s, ETA [\w ]+", line)]
    assert fetching, proc.stderr[-3000:]
    assert any(re.fullmatch(r"spark-1: fetched \d+ files, [\d.]+ [kMG]?B in [\w ]+", line) for line in lines), \
        proc.stderr[-3000:]
    phases = [line.removeprefix("spark-1: engine ") for line in lines if line.startswith("spark-1: engine ")]
    assert any(p.startswith("loading shards ") for p in phases) and phases[-1] == "ready", phases
    assert len([line for line in lines if line.startswith("spark-2") or line.startswith("spark-3")]) == 0
    assert len(lines) < 40  # a CI log stays short: a line on a change of phase, else one every 10 s
    assert answers_chat(sim_fleet, "spark-1") and fleet_out_of_step(sim_fleet) == {}


def test_a_release_that_decodes_slower_is_stopped_at_the_canary(sim_fleet, converged_fleet, tmp_path):
    """Issue 22's speed gate: a release whose stand-in decodes at 60 % of the inventory's 50 tokens/s (engine_env
    SIM_TOKENS_PER_S) passes spark-1's health gate, is measured there while drained, and is rolled back: the
    rollout halts naming both rates, spark-1 serves its previous release, spark-2 and spark-3 are not touched."""
    from sparkfleet.contract import paths

    slow = variant(tmp_path, "slow", {"max_model_len": 65536,
                                      "engine_env": {"SIM_TOKENS_PER_S": "30", "SIM_FIRST_TOKEN_DELAY_MS": "100"}})
    before = {h: json.loads(ssh(sim_fleet, h, f"cat {paths.RELEASE_FILE}"))["release_id"] for h in HOSTS}
    served_before = served_max_len(sim_fleet, "spark-1")
    engines = {h: started_at(sim_fleet, h) for h in HOSTS[1:]}
    try:
        started = time.monotonic()
        proc = sparkfleet("rollout", slow, "--batch", "1", "--json")
        took = time.monotonic() - started
        assert proc.returncode != 0, proc.stderr[-3000:]
        found = json.loads(proc.stdout)
        hosts = report(proc)
        [check] = found["speed_gate"]["checks"]
        assert (check["host"], check["verdict"], found["speed_gate"]["skipped"]) == ("spark-1", "regressed", False)
        measured, baseline = check["measured"]["decode_tokens_per_s"], check["baseline"]["decode_tokens_per_s"]
        assert 0.5 < measured / baseline < 0.7, check  # 30 against 50, whatever the host's jitter
        assert check["baseline"]["release"] == before["spark-1"]
        line = next(ln for ln in proc.stderr.splitlines() if ln.startswith("speed gate: spark-1: decode"))
        assert f"decode {measured:.1f} tok/s vs {baseline:.1f} before" in line and "rolled back; halted" in line, line
        assert hosts["spark-1"]["result"] == "rolled back" and "previous release restored" in hosts["spark-1"]["detail"]
        assert json.loads(ssh(sim_fleet, "spark-1", f"cat {paths.RELEASE_FILE}"))["release_id"] == before["spark-1"]
        assert answers_chat(sim_fleet, "spark-1") and served_max_len(sim_fleet, "spark-1") == served_before
        kept = json.loads(ssh(sim_fleet, "spark-1", f"cat {paths.SPEED_FILE}"))["releases"]
        assert kept[before["spark-1"]]["decode_tokens_per_s"] == baseline  # the next rollout's baseline
        assert [hosts[h]["result"] for h in HOSTS[1:]] == ["not reached"] * 2, hosts
        assert all("speed gate" in hosts[h]["detail"] for h in HOSTS[1:]), hosts
        assert {h: started_at(sim_fleet, h) for h in HOSTS[1:]} == engines
        assert all(json.loads(ssh(sim_fleet, h, f"cat {paths.RELEASE_FILE}"))["release_id"] == before[h]
                   for h in HOSTS[1:])
        print(f"rollout halted by the speed gate in {took:.0f} s; the gate's measurements took {check['seconds']} s")
    finally:
        # a rollback keeps today's engine_env values (never an older secret's): spark-1's engine decodes at 30
        # until the demo's release is converged there again
        again = converge("--limit", "spark-1")
        assert again.returncode == 0, again.output[-4000:]
    assert fleet_out_of_step(sim_fleet) == {}
