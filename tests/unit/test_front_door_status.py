"""The status page through the front door: offered only where the door's host is a monitoring host with viewers,
viewers' passwords only as digests in a 0600 map, and the real HAProxy on loopback in front of a stand-in
Prometheus that answers every path: /status opens to a viewer and to nobody else, and nothing else of
Prometheus is reached through the door."""

from __future__ import annotations

import hashlib
import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from sparkfleet import cli  # imported first: it loads pyinfra's CLI, which patches threading (gevent)
from sparkfleet.contract import monitoring as m
from sparkfleet.contract import paths
from sparkfleet.contract.settings import SettingsError
from sparkfleet.roles.front_door import plan as fd_plan
from tests.conftest import free_port
from tests.tiers import needs

from .helpers import KEY, door_files, start_haproxy, wait_for
from .test_front_door import ALICE, plans

CAROL, DAVE = "carol-pass-0123456789abcdef", "dave-pass-0123456789abcdef"
VIEWERS = {"carol": CAROL, "dave": DAVE}
PAGE = "<html>the status page</html>"


def door_of(monitoring_host: bool = True, **settings) -> fd_plan.FrontDoor:
    return fd_plan.front_door_plan("spark-a", plans(**{"spark-a": {"front_door_viewers": VIEWERS, **settings}}),
                              monitoring_host)


def test_offered_only_on_a_monitoring_host_with_viewers():
    assert door_of().status_page == {"path": m.FRONT_DOOR_STATUS_PATH, "console": m.STATUS_PAGE, "port": 9090,
                                     "viewers_map": m.FRONT_DOOR_VIEWERS_MAP}
    assert door_of(monitoring_port=9191).status_port == 9191
    for door in (door_of(monitoring_host=False), door_of(front_door_viewers={})):
        assert door.status_page is None
        assert "status_page" not in door.config() and m.FRONT_DOOR_VIEWERS_MAP not in door.config()
        assert m.FRONT_DOOR_STATUS_PATH + " " not in door.config()


def test_without_the_page_the_config_is_as_before():
    """An inventory that does not use the page renders the very config it did (its converge changes nothing)."""
    assert door_of(monitoring_host=False).config() == fd_plan.front_door_plan("spark-a", plans(**{"spark-a": {}})).config()


def test_passwords_live_only_as_digests_in_the_viewers_map():
    door = door_of()
    digest = hashlib.sha256(CAROL.encode()).hexdigest().upper()
    assert door.viewers_map().splitlines()[0] == f"carol {digest}"
    summary = repr(fd_plan.door_summary(door)) + repr(door.settings)
    for secret in (CAROL, DAVE):
        assert secret not in door.viewers_map() and secret not in door.config() and secret not in summary
    assert fd_plan.door_summary(door)["viewers"] == ["carol", "dave"]
    assert ("status page", f"{m.FRONT_DOOR_STATUS_PATH} for carol, dave") in fd_plan.door_rows(fd_plan.door_summary(door))


@pytest.mark.parametrize("settings, expected", [
    ({"front_door_allow_http": False, "front_door_users": {}},
     "the status page would take its viewers' passwords over plain http"),
    ({"api_key": CAROL, "front_door_viewers": {"carol": CAROL}}, "a viewer's password equals the backends' api_key"),
    ({"monitoring_port": 8080}, "setting `monitoring_port` = 8080 is the front door's port"),
    ({"front_door_viewers": {"carol": ALICE}}, "a viewer's password equals a user's key"),
])
def test_refused_viewers(settings, expected):
    with pytest.raises(SettingsError) as exc:
        door_of(**settings)
    assert expected in str(exc.value)
    assert KEY not in str(exc.value) and CAROL not in str(exc.value) and ALICE not in str(exc.value)


def test_a_hostile_viewer_name_is_refused_before_it_reaches_the_map():
    with pytest.raises(SettingsError) as exc:
        door_of(front_door_viewers={"carol x\nmallory": CAROL})
    assert "front_door_viewers" in str(exc.value) and CAROL not in str(exc.value)


# --- HAProxy itself, on loopback, in front of a stand-in Prometheus ------------------------------------


class _Prometheus(BaseHTTPRequestHandler):
    """Answers every path with 200, as if all of Prometheus were open: only the door can refuse."""

    seen: list[tuple[str, str | None]] = []

    def do_GET(self):
        self.seen.append((self.path, self.headers.get("Authorization")))
        data = (PAGE if self.path == m.STATUS_PAGE else '{"status":"success","data":{}}').encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_POST = do_GET

    def log_message(self, *args):
        pass


@contextmanager
def haproxy_door(tmp, prometheus_port: int):
    """The real HAProxy with the generated config (paths moved under `tmp`) offering the page from Prometheus
    on `prometheus_port`; yields its URL. Its fixtures need the haproxy tier."""
    port = free_port()
    planned = door_of(monitoring_port=prometheus_port, front_door_port=port)
    door_files(planned, tmp)
    moved = {m.FRONT_DOOR_VIEWERS_MAP: str(tmp / "viewers.map"), paths.FRONT_DOOR_DIR: str(tmp),
             paths.FRONT_DOOR_SOCKET: str(tmp / "admin.sock"), paths.FRONT_DOOR_STATE_FILE: str(tmp / "state"),
             f"bind :{port}": f"bind 127.0.0.1:{port}"}
    proc = start_haproxy(planned.config(), tmp, moved, log=(tmp / "haproxy.log").open("w"))  # `haproxy -c` first
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: requests.get(f"{url}/health", timeout=2).status_code in (200, 503))
        yield url
    finally:
        proc.terminate()
        proc.wait()


@pytest.fixture(scope="module")
@needs("haproxy")
def door(tmp_path_factory):
    prometheus = ThreadingHTTPServer(("127.0.0.1", 0), _Prometheus)
    threading.Thread(target=prometheus.serve_forever, daemon=True).start()
    try:
        tmp = tmp_path_factory.mktemp("door")
        with haproxy_door(tmp, prometheus.server_address[1]) as url:
            _Prometheus.log = tmp / "haproxy.log"
            yield url
    finally:
        prometheus.shutdown()


def test_a_viewer_sees_the_page_and_prometheus_never_sees_the_password(door):
    _Prometheus.seen.clear()
    for viewer, password in VIEWERS.items():
        r = requests.get(f"{door}{m.FRONT_DOOR_STATUS_PATH}?x=/api/v1/query", auth=(viewer, password), timeout=5)
        assert r.status_code == 200 and r.text == PAGE
    assert _Prometheus.seen == [(m.STATUS_PAGE, None)] * 2
    wait_for(lambda: "user=viewer:dave" in _Prometheus.log.read_text())
    log = _Prometheus.log.read_text()
    assert "user=viewer:carol" in log and CAROL not in log and DAVE not in log


def test_a_page_view_is_no_users_request_in_the_usage_counts(door):
    """The viewer passes the door's usage and fair-share rules untracked: /usage/metrics names users only."""
    assert requests.get(f"{door}{m.FRONT_DOOR_STATUS_PATH}", auth=("carol", CAROL), timeout=5).status_code == 200
    usage = requests.get(f"{door}{m.USAGE_METRICS_PATH}", headers={"Authorization": f"Bearer {KEY}"}, timeout=5)
    assert usage.status_code == 200 and "sparkfleet_user_" in usage.text
    assert "viewer" not in usage.text and "carol" not in usage.text


@pytest.mark.parametrize("auth, headers", [
    (None, {}),
    (("carol", DAVE), {}),  # another viewer's password
    (("carol", CAROL[:-1]), {}),
    (("carol", CAROL + "x"), {}),
    (("mallory", CAROL), {}),
    (None, {"Authorization": f"Bearer {ALICE}"}),  # a user's key opens the API, not the page
    (None, {"Authorization": f"Bearer {KEY}"}),
    (("carol", hashlib.sha256(CAROL.encode()).hexdigest().upper()), {}),  # the digest is not the password
])
def test_anyone_else_gets_401(door, auth, headers):
    _Prometheus.seen.clear()
    r = requests.get(f"{door}{m.FRONT_DOOR_STATUS_PATH}", auth=auth, headers=headers, timeout=5)
    assert r.status_code == 401
    assert r.headers.get("WWW-Authenticate") == 'Basic realm="sparkfleet-status"'
    assert _Prometheus.seen == []


@pytest.mark.parametrize("method, path", [
    ("GET", "/api/v1/query?query=up"), ("GET", m.STATUS_PAGE), ("GET", "/graph"), ("GET", "/api/v1/targets"),
    ("GET", "/status/"), ("GET", "/status/../api/v1/query"), ("POST", m.FRONT_DOOR_STATUS_PATH),
    ("GET", "/-/quit"), ("GET", "/federate?match[]=up"),
])
def test_nothing_else_of_prometheus_is_reached(door, method, path):
    _Prometheus.seen.clear()
    for auth, headers in ((("carol", CAROL), {}), (None, {"Authorization": f"Bearer {ALICE}"})):
        r = requests.request(method, f"{door}{path}", auth=auth, headers=headers, timeout=5)
        assert r.status_code in (401, 404), (path, r.status_code)
    assert _Prometheus.seen == []


def test_plan_shows_the_page_on_a_door_that_is_a_monitoring_host_and_no_password(tmp_path, capsys):
    data = {"api_host": "0.0.0.0", "api_key": KEY, "front_door_users": {"alice": ALICE},
            "front_door_viewers": VIEWERS, "front_door_allow_http": True, "backend_key_in_clear": True}
    inventory = tmp_path / "office.py"
    inventory.write_text(f"_d = {data!r}\n"
                         "sparks = [(f'spark-{n}', {**_d, 'ssh_hostname': f'10.0.0.{n}'}) for n in (1, 2)]\n"
                         "front_door = sparks\nmonitoring = sparks[:1]\n")
    rc = cli.main(["plan", str(inventory), "--offline", "--json"])
    out = capsys.readouterr().out
    doors = {d["host"]: d for d in json.loads(out)["front_doors"]}
    assert rc == 0
    assert doors["spark-1"]["status_page"] is True and doors["spark-1"]["viewers"] == ["carol", "dave"]
    assert "backend status_page" in doors["spark-1"]["config"]
    assert doors["spark-2"]["status_page"] is False and "status_page" not in doors["spark-2"]["config"]
    assert CAROL not in out and DAVE not in out and ALICE not in out
