"""Serving, not just running: the watchdog and the converge heal an engine that stops answering,
leave a healthy (ten probes) or slowly starting one alone, give up on one that crashes on every
start, and name a lost GPU; CDI mode is refused on a Docker without CDI. Default watchdog settings
(a probe every 30 s, a restart after 3 failures) but for the crash test's own quick one, and for the tests
whose decisions are counted in probes, not seconds (heal after 3 failures, never during a start, no restart
of a healthy engine): those run the same settings at a probe every 5 s (`quick_serving_fleet`)."""

import functools
import json
import re

import pytest

from tests.waiting import seconds_until
from sim import fleet
from sparkfleet.contract.paths import WATCHDOG_STATE, WATCHDOG_TIMER, WATCHDOG_UNIT
from sparkfleet.host.serving import WATCHDOG_RUN

from .conftest import HOSTS, INVENTORY, chat_tokens, converge, sparkfleet, ssh, started_at, variant

pytestmark = pytest.mark.e2e

HEAL_WITHIN_S = 180
QUICK_WATCHDOG = {"watchdog_interval_s": 5, "watchdog_failures": 1, "watchdog_max_restarts": 2,
                  "watchdog_window_s": 600, "health_timeout_s": 300}
QUICK_INTERVAL_S = 5  # quick_serving_fleet: the default watchdog but for a probe every 5 s


def watchdog_state(state, host) -> dict:
    return json.loads(ssh(state, host, "cat /var/lib/sparkfleet/watchdog.json 2>/dev/null || echo '{}'") or "{}")


def answers(state, host) -> bool:
    """A 1-token chat completion from the controller, as a user would send it."""
    return chat_tokens(state, host) == 1


wait_until = functools.partial(seconds_until, step_s=3.0)  # the seconds until check() held


def started_or_none(state, host) -> str | None:
    """The engine container's start time; None while there is none (between a stop and a start)."""
    return ssh(state, host, "docker inspect -f '{{.State.StartedAt}}' vllm 2>/dev/null", check=False) or None


def restarts_total(state) -> dict:
    return {h: watchdog_state(state, h).get("restarts_total", 0) for h in HOSTS}


# The watchdog's restart window (30 minutes) outlives a test: restarts an earlier test caused (a hung
# front-door backend, a rolled-back release) would make this test's restart wait out a backoff or give up.
# Each test starts with an empty window, the timer stopped while the state file is edited, and no last result:
# the fixture starts a tick at once and waits for one that saw the engine's current start serve (an "ok" from
# before an earlier test's restart would leave that start unseen, so the watchdog would take a hang in it for a
# slow start).
FORGET_RESTARTS = (
    f"systemctl stop {WATCHDOG_TIMER} {WATCHDOG_UNIT}; "
    f"python3 -c 'import json, sys; p = sys.argv[1]; s = json.load(open(p)); "
    f"s.update(restarts=[], gave_up=False, last_result=None); "
    f"json.dump(s, open(p, \"w\"))' {WATCHDOG_STATE}; systemctl start {WATCHDOG_TIMER}; "
    f"systemctl start --no-block {WATCHDOG_UNIT}"  # a tick now, not one interval later
)


def watchdog_settings(state, host) -> dict:
    return json.loads(ssh(state, host, "cat /etc/sparkfleet/serving.json"))


def watchdog_as(state, wanted: dict, inventory: str) -> None:
    """Every host's watchdog on `wanted` (DEFAULT_WATCHDOG's keys); converged with `inventory` only when one
    is not, so consecutive tests on the same settings pay no converge."""
    if all({key: watchdog_settings(state, h)[key] for key in wanted} == wanted for h in HOSTS):
        return
    result = converge(inventory=inventory)
    assert result.returncode == 0, result.output[-3000:]
    assert all({key: watchdog_settings(state, h)[key] for key in wanted} == wanted for h in HOSTS)


@pytest.fixture(scope="module", autouse=True)
def default_watchdog_after(sim_fleet):
    """The module leaves every watchdog on the default settings, as the other modules expect."""
    yield
    watchdog_as(sim_fleet, DEFAULT_WATCHDOG, INVENTORY)


@pytest.fixture()
def serving_fleet(sim_fleet, first_converge):
    """Every host answering and known to its (default) watchdog, with no restart in its window; whatever a
    test broke is repaired after it."""
    watchdog_as(sim_fleet, DEFAULT_WATCHDOG, INVENTORY)
    yield from _serving(sim_fleet)


@pytest.fixture(scope="module")
def quick_inventory(tmp_path_factory) -> str:
    """inventory/sim.py with every watchdog probing every 5 s, its other settings the defaults."""
    return variant(tmp_path_factory.mktemp("watchdog"), "watchdog-every-5s", {"watchdog_interval_s": QUICK_INTERVAL_S})


@pytest.fixture()
def quick_serving_fleet(sim_fleet, first_converge, quick_inventory):
    """serving_fleet on quick_inventory: a decision counted in probes (3 failures in a row, a start not over)
    is the same decision, six times sooner."""
    watchdog_as(sim_fleet, {**DEFAULT_WATCHDOG, "interval_s": QUICK_INTERVAL_S}, quick_inventory)
    yield from _serving(sim_fleet)


def _serving(sim_fleet):
    for host in HOSTS:
        ssh(sim_fleet, host, FORGET_RESTARTS)
    for host in HOSTS:
        wait_until(lambda h=host: answers(sim_fleet, h) and watchdog_state(sim_fleet, h).get("last_result") == "ok",
                   HEAL_WITHIN_S)
    yield sim_fleet
    for host in HOSTS:
        fleet.set_engine(host, fault=None, load_delay_s=2, crash_on_start=False)
        ssh(sim_fleet, host, "docker unpause vllm 2>/dev/null; true")
        if not answers(sim_fleet, host):
            ssh(sim_fleet, host, f"{WATCHDOG_RUN} --restart test-cleanup")
    for host in HOSTS:
        wait_until(lambda h=host: answers(sim_fleet, h), HEAL_WITHIN_S)


def test_watchdog_heals_a_paused_and_a_generation_hung_engine_alone(quick_serving_fleet, quick_inventory):
    state = quick_serving_fleet
    untouched = started_at(state, "spark-3")
    before = restarts_total(state)
    ssh(state, "spark-1", "docker pause vllm")
    fleet.set_engine("spark-2", live=True, fault="generation-hang")
    assert not answers(state, "spark-1") and not answers(state, "spark-2")
    healed_1 = wait_until(lambda: answers(state, "spark-1"), HEAL_WITHIN_S, explain=lambda: watchdog_state(state, "spark-1"))
    healed_2 = wait_until(lambda: answers(state, "spark-2"), HEAL_WITHIN_S, explain=lambda: watchdog_state(state, "spark-2"))
    after = restarts_total(state)
    assert after == {"spark-1": before["spark-1"] + 1, "spark-2": before["spark-2"] + 1,
                     "spark-3": before["spark-3"]}, (before, after, healed_1, healed_2)
    assert started_at(state, "spark-3") == untouched
    journal = ssh(state, "spark-2", "journalctl -u sparkfleet-watchdog.service -p warning --no-pager -n 20")
    assert "chat failed: 1-token chat completion" in journal and "restarting sparkfleet-vllm.service" in journal
    nothing = converge(inventory=quick_inventory)
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


def test_lost_gpu_in_the_engine_container_is_named_and_healed(quick_serving_fleet):
    state = quick_serving_fleet
    before = started_at(state, "spark-3")
    fleet.lose_container_gpu("spark-3")
    assert "GB10" in ssh(state, "spark-3", "nvidia-smi -L")  # the host still sees it
    lost = ssh(state, "spark-3", f"{WATCHDOG_RUN} --check", check=False)
    probe = json.loads(ssh(state, "spark-3", f"{WATCHDOG_RUN} --probe"))
    assert (probe["failed"], probe["gpu_visible"]) == ("gpu", False), (lost, probe)
    assert probe["gpu_detail"] == "Failed to initialize NVML: Unknown Error"
    wait_until(lambda: started_or_none(state, "spark-3") not in (None, before) and answers(state, "spark-3"),
               HEAL_WITHIN_S)
    wait_until(lambda: watchdog_state(state, "spark-3").get("gpu_visible") is True, 60)


def test_slow_start_is_not_killed_and_a_healthy_fleet_is_left_alone(quick_serving_fleet):
    state = quick_serving_fleet
    before = restarts_total(state)
    probes = {h: watchdog_state(state, h)["probes"] for h in HOSTS}
    load_s = 6 * QUICK_INTERVAL_S  # six probe intervals: twice the 3 failures that restart a started engine
    fleet.set_engine("spark-1", load_delay_s=load_s)
    ssh(state, "spark-1", "systemctl restart sparkfleet-vllm.service")
    wait_until(lambda: started_or_none(state, "spark-1"), 30, step_s=1)
    slow = started_at(state, "spark-1")
    took = wait_until(lambda: answers(state, "spark-1"), 200, step_s=1)
    assert took >= load_s - 5 and started_at(state, "spark-1") == slow
    fleet.set_engine("spark-1", load_delay_s=2)
    assert restarts_total(state) == before
    ticks = {h: watchdog_state(state, h)["probes"] - probes[h] for h in HOSTS}
    assert min(ticks.values()) >= 3, ticks
    journal = ssh(state, "spark-1", "journalctl -u sparkfleet-watchdog.service --no-pager -n 30")
    assert "is starting" in journal


LEFT_ALONE_PROBES = 10  # what five minutes at the default 30 s interval probe
DEFAULT_WATCHDOG = {"interval_s": 30, "failures": 3, "max_restarts": 3, "window_s": 1800, "start_timeout_s": 1800,
                    "enabled": True}


def test_a_healthy_fleet_left_alone_for_ten_probes_is_never_restarted(quick_serving_fleet):
    """Ten probes (five minutes at the default 30 s; here a probe every 5 s, every other watchdog setting the
    default), nobody touching anything: every probe answers, no host is restarted, by the watchdog or by
    systemd (container start times and the unit's restart count unchanged)."""
    state = quick_serving_fleet
    quick = {**DEFAULT_WATCHDOG, "interval_s": QUICK_INTERVAL_S}
    for host in HOSTS:
        config = watchdog_settings(state, host)
        assert {key: config[key] for key in DEFAULT_WATCHDOG} == quick, (host, config)

    def snapshot():
        return {h: {"started": started_at(state, h), "restarts_total": watchdog_state(state, h).get("restarts_total", 0),
                    "systemd_restarts": ssh(state, h, "systemctl show -p NRestarts --value sparkfleet-vllm.service")}
                for h in HOSTS}

    before = snapshot()
    probes = {h: watchdog_state(state, h)["probes"] for h in HOSTS}
    since = {h: ssh(state, h, "date +%s") for h in HOSTS}
    wait_until(lambda: all(watchdog_state(state, h)["probes"] - probes[h] >= LEFT_ALONE_PROBES for h in HOSTS),
               3 * LEFT_ALONE_PROBES * QUICK_INTERVAL_S, step_s=QUICK_INTERVAL_S,
               explain=lambda: {h: watchdog_state(state, h)["probes"] - probes[h] for h in HOSTS})
    assert snapshot() == before
    for host in HOSTS:
        now = watchdog_state(state, host)
        assert (now["last_result"], now["consecutive_failures"], now["gave_up"]) == ("ok", 0, False), (host, now)
        journal = ssh(state, host, f"journalctl -u sparkfleet-watchdog.service --since @{since[host]} -p warning "
                                   "--no-pager -q -o cat")
        assert journal == "", (host, journal)


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


def test_a_crash_on_every_start_fails_the_converge_and_the_watchdog_gives_up(serving_fleet, tmp_path):
    """spark-2 gets a quick watchdog of its own (a probe every 5 s, a restart after 1 failure, 2 restarts in
    10 minutes) while it serves; then its engine exits on every start. The converge fails naming it,
    systemd's start limit leaves the unit `failed`, the watchdog gives up, `status` says so and exits 1.
    Once the fault is cleared, one converge of the default inventory heals it.

    The quick settings land before the fault on purpose: a converge that finds the engine between two
    crashes starts it, and its health gate fails, which stops that host before the watchdog stage, so the
    host's watchdog keeps the settings it had (with the defaults, giving up takes over 6 minutes)."""
    state = serving_fleet
    quick = variant(tmp_path, "quick-watchdog", {}, {"spark-2": QUICK_WATCHDOG})
    others = {h: started_at(state, h) for h in ("spark-1", "spark-3")}
    ready = converge(inventory=quick)
    assert ready.returncode == 0, ready.output[-3000:]
    settings_op = "Model | Serving file (the probes, the watchdog's settings)"
    assert [h for h in HOSTS if settings_op in ready.changed[h]] == ["spark-2"], ready.changed
    assert json.loads(ssh(state, "spark-2", "cat /etc/sparkfleet/serving.json"))["interval_s"] == 5
    fleet.set_engine("spark-2", crash_on_start=True)
    try:
        ssh(state, "spark-2", "systemctl restart sparkfleet-vllm.service")
        broken = converge(inventory=quick)
        assert broken.returncode != 0
        assert [h for h in HOSTS if broken.host_failed(h)] == ["spark-2"], broken.failed
        assert "spark-2" in broken.output and "sparkfleet-vllm.service" in broken.output
        wait_until(lambda: unit_state(state, "spark-2") == "failed" and watchdog_state(state, "spark-2").get("gave_up"),
                   300, step_s=5, explain=lambda: ssh(state, "spark-2", "systemctl status --no-pager "
                                                      "sparkfleet-vllm.service; cat /var/lib/sparkfleet/watchdog.json",
                                                      check=False))
        gave_up = watchdog_state(state, "spark-2")
        assert gave_up["last_action"] == "gave-up" and len(gave_up["restarts"]) == 2, gave_up
        journal = ssh(state, "spark-2", "journalctl -u sparkfleet-watchdog.service -p err --no-pager -n 5")
        assert "GAVE UP: 2 restarts in 600 s did not heal sparkfleet-vllm.service" in journal, journal
        report = sparkfleet("status", quick, "--json", timeout=300)
        assert report.returncode == 1, report.stderr[-2000:]
        rows = {row["host"]: row for row in json.loads(report.stdout)["hosts"]}
        assert [h for h in HOSTS if not rows[h]["healthy"]] == ["spark-2"], rows
        assert rows["spark-2"]["ssh"]["watchdog"]["gave_up"] is True
        assert rows["spark-2"]["error"].startswith("watchdog gave up after 2 restarts"), rows["spark-2"]["error"]
        table = sparkfleet("status", quick, timeout=300)
        assert table.returncode == 1 and "GAVE UP" in table.stdout + table.stderr, table.stdout[-3000:]
    finally:  # repaired even when an assertion above failed: the default inventory's watchdog settings again
        fleet.set_engine("spark-2", crash_on_start=False)
        healed = converge()  # the engine restarted and gated
    assert healed.returncode == 0, healed.output[-3000:]
    assert answers(state, "spark-2") and unit_state(state, "spark-2") == "active"
    assert [h for h in HOSTS if "Service | Start limit of a failed unit reset (a converge tries again)"
            in healed.changed[h]] == ["spark-2"], healed.changed
    assert json.loads(ssh(state, "spark-2", "cat /etc/sparkfleet/serving.json"))["interval_s"] == 30
    wait_until(lambda: watchdog_state(state, "spark-2")["gave_up"] is False, 60)  # its next probe answers
    assert {h: started_at(state, h) for h in others} == others


def test_cdi_mode_on_a_docker_older_than_25_is_refused_naming_the_fix(serving_fleet, tmp_path):
    """The sim hosts run Debian's Docker 20.10, which has no CDI devices: gpu_device_mode "cdi" on spark-1
    stops it in the toolkit stage with one line naming the fix, before daemon.json or the unit is touched;
    the other hosts converge as before (nothing to change)."""
    state = serving_fleet
    before = {h: (started_at(state, h), ssh(state, h, "cat /etc/docker/daemon.json")) for h in HOSTS}
    refused = converge(inventory=variant(tmp_path, "cdi-on-spark-1", {}, {"spark-1": {"gpu_device_mode": "cdi"}}))
    assert refused.returncode != 0
    assert [h for h in HOSTS if refused.host_failed(h)] == ["spark-1"], refused.failed
    assert refused.failed["spark-1"][0].endswith("Docker takes CDI devices (features.cdi before 28.2)")
    line = ('Docker 20.10 cannot give a container a CDI device (gpu_device_mode "cdi" needs Docker 25 or newer): '
            'upgrade Docker on this host, or set gpu_device_mode = "runtime"')
    shown = re.sub(r"\x1b\[[0-9;]*m", "", refused.output)
    assert [h for h in HOSTS if f"[{h}] {line}" in shown] == ["spark-1"], shown[-3000:]
    assert not any(refused.changed.values()), refused.changed
    assert {h: (started_at(state, h), ssh(state, h, "cat /etc/docker/daemon.json")) for h in HOSTS} == before
