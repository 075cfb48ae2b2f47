"""TLS on the backend hop with Debian's real HAProxy on loopback: the rendered guard serves TLS only and lets
past the handshake only a client certificate of the fleet CA (Python `ssl` clients: the fleet's, another CA's,
none, an expired one); a rendered front door reaches it over TLS with its own host certificate, its health checks
included; no key material in any rendered config."""

from __future__ import annotations

import datetime as dt
import socket
import ssl

import pytest
import requests

from sparkfleet.contract import paths
from sparkfleet.contract.settings import FrontDoorUser
from sparkfleet.roles import guard as gd
from sparkfleet.roles import pki
from sparkfleet.roles.front_door import plan as fd_plan
from sparkfleet.fleet.tls import guard_client
from sparkfleet.release.plan import plan_hosts
from tests.conftest import free_port
from tests.tiers import needs

from . import helpers
from .helpers import (KEY, Recorder, door_files, free_api_port, haproxy_serving, host_data, start_haproxy,
                      wait_for)
from .test_pki import make_ca

USER_KEY = "alice-key-0123456789abcdef"


@pytest.fixture(scope="module", autouse=True)
def _one_ssl_context_class():
    """urllib3 makes its contexts of the class `ssl` had when it was imported. A test module run earlier in this
    process may have imported pyinfra_cli (gevent's patch_all replaces ssl.SSLContext) after urllib3: then each new
    context recurses in the stdlib's setters. The product imports pyinfra_cli first (one class throughout); so here."""
    import urllib3.util.ssl_ as urllib3_ssl

    kept = urllib3_ssl.SSLContext
    urllib3_ssl.SSLContext = ssl.SSLContext
    yield
    urllib3_ssl.SSLContext = kept


@pytest.fixture(scope="module")
@needs("haproxy")
def tls_guard(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tlsguard")
    ca_crt, ca_key = make_ca(tmp, "fleet")
    ca = pki.load_ca(ca_crt, ca_key)
    api_port = free_api_port()
    engine = Recorder({"ok": True}, paths.engine_port(api_port))  # the engine behind the guard
    [p] = plan_hosts([("spark-a", host_data(api_host="127.0.0.1", api_port=api_port, api_key=KEY))], resolve=False)
    p.backend_tls = True
    guard = gd.guard_plan(p)
    helpers.guard_files(guard, tmp)
    (tmp / "ca.crt").write_text(ca.cert_pem)
    (tmp / "host.crt").write_text(pki.issue(ca, "spark-a", pki.host_names("spark-a", "127.0.0.1")))
    (tmp / "host.crt.key").write_text(pki.host_key_pem(ca, "spark-a"))
    moved = {paths.GUARD_DIR: str(tmp), paths.TLS_DIR: str(tmp)}
    proc = start_haproxy(guard.config(), tmp, moved)
    try:
        with guard_client(ca) as client:
            wait_for(lambda: client.session.get(f"https://127.0.0.1:{api_port}/health", timeout=1).ok)
        yield tmp, ca, p, guard, api_port
    finally:
        proc.terminate()
        proc.wait()
        engine.close()


def _handshake(port: int, ca: pki.FleetCA, tmp, cert_key: tuple[str, str] | None) -> str:
    """One TLS client: 'ok' when an HTTP answer came back, else the error that stopped it."""
    ctx = ssl.create_default_context(cafile=str(tmp / "ca.crt"))
    ctx.check_hostname = False  # the chain is checked; the name is the door's test below
    if cert_key:
        crt, key = tmp / "client.crt", tmp / "client.key"
        crt.write_text(cert_key[0])
        key.write_text(cert_key[1])
        ctx.load_cert_chain(str(crt), str(key))
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            with ctx.wrap_socket(raw, server_hostname="spark-a") as tls:
                tls.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                head = tls.recv(100)
                return "ok" if head.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200")) else f"answer {head[:20]!r}"
    except (ssl.SSLError, ConnectionError) as exc:
        return type(exc).__name__


def test_the_fleets_client_certificate_gets_through(tls_guard):
    tmp, ca, _, _, port = tls_guard
    assert _handshake(port, ca, tmp, pki.client_pair(ca)) == "ok"


def test_another_cas_client_certificate_no_certificate_and_an_expired_one_are_refused_in_the_handshake(tls_guard):
    tmp, ca, _, _, port = tls_guard
    other = pki.load_ca(*make_ca(tmp, "other"))
    old = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=3)
    for client in (pki.client_pair(other), None, pki.client_pair(ca, now=old)):
        assert _handshake(port, ca, tmp, client) in ("SSLError", "SSLEOFError", "ConnectionResetError",
                                                     "BrokenPipeError", "SSLZeroReturnError")


def test_plain_http_gets_no_answer(tls_guard):
    _, _, _, _, port = tls_guard
    with pytest.raises(requests.RequestException):
        requests.get(f"http://127.0.0.1:{port}/health", timeout=5)


def test_the_controller_verifies_the_guards_name(tls_guard):
    """The controller's client checks the guard's certificate names the inventory host, not the URL's address."""
    _, ca, p, _, port = tls_guard
    data = host_data(api_host="127.0.0.1", api_port=port, api_key=KEY, controller_api_url=f"http://127.0.0.1:{port}")
    with guard_client(ca) as client:
        url = client.url("spark-a", p.settings.model_copy(update={"controller_api_url": data["controller_api_url"]}),
                         data)
        assert url.startswith("https://")
        assert client.session.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=5).ok
        wrong = client.url("spark-b", p.settings.model_copy(update={"controller_api_url": f"http://localhost:{port}"}),
                           data)
        with pytest.raises(requests.exceptions.SSLError):
            client.session.get(f"{wrong}/health", timeout=5)


def test_a_door_reaches_the_tls_guard_with_its_certificate_and_checks_over_tls(tls_guard, tmp_path):
    tmp, ca, p, _, port = tls_guard
    (tmp_path / "ca.crt").write_text(ca.cert_pem)
    (tmp_path / "host.crt").write_text(pki.issue(ca, "door", pki.host_names("door", "127.0.0.1"), client=True))
    (tmp_path / "host.crt.key").write_text(pki.host_key_pem(ca, "door"))
    door_port = free_port()
    settings = p.settings.model_copy(update={"front_door_users": {"alice": FrontDoorUser(key=USER_KEY)},
                                             "front_door_allow_http": True, "front_door_port": door_port})
    door = fd_plan.FrontDoor("door", settings, (fd_plan.Backend("spark-a", "127.0.0.1", port, True),), KEY,
                             backend_tls=True)
    config = door.config()
    assert f"verifyhost spark-a" in config and f"ssl verify required ca-file {paths.TLS_CA} crt" in config
    door_files(door, tmp_path)
    moved = {paths.FRONT_DOOR_DIR: str(tmp_path), paths.TLS_DIR: str(tmp_path),
             paths.FRONT_DOOR_SOCKET: str(tmp_path / "admin.sock"), paths.FRONT_DOOR_STATE_FILE: str(tmp_path / "st"),
             f"bind :{door_port}": f"bind 127.0.0.1:{door_port}"}
    # /health is 200 only once a backend is in: its checks (the chat probe, with the key) passed over TLS
    with haproxy_serving(config, tmp_path, moved, f"http://127.0.0.1:{door_port}") as url:
        reply = requests.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {USER_KEY}"},
                              json={"model": settings.served_model_name, "messages": []}, timeout=10)
        assert reply.status_code == 200


def test_no_key_material_in_the_rendered_configs(tls_guard):
    tmp, ca, p, guard, _ = tls_guard
    config = guard.config()
    assert "PRIVATE KEY" not in config and "BEGIN" not in config and KEY not in config
    assert f"ssl crt {paths.TLS_HOST_CERT} ca-file {paths.TLS_CA} verify required" in config
