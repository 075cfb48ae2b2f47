"""Getting started (issue 51, item 7): the README's client example, read from README.md as it is, runs against a door
stand-in serving the certificate `sparkfleet init` made (init run with the README's own `init` line), trusting it the
way the README says; with another certificate in its place the same example is refused (the check is real)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from sparkfleet import cli
from tests.unit.helpers import no_keyscan

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
KEY = "alice-key-0123456789abcdef0123456789"
ANSWER = "Hello from the door"

pytestmark = pytest.mark.skipif(not (shutil.which("openssl") and shutil.which("ssh-keygen")),
                                reason="init makes the door's certificate with openssl and checks keys with ssh-keygen")

# The door: HTTPS on loopback with init's certificate and key; answers a chat completion to alice's key alone.
DOOR = r"""
import json, ssl, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

crt, key, want_key, answer = sys.argv[1:5]

class Door(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        ok = (self.path == "/v1/chat/completions" and self.headers.get("Authorization") == f"Bearer {want_key}"
              and body.get("model") == "Qwen3.5-35B-A3B")
        reply = {"id": "c1", "object": "chat.completion", "created": 0, "model": body.get("model"),
                 "choices": [{"index": 0, "finish_reason": "stop",
                              "message": {"role": "assistant", "content": answer}}]} if ok else {"error": "no"}
        data = json.dumps(reply).encode()
        self.send_response(200 if ok else 401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass

server = HTTPServer(("127.0.0.1", 0), Door)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(crt, key)
server.socket = context.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.serve_forever()
"""

# Run before the example: the door's address is the README's (the certificate is checked against it), only the
# route to it is the loopback stand-in's; nothing else is reachable.
ROUTE = """
import socket as _socket
_connect = _socket.create_connection
def _route(address, *args, **kwargs):
    if tuple(address[:2]) != ({door!r}, {port}):
        raise OSError(f"no route to {{address}} in this test")
    return _connect(("127.0.0.1", {local}), *args, **kwargs)
_socket.create_connection = _route
"""


def code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.S | re.M)


def readme_example() -> str:
    """The README's client example: its one python block that makes an OpenAI client."""
    found = [b for b in code_blocks(README.read_text(), "python") if "OpenAI(" in b and "base_url=" in b]
    assert len(found) == 1, found
    return found[0]


def readme_init() -> list[str]:
    """The README's `sparkfleet init office ...` line, as argv for cli.main."""
    lines = [line.split("#")[0].strip() for block in code_blocks(README.read_text(), "sh")
             for line in block.splitlines() if line.startswith("sparkfleet init office ")]
    assert lines, "the README shows no `sparkfleet init office` line"
    return shlex.split(lines[0])[1:]


@pytest.fixture
def office(tmp_path, monkeypatch, capsys):
    """The README's `init`, run in tmp/ (no Spark answers its key scan): the certificate `init` made and its key."""
    no_keyscan(tmp_path, monkeypatch)
    monkeypatch.chdir(tmp_path)
    assert cli.main([*readme_init(), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    crt, key = Path(report["tls"]["cert"]), Path(report["tls"]["key"])
    shown = re.search(r"`(~/\.config/sparkfleet/office\.crt)`", README.read_text())
    assert shown and Path(shown.group(1)).expanduser() == crt  # the file the README tells colleagues to take
    return crt, key


@pytest.fixture
def door(office, tmp_path):
    """The stand-in door on loopback, serving init's certificate: its port."""
    crt, key = office
    proc = subprocess.Popen([sys.executable, "-c", DOOR, str(crt), str(key), KEY, ANSWER], stdout=subprocess.PIPE,
                            text=True)
    try:
        port = int(proc.stdout.readline())
        yield port
    finally:
        proc.kill()
        proc.wait(timeout=10)


def door_address() -> tuple[str, int]:
    """Where the README's example sends its requests (its base_url's host and port)."""
    found = re.search(r'base_url="https://([\d.]+):(\d+)/v1"', readme_example())
    assert found, "the README's example names no https base_url"
    return found.group(1), int(found.group(2))


def run_example(tmp_path: Path, trusted: Path, port: int) -> subprocess.CompletedProcess:
    """The README's example, as written, in a colleague's folder holding `trusted` as office.crt."""
    colleague = tmp_path / "alice"
    colleague.mkdir(exist_ok=True)
    shutil.copy(trusted, colleague / "office.crt")
    address, door_port = door_address()
    prelude = ROUTE.format(door=address, port=door_port, local=port)
    env = {k: v for k, v in os.environ.items()
           if k.upper() not in ("SSL_CERT_FILE", "SSL_CERT_DIR", "HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY",
                                "OPENAI_BASE_URL", "PYTHONPATH")}
    env.update(OPENAI_API_KEY=KEY, OPENAI_MAX_RETRIES="0")
    return subprocess.run([sys.executable, "-c", prelude + readme_example()], cwd=colleague, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_readme_s_client_example_works_against_init_s_certificate(office, door, tmp_path):
    crt, _ = office
    proc = run_example(tmp_path, crt, door)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == ANSWER


def test_the_example_refuses_a_door_with_another_certificate(office, door, tmp_path, capsys):
    """A colleague holding another office's certificate is refused: the example checks, it does not just connect."""
    assert cli.main(["init", str(tmp_path / "other"), "--host", "spark-1=10.0.0.11", "--json"]) == 0
    other = Path(json.loads(capsys.readouterr().out)["tls"]["cert"])
    proc = run_example(tmp_path, other, door)
    assert proc.returncode != 0 and ANSWER not in proc.stdout
    assert "CERTIFICATE_VERIFY_FAILED" in proc.stderr or "certificate verify failed" in proc.stderr, \
        proc.stderr[-2000:]


def test_init_s_certificate_passes_strict_verification(office, door):
    """Python 3.13's default context verifies strictly (VERIFY_X509_STRICT): set here, so a colleague on a newer
    Python trusts the same file; the name checked is the README's door address."""
    crt, _ = office
    context = ssl.create_default_context(cafile=str(crt))
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    address, _ = door_address()
    with socket.create_connection(("127.0.0.1", door), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=address) as tls:
        assert tls.version() in ("TLSv1.2", "TLSv1.3")
