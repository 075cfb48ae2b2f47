"""Prometheus on the front door host (spark-1, group `monitoring`) watching the simulated fleet: every engine,
node exporter (with the GB10's reading) and the front door scraped and up, nothing of it on the LAN, a second
converge changing nothing; a paused engine fires the not-serving alert naming its host (and `status` names it)
until the watchdog heals it; a simulated power throttle fires the throttle alert. One converge for the module,
with short `for:` durations set in its inventory (the defaults stay)."""

from __future__ import annotations

import json
import shlex
import time

import pytest

from sim import fleet
from sparkfleet.contract import monitoring as m

from .conftest import HOSTS, ROOT, container, converge, sparkfleet, ssh
from .test_front_door import door_port

pytestmark = pytest.mark.e2e

FAST = {"monitoring_scrape_interval_s": 5, "monitoring_down_for_s": 10, "monitoring_alert_for_s": 15}
FIRE_WITHIN_S = 180
USER_KEY = "alice-0123456789abcdef"
BACKEND_KEY = "sim-key"  # inventory/sim.py's api_key


def monitored_inventory(tmp_path) -> str:
    """inventory/sim.py plus a front door and Prometheus on spark-1, alerting after seconds, not minutes."""
    settings = {"front_door_users": {"alice": USER_KEY}, "front_door_allow_http": True,
                "controller_front_door_url": f"http://127.0.0.1:{door_port()}", "drain_timeout_s": 30, **FAST}
    path = tmp_path / "monitored.py"
    path.write_text(f"import runpy\n_sim = runpy.run_path({str(ROOT / 'inventory/sim.py')!r})\n"
                    f"sparks = [(n, {{**d, **{settings!r}}}) for n, d in _sim['sparks']]\n"
                    "front_door = [sparks[0]]\nmonitoring = [sparks[0]]\n")
    return str(path)


@pytest.fixture(scope="module")
def monitored(sim_fleet, tmp_path_factory):
    inventory = monitored_inventory(tmp_path_factory.mktemp("monitoring"))
    done = converge(inventory=inventory)
    assert done.returncode == 0, done.output[-4000:]
    return sim_fleet, inventory


def prometheus(state, path: str) -> dict:
    """Prometheus's API on spark-1's loopback, asked there (it answers nothing else)."""
    return json.loads(ssh(state, "spark-1", f"curl -fsS 'http://127.0.0.1:9090{path}'"))


def firing(state, name: str) -> set[str]:
    """The hosts an alert fires for now."""
    return {a["labels"].get("host") for a in prometheus(state, m.ALERTS_API_PATH)["data"]["alerts"]
            if a["labels"]["alertname"] == name and a["state"] == "firing"}


def wait_until(check, timeout_s: float, explain=lambda: "") -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if check():
            return time.monotonic() - t0
        time.sleep(3)
    raise AssertionError(f"not within {timeout_s} s: {explain()}")


def lan_get(state, url: str, key: str | None) -> str:
    """The HTTP status of a GET of `url` from spark-2, on the sim's LAN."""
    auth = f"-H {shlex.quote('Authorization: Bearer ' + key)} " if key else ""
    return ssh(state, "spark-2", f"curl -s -o /dev/null -m 5 -w '%{{http_code}}' {auth}{shlex.quote(url)}", check=False)


def values(state, query: str) -> dict[str, str]:
    """{host: value} of an instant query."""
    found = prometheus(state, f"/api/v1/query?query={query}")["data"]["result"]
    return {r["metric"]["host"]: r["value"][1] for r in found}


def targets(state) -> dict[tuple[str, str], str]:
    return {(t["labels"]["job"], t["labels"]["host"]): t["health"]
            for t in prometheus(state, "/api/v1/targets")["data"]["activeTargets"]}


def test_every_target_is_up_nothing_listens_on_the_lan_and_a_second_converge_changes_nothing(monitored):
    state, inventory = monitored
    wanted = {**{(job, h): "up" for h in HOSTS for job in ("engine", "node")}, ("front_door", "spark-1"): "up", ("usage", "spark-1"): "up"}
    wait_until(lambda: targets(state) == wanted, 60, lambda: targets(state))
    for metric in ("sparkfleet_gpu_reading_ok", "sparkfleet_watchdog_probe_ok"):  # the textfile, within a tick
        wait_until(lambda q=metric: values(state, q) == {h: "1" for h in HOSTS}, 60, lambda q=metric: values(state, q))
    for host, ports in (("spark-1", (9090, 9100)), ("spark-2", (9100,)), ("spark-3", (9100,))):
        listening = ssh(state, host, "ss -Hltn").split()
        for port in ports:
            found = [a for a in listening if a.endswith(f":{port}")]
            assert found == [f"127.0.0.1:{port}"], (host, port, found)
    lan = f"http://{container('spark-1')}"  # as spark-2 reaches it: the exporters only with the backend key
    for url, user in ((f"{lan}:8080{m.FRONT_DOOR_METRICS_PATH}", "404"), (f"{lan}:8000{m.NODE_METRICS_PATH}", "401")):
        assert [lan_get(state, url, k) for k in (None, USER_KEY, BACKEND_KEY)] == ["401", user, "200"], url
    again = converge(inventory=inventory)
    assert again.returncode == 0 and not any(again.changed.values()), again.changed


def test_a_paused_engine_fires_not_serving_naming_its_host_until_the_watchdog_heals_it(monitored):
    state, inventory = monitored
    wait_until(lambda: not firing(state, "EngineNotServing"), FIRE_WITHIN_S, lambda: firing(state, "EngineNotServing"))
    ssh(state, "spark-2", "docker pause vllm")
    try:
        took = wait_until(lambda: firing(state, "EngineNotServing") == {"spark-2"}, FIRE_WITHIN_S,
                          lambda: firing(state, "EngineNotServing"))
        told = sparkfleet("status", inventory, "--json", timeout=300)
        assert told.returncode == 1, told.stdout[-2000:] + told.stderr[-2000:]
        alerts = json.loads(told.stdout)["alerts"]
        assert ("EngineNotServing", "spark-2") in {(a["alert"], a["host"]) for a in alerts["firing"]}, alerts
        # the watchdog restarts the paused engine: the alert resolves
        wait_until(lambda: not firing(state, "EngineNotServing"), 300, lambda: firing(state, "EngineNotServing"))
    finally:
        ssh(state, "spark-2", "docker unpause vllm 2>/dev/null; true")
    assert took < FIRE_WITHIN_S


def test_a_power_throttle_fires_the_throttle_alert_naming_its_host(monitored):
    state, inventory = monitored
    fleet.set_gpu("spark-2", throttle="power", sm_clock_mhz=850)
    try:
        wait_until(lambda: firing(state, "GpuThrottling") == {"spark-2"}, FIRE_WITHIN_S,
                   lambda: firing(state, "GpuThrottling"))
        told = sparkfleet("status", inventory, timeout=300)
        assert told.returncode == 1 and "GpuThrottling" in told.stdout and "spark-2" in told.stdout, told.stdout
    finally:
        fleet.set_gpu("spark-2", throttle="none", sm_clock_mhz=2418)
    wait_until(lambda: not firing(state, "GpuThrottling"), FIRE_WITHIN_S, lambda: firing(state, "GpuThrottling"))
