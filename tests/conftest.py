"""Shared fixtures: a local model hub (the simulated fleet's, run on loopback); the test tiers' one hook."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests import tiers
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
MODEL_REPO = "Qwen/Qwen3.5-35B-A3B-FP8"


def pytest_addoption(parser):
    parser.addoption("--lane", choices=tiers.LANES, default=None,
                     help="fast: only the tests that run no program of this machine (no tier of tests/tiers.py), "
                          "as `make fast` runs them; programs: only the tests that run one")


@pytest.hookimpl(tryfirst=True)  # before `-m` selects: `-m "not haproxy"` leaves out the fixtures' users too
def pytest_collection_modifyitems(config, items):
    """The test tiers (tests/tiers.py): the markers of the fixtures each test uses, and one skip reason where a
    tier's program is not installed here; with --lane, the tests of the other lane deselected."""
    tiers.mark_and_skip(items)
    lane = config.getoption("--lane", None)
    if lane:
        kept, other = tiers.split_lane(items, lane)
        if other:
            config.hook.pytest_deselected(items=other)
            items[:] = kept


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 30) -> None:
    """Until `url` answers a GET (refused or failing meanwhile: a server still starting)."""
    wait_until(lambda: urllib.request.urlopen(url, timeout=2).read() is not None, timeout, f"{url} answering",
               step_s=0.1, ignore=(OSError,))


@pytest.fixture(scope="session")
def local_hub(tmp_path_factory):
    """The sim's hub on 127.0.0.1, serving a small generated Qwen3.5-shaped repository."""
    data = tmp_path_factory.mktemp("hub")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "sim/hub/server.py"), "--host", "127.0.0.1", "--port", str(port),
         "--data", str(data), "--generate", MODEL_REPO, "--shards", "4", "--shard-mb", "1", "--quiet"],
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/_sim/counters")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def hub_counters(local_hub):
    def read():
        return json.loads(urllib.request.urlopen(f"{local_hub}/_sim/counters").read())
    return read
