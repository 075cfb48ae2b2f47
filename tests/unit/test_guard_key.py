"""The guard's key check (issue 36): the whole Authorization header (`req.fhdr`, which does not split on commas)
compared with the map's in constant time (`secure_memcmp`, as the front door's /usage/metrics does), and an
`api_key` holding a comma (which `req.hdr` would split, so it never matched) refused where it is set. Constant
time itself cannot be timed in a test: the rendered config says which comparison runs, Debian's HAProxy on
loopback shows what it lets through."""

from __future__ import annotations

import dataclasses
import socket

import pytest
import requests

from sparkfleet.contract import paths
from sparkfleet.contract.settings import SettingsError, parse_settings
from sparkfleet.roles import guard as gd
from sparkfleet.roles import haproxy
from tests.conftest import free_port

from . import helpers
from .helpers import KEY, haproxy_serving, host_data
from .test_guard import engine_answered, guarded, listen_blocks, plan, status  # noqa: F401  (guarded: a fixture)


@pytest.mark.parametrize("key", ["s3cret,x", ",,", "a,b,c", "Bearer,s3cret"])
def test_an_api_key_with_a_comma_is_refused_where_it_is_set(key):
    with pytest.raises(SettingsError) as caught:
        parse_settings("spark-a", host_data(api_key=key))
    message = str(caught.value)
    assert "setting `api_key`" in message and "commas" in message and key not in message


def test_a_key_without_a_comma_is_still_any_printable_ascii():
    for key in (KEY, "a-b_c.d~e+f/g=h!#$%&'()*;:<>?@[]^`{|}", "x" * 255):
        assert parse_settings("spark-a", host_data(api_key=key)).api_key == key


def test_the_guard_compares_the_whole_header_in_constant_time():
    for block in listen_blocks(gd.guard_plan(plan(services={"embed": {"recipe": "qwen3-embedding-0.6b"}})).config()
                               ).values():
        [check] = [line.strip() for line in block.splitlines() if "txn.key)" in line and "set-var(txn.user)" in line]
        assert check.endswith("if { req.fhdr(authorization),secure_memcmp(txn.key) }"), check
        assert "strcmp" not in block and "req.hdr(" not in block


def raw_status(url: str, *headers: str) -> int:
    """The guard's status for GET /v1/models with these header lines, sent as written (a list, a repeat)."""
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(("GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                      + "".join(f"{h}\r\n" for h in headers) + "\r\n").encode())
        return int(sock.recv(64).split(b" ")[1])


def test_the_guard_lets_the_right_key_through_and_no_near_miss(guarded):  # noqa: F811
    url, _, _ = guarded
    assert engine_answered(url, "/v1/models", KEY)
    same_length = KEY[:-1] + chr(ord(KEY[-1]) + 1)
    for wrong in (same_length, KEY[:-1], KEY + "x", "x" + KEY[1:], KEY.upper()):
        assert status(url, "/v1/models", wrong) == 401, wrong
    # the whole header: a list whose last item is the key is not the key (req.hdr took its last item: 200)
    assert raw_status(url, f"Authorization: x, Bearer {KEY}") == 401
    assert raw_status(url, f"Authorization: Bearer {KEY}, x") == 401
    assert raw_status(url, f"Authorization: Bearer {KEY}") == 200


COMMA_KEY = "s3cret,with,commas"


@pytest.fixture(scope="module")
def comma_guard(guarded, tmp_path_factory):  # noqa: F811
    """A guard in front of the same engine whose key holds commas (as the settings allowed before): what it lets
    through shows which header value it compares."""
    _, p, _ = guarded
    tmp = tmp_path_factory.mktemp("comma-guard")
    port = free_port()
    plain = gd.guard_plan(p)
    guard = dataclasses.replace(plain, api_key=COMMA_KEY, listeners=(dataclasses.replace(
        plain.listeners[0], bind=haproxy.address("127.0.0.1", port)),))
    helpers.guard_files(guard, tmp)
    with haproxy_serving(guard.config(), tmp, {paths.GUARD_DIR: str(tmp)}, f"http://127.0.0.1:{port}") as url:
        yield url


def test_the_whole_header_is_compared_not_its_last_comma_item(comma_guard):
    """/metrics (the engine asks no key of its own there): the whole key passes; none of its comma items does."""
    assert status(comma_guard, "/metrics", COMMA_KEY) == 200
    for part in ("s3cret", "commas", "with,commas", "s3cret,with"):
        assert status(comma_guard, "/metrics", part) == 401, part
