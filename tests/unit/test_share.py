"""files/sparkfleet-share on loopback: fleet only, verified regular files only, bounded and resumable."""

import http.client
import os
import socket
import time
from pathlib import Path

import pytest

from sparkfleet.contract.shared import verify

from .helpers import start_share

TOKEN = "share-test-token-0123456789"
MODEL = "org--model@0123456789abcdef"
CONFIG = b'{"architectures": ["Qwen3NextForCausalLM"], "hidden_size": 2048}\n'
SECRET = b"root:x:0:0:TOP SECRET, not a model file\n"


def vouch(model_dir: Path, paths: dict[str, Path]) -> None:
    """A record vouching for each path with the stat of the file given (as sparkfleet-fetch would write it)."""
    record = {}
    for path, source in paths.items():
        data = source.read_bytes()
        record[path] = verify.record_entry(os.stat(source), {"size": len(data), "sha256": "0" * 64})
    verify.write_record(model_dir, record)


@pytest.fixture
def share(tmp_path):
    root = tmp_path / "models"
    model_dir = root / MODEL
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_bytes(CONFIG)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "passwd").write_bytes(SECRET)
    (model_dir / "tokenizer.json").symlink_to(outside / "passwd")
    (model_dir / "weights").symlink_to(outside)
    vouch(model_dir, {"config.json": model_dir / "config.json",
                      # a record that (somehow) vouches for the targets' stat: still never served
                      "tokenizer.json": outside / "passwd", "weights/passwd": outside / "passwd"})
    (root / "linked@0123456789abcdef").symlink_to(model_dir)
    token_file = tmp_path / "fleet.token"
    token_file.write_text(TOKEN + "\n")
    proc, url = start_share(root, token_file, "--timeout", "1", "--max-connections", "8")
    yield proc, url.rsplit(":", 1)[1], model_dir
    proc.terminate()
    proc.wait(10)


def get(port, path, token=TOKEN, **headers):
    conn = http.client.HTTPConnection("127.0.0.1", int(port), timeout=10)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    conn.request("GET", path, headers=headers)
    reply = conn.getresponse()
    body = reply.read()
    conn.close()
    return reply.status, body, reply


def test_only_the_fleet_token_opens_it(share):
    _, port, _ = share
    assert get(port, f"/{MODEL}/config.json", token=None)[0] == 401
    assert get(port, f"/{MODEL}/config.json", token="guess")[0] == 403
    status, body, _ = get(port, f"/{MODEL}/config.json")
    assert (status, body) == (200, CONFIG)


def test_symlinks_are_never_followed(share):
    _, port, _ = share
    for path in (f"/{MODEL}/tokenizer.json", f"/{MODEL}/weights/passwd", "/linked@0123456789abcdef/config.json",
                 f"/{MODEL}/../{MODEL}/config.json", f"/{MODEL}/%2e%2e/%2e%2e/outside/passwd",
                 f"/{MODEL}/.sparkfleet-verified.json"):
        status, body, _ = get(port, path)
        assert status == 404, path
        assert b"TOP SECRET" not in body and b"Qwen3Next" not in body, path


def test_a_file_changed_since_it_was_verified_is_not_served(share):
    _, port, model_dir = share
    target = model_dir / "config.json"
    st = target.stat()
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert get(port, f"/{MODEL}/config.json")[0] == 404
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert get(port, f"/{MODEL}/config.json")[0] == 200


def test_range_resumes_a_cut_transfer(share):
    _, port, _ = share
    status, body, reply = get(port, f"/{MODEL}/config.json", Range="bytes=10-")
    assert (status, body) == (206, CONFIG[10:])
    assert reply.headers["Content-Range"] == f"bytes 10-{len(CONFIG) - 1}/{len(CONFIG)}"


def threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads: line")


def test_300_half_open_connections_do_not_exhaust_it(share):
    proc, port, _ = share
    held = []
    try:
        for _ in range(300):
            s = socket.create_connection(("127.0.0.1", int(port)), timeout=10)
            s.sendall(b"GET /" + MODEL.encode())  # and never the rest of the request
            held.append(s)
        assert threads(proc.pid) <= 8 + 2  # the cap, the main thread, and one spare
        assert held[-1].recv(64).startswith(b"HTTP/1.0 503")  # beyond the cap: turned away at once
        deadline = time.monotonic() + 15
        while True:  # each silent connection times out after 1 s and frees its slot
            try:
                status = get(port, f"/{MODEL}/config.json")[0]
            except OSError:
                status = None
            if status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert status == 200
    finally:
        for s in held:
            s.close()
