"""Output that reads well (issue 51, item 6), against hostile loopback ports: `status` says what a failed request
means in words (never a library's exception text) and prints no traceback when a port answers without an SSH
banner; `sparkfleet logs` to a port that accepts and never speaks ends within its connect timeout."""

from __future__ import annotations

import shutil
import ssl
import threading
import time

import pytest
import requests

from sparkfleet import cli
from sparkfleet.contract import reach
from sparkfleet.fleet.status import detail_words, in_words
from sparkfleet.roles import pki

from .hostile_ports import closed_port, garbage_port, silent_port

LIBRARY_WORDS = ("Error", "Exception", "HTTPConnectionPool", "urllib3", "Errno", "object at 0x", "Max retries")


def failure(url: str, **kw) -> BaseException:
    try:
        requests.get(url, **kw)
    except requests.RequestException as exc:
        return exc
    raise AssertionError(f"{url} answered")


def test_a_closed_port_is_connection_refused():
    assert in_words(failure(f"http://127.0.0.1:{closed_port()}/health", timeout=2)) == "connection refused"


def test_a_port_that_never_speaks_is_a_timeout():
    with silent_port() as port:
        assert in_words(failure(f"http://127.0.0.1:{port}/health", timeout=0.5)) == "timed out waiting for an answer"


def test_a_port_that_answers_garbage_is_said_so():
    with garbage_port() as port:
        words = in_words(failure(f"http://127.0.0.1:{port}/health", timeout=2))
    assert words in ("answered, but not HTTP", "closed the connection without an answer",
                     "connection reset by the server", "answer cut off (connection broken)",
                     "answer cut off or garbled"), words
    assert not any(w in words for w in LIBRARY_WORDS)


def test_https_to_a_port_that_does_not_speak_tls():
    with garbage_port() as port:
        words = in_words(failure(f"https://127.0.0.1:{port}/health", timeout=2))
    assert words.startswith("TLS: "), words


@pytest.fixture
def tls_port(tmp_path):
    """A TLS server on loopback whose certificate the client does not trust (the fleet CA's own, self-signed)."""
    import socket

    pki.write_ca(tmp_path / "ca.crt", tmp_path / "ca.key")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "ca.crt", tmp_path / "ca.key")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)

    def serve():
        while True:
            try:
                conn = sock.accept()[0]
            except OSError:
                return
            try:
                context.wrap_socket(conn, server_side=True).recv(1)
            except (OSError, ssl.SSLError):
                pass
            conn.close()
    threading.Thread(target=serve, daemon=True).start()
    yield sock.getsockname()[1]
    sock.close()


def test_a_certificate_not_trusted_is_said_so(tls_port):
    assert in_words(failure(f"https://127.0.0.1:{tls_port}/health", timeout=3)) == "TLS: certificate not trusted"


@pytest.mark.parametrize("detail,words", [
    ("health: /health: URLError: <urlopen error [Errno 111] Connection refused>",
     "health: /health: connection refused"),
    ("/health: TimeoutError: timed out", "/health: timed out"),
    ("/v1/models: HTTP 503", "/v1/models: HTTP 503"),  # words already: kept
    ("health: /health: OSError: [Errno 99] odd", "health: /health: no usable answer"),
])
def test_the_host_helpers_reason_in_words(detail, words):
    assert detail_words(detail) == words


def inventory(tmp_path, port: int, **extra) -> str:
    path = tmp_path / "office.py"
    data = {"ssh_hostname": "127.0.0.1", "ssh_port": port, "ssh_strict_host_key_checking": "yes",
            "ssh_known_hosts_file": str(tmp_path / "known_hosts"), **extra}
    path.write_text(f"sparks = [('spark-1', {data!r})]\n")
    return str(path)


@pytest.mark.parametrize("kind", ["silent", "garbage"])
def test_status_to_a_port_without_an_ssh_banner_prints_words_not_tracebacks(tmp_path, capfd, kind):
    """Before: 92 lines of paramiko's tracebacks (its transport thread logs each failed banner) and
    `ChunkedEncodingError: ("Connection broken: ...` in the detail column."""
    ports = {"silent": silent_port, "garbage": garbage_port}
    started = time.monotonic()
    with ports[kind]() as port:
        inv = inventory(tmp_path, port, api_host="0.0.0.0", controller_api_url=f"http://127.0.0.1:{port}")
        code = cli.main(["status", inv])
        time.sleep(0.5)  # paramiko's transport thread logs after the table, where it logs
    out, err = capfd.readouterr()
    assert code == 1 and time.monotonic() - started < 60
    assert "Traceback" not in out + err and "paramiko" not in out + err and "SSH error" not in err, (out, err)
    assert "unreachable over SSH" in out
    assert not any(w in out for w in LIBRARY_WORDS), out


@pytest.mark.ssh
@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs OpenSSH's client")
def test_logs_to_a_port_that_never_speaks_ends_within_the_connect_timeout(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(reach, "SSH_CONNECT_TIMEOUT_S", 2)
    started = time.monotonic()
    with silent_port() as port:
        code = cli.main(["logs", inventory(tmp_path, port), "spark-1"])
    took = time.monotonic() - started
    out, err = capsys.readouterr()
    assert code == 255 and took < 10, (took, out, err)
    assert "timed out" in err and "Traceback" not in out + err
