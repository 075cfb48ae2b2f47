"""The one HTTP wait (host/operations.py `http_wait`) that the front door, Prometheus and the chat UI stages run
after a (re)start: its command, run here by sh against a local server, returns at the first answer, fails in one
line naming what did not answer, and keeps every value one quoted word."""

from __future__ import annotations

import shlex
import socketserver
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sparkfleet.host.operations import http_wait_command
from tests.conftest import free_port


class Answers(BaseHTTPRequestHandler):
    asked = 0

    def do_GET(self):  # noqa: N802 - http.server's name
        type(self).asked += 1
        self.send_response(503 if self.path == "/busy" else 200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    Answers.asked = 0
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def run(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30)


def test_it_returns_at_the_first_answer(server):
    done = run(http_wait_command(f"{server}/health", 30, 2, "the door has no backend in after 30s"))
    assert done.returncode == 0 and Answers.asked == 1 and done.stderr == ""


def test_it_fails_after_its_tries_naming_what_did_not_answer_and_why(server):
    done = run(http_wait_command(f"{server}/busy", 2, 2, "Prometheus is not ready after 2s"))
    assert done.returncode == 1 and Answers.asked == 2
    [line] = done.stderr.splitlines()  # one line: the failure and curl's last error, not one line per try
    assert line.startswith("Prometheus is not ready after 2s (") and "503" in line


def test_a_closed_port_fails_too():
    done = run(http_wait_command(f"http://127.0.0.1:{free_port()}/health", 1, 1, "the chat UI did not answer"))
    assert done.returncode == 1 and done.stderr.startswith("the chat UI did not answer (")


class UnixHttp(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def test_it_asks_on_a_unix_socket_where_given(tmp_path):
    """The chat UI listens on a unix socket only: the same loop, curl told the socket (the URL's host a name)."""
    path = tmp_path / "ui.sock"
    httpd = UnixHttp(str(path), Answers)
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    Answers.asked = 0
    try:
        done = run(http_wait_command("http://open-webui/health", 5, 2, "the chat UI did not answer",
                                     unix_socket=str(path)))
        assert done.returncode == 0 and Answers.asked == 1 and done.stderr == ""
        assert f"--unix-socket {shlex.quote(str(path))} " in http_wait_command("http://x/", 1, 1, "x",
                                                                              unix_socket=str(path))
    finally:
        httpd.shutdown()
        httpd.server_close()
    gone = run(http_wait_command("http://open-webui/health", 1, 1, "the chat UI did not answer",
                                 unix_socket=str(path)))
    assert gone.returncode == 1 and gone.stderr.startswith("the chat UI did not answer (")


def test_hostile_values_stay_one_word_each(tmp_path):
    marker = tmp_path / "ran"
    url = f"http://127.0.0.1:1/$(touch {marker})';touch {marker};'`touch {marker}`"
    failure = f"it's \"down\" $(touch {marker}); `touch {marker}`"
    command = http_wait_command(url, 1, 1, failure, insecure=True)
    assert shlex.quote(url) in command and shlex.quote(failure) in command
    done = run(command)
    assert done.returncode == 1 and not marker.exists()
    assert done.stderr.startswith(failure + " (")


def test_the_ask_checks_no_certificate_only_where_asked():
    """-k where the stage asks its own https service (the door's certificate names the door, not 127.0.0.1)."""
    assert "curl -fsSk " in http_wait_command("https://127.0.0.1:8080/health", 5, 1, "x", insecure=True)
    assert "curl -fsS " in http_wait_command("http://127.0.0.1:8080/health", 5, 1, "x")
    command = http_wait_command("http://a/", 7, 3, "x")
    assert command.startswith("for i in $(seq 7); do err=$(curl -fsS --max-time 3 ")
    assert "[ $i -lt 7 ] && sleep 1; done" in command  # no sleep after the last try

