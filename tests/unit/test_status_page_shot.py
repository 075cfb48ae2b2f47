"""tools/status_page_shot.py: the real Prometheus renders the page from the sample fleet, the real HAProxy serves
it at /status to a viewer, and the distribution's Chromium (headless) loads it through the tool's loopback proxy:
a PNG of the window's size, a DOM with every host's row; the password never on Chromium's command line."""

from __future__ import annotations

import requests
import pytest

from sparkfleet.contract import monitoring as m
from tests.tiers import needs
from tests.unit import status_page_fleet as fleet
from tools import status_page_shot as shot

from .test_front_door_status import CAROL, haproxy_door



@pytest.fixture(scope="module")
@needs("haproxy")
def status_url(sample_prometheus, tmp_path_factory):
    with haproxy_door(tmp_path_factory.mktemp("door"), int(sample_prometheus.rsplit(":", 1)[1])) as door:
        yield door + m.FRONT_DOOR_STATUS_PATH


@pytest.mark.chromium
def test_the_screenshot_is_a_png_of_the_window(status_url, tmp_path):
    out = tmp_path / "status.png"
    assert shot.screenshot(status_url, out, "carol", CAROL, size=(1400, 800)) == (1400, 800)
    assert 20_000 < out.stat().st_size < 5_000_000  # a rendered page, not a blank one


@pytest.mark.chromium
def test_the_browser_sees_every_host_and_the_drained_one(status_url):
    with shot.authorized(status_url, "carol", CAROL) as local:
        dom = shot.run_chromium(local, "--dump-dom")
    for host in fleet.HOSTS:
        assert f'data-host="{host}"' in dom
    assert "drained" in dom and "in rotation" in dom


def test_the_password_is_never_on_chromiums_command_line(status_url):
    with shot.authorized(status_url, "carol", CAROL) as local:
        command = shot.chromium_command(local, "/tmp/profile", "--dump-dom")
        assert not any(CAROL in part or "carol" in part for part in command)
        assert local.startswith("http://127.0.0.1:") and local.endswith(m.FRONT_DOOR_STATUS_PATH)
        assert requests.get(local.replace(m.FRONT_DOOR_STATUS_PATH, "/api/v1/query"), timeout=5).status_code == 404


def test_a_wrong_password_shows_the_door_refusing(status_url):
    with shot.authorized(status_url, "carol", "wrong-password-0123456789") as local:
        assert requests.get(local, timeout=10).status_code == 401


@pytest.mark.chromium  # the tool looks for Chromium first
def test_the_cli_refuses_a_user_without_a_password(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(shot.PASSWORD_ENV, raising=False)
    assert shot.main(["http://127.0.0.1:1/status", str(tmp_path / "x.png"), "--user", "carol"]) == 2
    assert "--password-file" in capsys.readouterr().err
