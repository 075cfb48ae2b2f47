"""Prometheus on door-1 (the sim's service host, group `monitoring`, beside its front door) watching the simulated
fleet: every engine, node exporter (with the GB10's reading), the front door and its usage scraped and up, nothing of
it on the LAN, a second converge changing nothing; a paused engine fires the not-serving alert naming its host (and
`status` names it) until the watchdog heals it; a simulated power throttle fires the throttle alert; the office
status page in a real browser. One converge for the module, with short `for:` durations set in its inventory (the
defaults stay)."""

from __future__ import annotations

import json
import shlex

import pytest
import requests

from tests.waiting import seconds_until
from sim import fleet
from tools import status_page_shot as shot
from sparkfleet.contract import monitoring as m

from .conftest import HOSTS, ROOT, container, converge, sparkfleet, ssh
from .test_front_door import DOOR, door_inventory, door_port

pytestmark = pytest.mark.e2e

FAST = {"monitoring_scrape_interval_s": 5, "monitoring_down_for_s": 10, "monitoring_alert_for_s": 15}
FIRE_WITHIN_S = 180
USER_KEY = "alice-0123456789abcdef"
VIEWER, VIEWER_PASSWORD = "carol", "carol-views-the-page-0123"
ARTIFACT = ROOT / "artifacts" / "status-page.png"  # the screenshot the e2e keeps
BACKEND_KEY = "sim-key"  # inventory/sim.py's api_key


@pytest.fixture(scope="module")
def monitored(sim_fleet, first_converge, tmp_path_factory):
    inventory = door_inventory(tmp_path_factory.mktemp("monitoring"), "monitored", {"alice": USER_KEY},
                               door={**FAST, "front_door_viewers": {VIEWER: VIEWER_PASSWORD}})
    done = converge(inventory=inventory)
    assert done.returncode == 0, done.output[-4000:]
    return sim_fleet, inventory


def prometheus(state, path: str) -> dict:
    """Prometheus's API on door-1's loopback, asked there (it answers nothing else)."""
    return json.loads(ssh(state, DOOR, f"curl -fsS 'http://127.0.0.1:9090{path}'"))


def firing(state, name: str) -> set[str]:
    """The hosts an alert fires for now."""
    return {a["labels"].get("host") for a in prometheus(state, m.ALERTS_API_PATH)["data"]["alerts"]
            if a["labels"]["alertname"] == name and a["state"] == "firing"}


def wait_until(check, timeout_s: float, explain=lambda: "") -> float:
    """The seconds until check() held (polled every 3 s); past timeout_s, fails with explain()'s text."""
    return seconds_until(check, timeout_s, step_s=3.0, explain=lambda: str(explain()))


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
    wanted = {**{(job, h): "up" for h in HOSTS for job in ("engine", "node")},
              ("front_door", DOOR): "up", ("usage", DOOR): "up"}
    wait_until(lambda: targets(state) == wanted, 60, lambda: targets(state))
    for metric in ("sparkfleet_gpu_reading_ok", "sparkfleet_watchdog_probe_ok"):  # the textfile, within a tick
        wait_until(lambda q=metric: values(state, q) == {h: "1" for h in HOSTS}, 60, lambda q=metric: values(state, q))
    for host, ports in ((DOOR, (9090,)), *((h, (9100,)) for h in HOSTS)):
        listening = ssh(state, host, "ss -Hltn").split()
        for port in ports:
            found = [a for a in listening if a.endswith(f":{port}")]
            assert found == [f"127.0.0.1:{port}"], (host, port, found)
    door, spark = f"http://{container(DOOR)}", f"http://{container('spark-1')}"  # as spark-2 reaches them
    for url, user in ((f"{door}:8080{m.FRONT_DOOR_METRICS_PATH}", "404"), (f"{door}:8080{m.USAGE_METRICS_PATH}", "401"),
                      (f"{spark}:8000{m.NODE_METRICS_PATH}", "401")):
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


@pytest.mark.chromium
def test_the_status_page_in_a_real_browser_has_every_host_and_says_which_is_drained(monitored):
    """The distribution's Chromium opens /status through the front door as a viewer, spark-2 drained: a row per
    Spark, spark-2's saying drained, the others in rotation; the screenshot is kept (ARTIFACT)."""
    state, inventory = monitored
    url = f"http://127.0.0.1:{door_port()}{m.FRONT_DOOR_STATUS_PATH}"
    assert requests.get(url, timeout=30).status_code == 401  # no viewer, no page

    def row(dom: str, host: str) -> str:
        start = dom.index(f'data-host="{host}"')
        return dom[start:dom.index("</tr>", start)]

    def page() -> str:
        with shot.authorized(url, VIEWER, VIEWER_PASSWORD) as local:
            return shot.run_chromium(local, "--dump-dom")

    drained = sparkfleet("drain", inventory, "spark-2")
    assert drained.returncode == 0, drained.stdout[-2000:] + drained.stderr[-2000:]
    try:
        def shows_the_drain() -> bool:
            dom = page()
            return all(f'data-host="{h}"' in dom for h in HOSTS) and ">drained<" in row(dom, "spark-2")

        wait_until(shows_the_drain, FIRE_WITHIN_S, lambda: page()[-3000:])
        dom = page()
        assert all("in rotation" in row(dom, h) and "drained" not in row(dom, h) for h in HOSTS if h != "spark-2")
        ARTIFACT.parent.mkdir(exist_ok=True)
        assert shot.screenshot(url, ARTIFACT, VIEWER, VIEWER_PASSWORD) == (1500, 900)
        assert ARTIFACT.stat().st_size > 20_000  # a rendered page, not a blank one
    finally:
        sparkfleet("undrain", inventory, "spark-2")
