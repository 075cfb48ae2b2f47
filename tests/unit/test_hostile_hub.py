"""Hub and peer answers are data, never paths, and never more bytes than the manifest says.

A hostile hub (on loopback, spoken to by the real huggingface_hub client) is
refused at plan time; a hostile job reaching the host's fetch script is refused
before anything is written or asked; an endless peer is cut at the manifest's size.
"""

import hashlib
import json
import threading
import time
import urllib.parse
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from sparkfleet.contract.shared import verify
from sparkfleet.model.hubs import cache_dir, hub_resolver
from sparkfleet.model.manifest import Manifest, ManifestFile, UntrustedAnswer
from sparkfleet.release.plan import plan_hosts

from .helpers import host_data, run_fetch

CONFIG = b'{"model_type": "x"}\n'  # 20 bytes
CONFIG_SHA256 = hashlib.sha256(CONFIG).hexdigest()
GOOD_COMMIT = "0123456789abcdef0123456789abcdef01234567"

HOSTILE_COMMITS = ["/../../..", "../../../etc", "0123456789abcdef", "0123456789ABCDEF0123456789ABCDEF01234567",
                   GOOD_COMMIT + "\n", GOOD_COMMIT + "/..", "", "main"]
HOSTILE_PATHS = ["../../../../etc/cron.d/x", "/etc/cron.d/x", "a/../b", "a/./b", "a//b", "a/", ".", "..", "...",
                 "etc/cron.d/x/..", ".sparkfleet-verified.json", "sub/.sparkfleet-verified.json",
                 ".sparkfleet-verified.json.partial", ".staging/x", "config.json.part", "con\nfig.json",
                 "tab\tname", "nul\0name", "esc\x1b[2J", "back\\slash", ""]


@pytest.mark.parametrize("commit", HOSTILE_COMMITS)
def test_hostile_commit_ids_are_refused(commit):
    with pytest.raises(UntrustedAnswer, match="not 40 or 64 hex"):
        Manifest("huggingface", "org/m", "main", commit, (ManifestFile("config.json", 20, sha256=CONFIG_SHA256),))


def test_commit_ids_of_sha1_and_sha256_repositories_pass():
    assert verify.check_commit(GOOD_COMMIT) == GOOD_COMMIT
    assert verify.check_commit("ab" * 32) == "ab" * 32
    assert verify.check_commit(None) is None


@pytest.mark.parametrize("path", HOSTILE_PATHS)
def test_hostile_manifest_paths_are_refused(path):
    with pytest.raises(UntrustedAnswer, match="manifest path"):
        ManifestFile(path, 20, sha256=CONFIG_SHA256)


def test_plain_manifest_paths_pass():
    for path in ("config.json", "sub/dir/model.safetensors", ".gitattributes", "a.b/c..d", "original/params.json"):
        assert verify.check_manifest_path(path) == path


def test_a_file_cannot_also_be_a_directory():
    with pytest.raises(UntrustedAnswer, match="lies under another listed file"):
        verify.check_manifest_paths(["a", "a/b"])


@contextmanager
def http_server(handler_class):
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_class)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server
    finally:
        server.shutdown()
        server.server_close()


def hostile_hub(sha: str, rfilename: str):
    """A Hugging Face API answering model_info with the given commit and file name."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"id": "org/m", "modelId": "org/m", "sha": sha, "private": False,
                               "siblings": [{"rfilename": rfilename, "size": 20, "blobId": "ab" * 20}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    return http_server(Handler)


@pytest.mark.parametrize(("sha", "rfilename", "why"), [
    ("/../../..", "config.json", "commit id '/../../..' is not 40 or 64 hex"),
    (GOOD_COMMIT, "../../../../etc/cron.d/x", "manifest path '../../../../etc/cron.d/x' is not normalised"),
    (GOOD_COMMIT, "/etc/cron.d/x", "manifest path '/etc/cron.d/x' is absolute"),
])
def test_a_hostile_hub_is_refused_at_plan_time(sha, rfilename, why):
    with hostile_hub(sha, rfilename) as (url, _):
        [plan] = plan_hosts([("a", host_data(model_hub="huggingface", model_repo="Qwen/Qwen3.5-35B-A3B-FP8",
                                             model_revision="main", hub_endpoint=url))], resolve=hub_resolver)
    assert plan.manifest is None
    assert plan.hub_error.startswith("refusing huggingface:Qwen/Qwen3.5-35B-A3B-FP8@main from http://127.0.0.1:")
    assert why in plan.hub_error
    assert not (cache_dir() / "manifests").exists()  # nothing cached, anywhere


class CountingPeer(BaseHTTPRequestHandler):
    """A peer that answers every path with the same bytes, and remembers each request."""

    requests: ClassVar[list[str]] = []
    body = CONFIG

    def do_GET(self):
        type(self).requests.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def write_job(tmp_path, files, commit=GOOD_COMMIT, peers=(), dir_name="org--m@0123456789abcdef"):
    job = tmp_path / "jobs" / "job.json"
    job.parent.mkdir(exist_ok=True)
    model_root = tmp_path / "root" / "models"
    job.write_text(json.dumps({
        "manifest": {"hub": "huggingface", "repo": "org/m", "revision": "main", "commit": commit, "files": files},
        "model_dir": f"{model_root}/{dir_name}", "staging_dir": f"{model_root}/.staging/{dir_name}",
        "endpoint": "http://127.0.0.1:9", "peers": list(peers)}))
    return job


@pytest.mark.parametrize("path", ["../../../../etc/cron.d/x", "../x", "/tmp/x", "a/../../b", "a/../b",
                                  ".sparkfleet-verified.json", "con\nfig.json", "a//b"])
def test_fetch_refuses_a_hostile_path_before_writing_anything(tmp_path, path):
    CountingPeer.requests = []
    with http_server(CountingPeer) as (url, _):
        files = [{"path": "config.json", "size": 20, "sha256": CONFIG_SHA256},
                 {"path": path, "size": 20, "sha256": CONFIG_SHA256}]
        job = write_job(tmp_path, files, peers=[f"{url}/org--m@0123456789abcdef"])
        before = tree(tmp_path)
        rc, stderr = run_fetch(job)
    assert rc == 2 and "REFUSED" in stderr and "manifest path" in stderr
    assert CountingPeer.requests == []
    assert tree(tmp_path) == before  # not even the model directory was made


@pytest.mark.parametrize(("commit", "dir_name"), [("/../../..", ".."), (GOOD_COMMIT, ".."), (GOOD_COMMIT, "")])
def test_fetch_refuses_a_hostile_commit_or_model_directory(tmp_path, commit, dir_name):
    job = write_job(tmp_path, [{"path": "config.json", "size": 20, "sha256": CONFIG_SHA256}], commit=commit,
                    dir_name=dir_name)
    before = tree(tmp_path)
    rc, stderr = run_fetch(job)
    assert rc == 2 and "REFUSED" in stderr
    assert tree(tmp_path) == before


def test_fetch_refuses_a_model_directory_that_is_a_symlink(tmp_path):
    elsewhere = tmp_path / "etc"
    elsewhere.mkdir()
    (tmp_path / "root" / "models").mkdir(parents=True)
    (tmp_path / "root" / "models" / "org--m@0123456789abcdef").symlink_to(elsewhere)
    job = write_job(tmp_path, [{"path": "config.json", "size": 20, "sha256": CONFIG_SHA256}])
    rc, stderr = run_fetch(job)
    assert rc == 2 and "is a symlink" in stderr
    assert list(elsewhere.iterdir()) == []


class EndlessPeer(BaseHTTPRequestHandler):
    """A peer that streams zeros for ever, whatever the file."""

    protocol_version = "HTTP/1.0"

    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        chunk = b"\0" * 65536
        try:
            while True:
                self.wfile.write(chunk)
        except OSError:
            pass

    def log_message(self, *args):
        pass


def test_an_endless_peer_is_cut_at_the_manifest_size(tmp_path):
    """20 bytes expected: the endless peer fails after 21, the next peer's bytes are verified and land."""
    CountingPeer.requests = []
    with http_server(EndlessPeer) as (endless, _), http_server(CountingPeer) as (good, _):
        job = write_job(tmp_path, [{"path": "config.json", "size": 20, "sha256": CONFIG_SHA256}],
                        peers=[f"{endless}/org--m@0123456789abcdef", f"{good}/org--m@0123456789abcdef"])
        rc, report = run_fetch(job)
    assert rc == 0, report
    assert report["fetched"] == ["config.json"]
    model_dir = tmp_path / "root/models/org--m@0123456789abcdef"
    assert (model_dir / "config.json").read_bytes() == CONFIG
    assert CountingPeer.requests == ["/org--m@0123456789abcdef/config.json"]
    assert not (tmp_path / "root/models/.staging/org--m@0123456789abcdef").exists()


class NoHub(BaseHTTPRequestHandler):
    """A hub that has nothing (404 at once: the client does not retry)."""

    def do_HEAD(self):
        self.send_error(404)

    do_GET = do_HEAD

    def log_message(self, *args):
        pass


def test_an_endless_peer_alone_fails_the_file_with_nothing_landed(tmp_path):
    with http_server(EndlessPeer) as (endless, _), http_server(NoHub) as (hub, _):
        job = write_job(tmp_path, [{"path": "config.json", "size": 20, "sha256": CONFIG_SHA256}],
                        peers=[f"{endless}/org--m@0123456789abcdef"])
        job.write_text(job.read_text().replace("http://127.0.0.1:9", hub))
        rc, stderr = run_fetch(job)
    assert rc == 3
    assert "sent more than the manifest's 20 bytes" in stderr
    staging = tmp_path / "root/models/.staging/org--m@0123456789abcdef"
    assert not (tmp_path / "root/models/org--m@0123456789abcdef/config.json").exists()
    assert list(staging.glob("config.json*")) == []  # the cut .part was dropped, not kept to resume


class HostileHub(BaseHTTPRequestHandler):
    """Both hubs' file APIs (Hugging Face's resolve URL, HEAD and GET; ModelScope's repo?FilePath=), holding
    files by literal name. An ENDLESS file is announced at its manifest size and streamed without a length."""

    protocol_version = "HTTP/1.0"
    files: ClassVar[dict[str, bytes]] = {}
    requests: ClassVar[list] = []  # the literal file names asked for (None: not a file request)
    sent: ClassVar[list[int]] = []  # bytes of each endless stream written before the client hung up
    ENDLESS = "model-00001.safetensors"
    LIMIT = 256 << 20  # the stream ends here if nothing cuts it

    def _name(self):
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/api/v1/models/org/m/repo":
            return urllib.parse.parse_qs(url.query).get("FilePath", [None])[0]
        prefix = f"/org/m/resolve/{GOOD_COMMIT}/"
        return urllib.parse.unquote(url.path[len(prefix):]) if url.path.startswith(prefix) else None

    def _head(self, name):
        if name != self.ENDLESS and name not in self.files:
            self.send_error(404)
            return False
        self.send_response(200)
        self.send_header("ETag", f'"{"ab" * 32}"')
        self.send_header("X-Repo-Commit", GOOD_COMMIT)
        if name in self.files:
            self.send_header("Content-Length", str(len(self.files[name])))
        elif self.command == "HEAD":
            self.send_header("Content-Length", "1000")  # what the manifest says; the GET sends no length
        self.end_headers()
        return True

    def do_HEAD(self):
        self._head(self._name())

    def do_GET(self):
        name = self._name()
        type(self).requests.append(name)
        if not self._head(name):
            return
        if name in self.files:
            self.wfile.write(self.files[name])
            return
        sent, chunk = 0, b"\1" * 65536
        try:
            while sent < self.LIMIT:
                self.wfile.write(chunk)
                sent += len(chunk)
        except OSError:
            pass
        type(self).sent.append(sent)

    def log_message(self, *args):
        pass


def endless_streams():
    """Bytes written of each endless stream, once the server saw every one of them hung up on (or ended)."""
    deadline = time.monotonic() + 10
    while len(HostileHub.sent) < HostileHub.requests.count(HostileHub.ENDLESS) and time.monotonic() < deadline:
        time.sleep(0.05)
    return HostileHub.sent


def hub_job(tmp_path, hub, url, files):
    job = write_job(tmp_path, files)
    data = json.loads(job.read_text())
    data["manifest"]["hub"], data["endpoint"] = hub, url
    job.write_text(json.dumps(data))
    return job, tmp_path / "root/models/org--m@0123456789abcdef", tmp_path / "root/models/.staging"


@pytest.fixture
def file_hub():
    HostileHub.files, HostileHub.requests, HostileHub.sent = {}, [], []
    with http_server(HostileHub) as (url, _):
        yield url


@pytest.mark.parametrize("hub", ["huggingface", "modelscope"])
def test_a_hub_streaming_past_the_manifest_size_is_cut_with_nothing_landed(tmp_path, file_hub, hub):
    """1000 bytes announced, megabytes streamed without a length: no byte past 1000 is written, the stream
    is dropped long before its end, and neither staging nor the model directory keeps any of it."""
    HostileHub.files = {"config.json": CONFIG}
    job, model_dir, staging = hub_job(tmp_path, hub, file_hub, [
        {"path": "config.json", "size": 20, "sha256": CONFIG_SHA256},
        {"path": HostileHub.ENDLESS, "size": 1000, "sha256": "cd" * 32}])
    rc, stderr = run_fetch(job)
    assert rc == 3 and f"{HostileHub.ENDLESS}: hub download failed" in stderr, stderr
    assert endless_streams() and max(endless_streams()) < 64 << 20  # cut: the rest of the 256 MiB never sent
    assert (model_dir / "config.json").read_bytes() == CONFIG
    assert not (model_dir / HostileHub.ENDLESS).exists()
    assert [p for p in staging.rglob("*") if p.is_file()] == []  # no .part, no .incomplete, no file
    assert sorted(json.loads((model_dir / ".sparkfleet-verified.json").read_text())) == ["config.json"]


@pytest.mark.parametrize("hub", ["huggingface", "modelscope"])
def test_manifest_paths_reach_the_hub_as_literal_names(tmp_path, file_hub, hub):
    """A path `*` or `a/*.safetensors` is a file of that name: the client asks for it alone, never a pattern
    that pulls the rest of the repository."""
    star, weights = b"a file named *\n", b"a file named a/*.safetensors\n"
    HostileHub.files = {"*": star, "a/*.safetensors": weights, "config.json": CONFIG, "a/x.safetensors": b"x" * 99}
    job, model_dir, _ = hub_job(tmp_path, hub, file_hub, [
        {"path": "*", "size": len(star), "sha256": hashlib.sha256(star).hexdigest()},
        {"path": "a/*.safetensors", "size": len(weights), "sha256": hashlib.sha256(weights).hexdigest()}])
    rc, report = run_fetch(job)
    assert rc == 0, report
    assert sorted(report["fetched"]) == ["*", "a/*.safetensors"]
    assert sorted({name for name in HostileHub.requests if name}) == ["*", "a/*.safetensors"]  # files asked for
    assert (model_dir / "*").read_bytes() == star and (model_dir / "a/*.safetensors").read_bytes() == weights
    assert tree(model_dir) == sorted([".sparkfleet-verified.json", "*", "a", "a/*.safetensors"])


@pytest.mark.parametrize("hub", ["huggingface", "modelscope"])
def test_the_controller_reads_config_json_capped_and_verified(file_hub, hub, monkeypatch):
    """The plan's config.json comes through the hosts' download: an endless one is cut, a wrong one refused,
    and neither is cached."""
    from sparkfleet.model.hubs import HubError, read_model_config

    manifest = Manifest(hub, "org/m", "main", GOOD_COMMIT, (ManifestFile("config.json", 20, sha256=CONFIG_SHA256),))
    monkeypatch.setattr(HostileHub, "ENDLESS", "config.json")
    with pytest.raises(HubError, match=r"cannot read config\.json of \w+:org/m: (TooLong|FileSizeMismatchError): "):
        read_model_config(manifest, file_hub, None)
    assert endless_streams() and max(endless_streams()) < 64 << 20
    monkeypatch.setattr(HostileHub, "ENDLESS", None)
    HostileHub.files = {"config.json": b'{"model_type": "y"}\n'}  # 20 bytes, another hash
    with pytest.raises(HubError, match="do not match the manifest's size and hash"):
        read_model_config(manifest, file_hub, None)
    assert [p for p in (cache_dir() / "configs").rglob("*") if p.is_file()] == []
    HostileHub.files = {"config.json": CONFIG}
    assert read_model_config(manifest, file_hub, None) == {"model_type": "x"}


def test_the_one_cap_never_writes_a_byte_past_the_size():
    """CappedFile, which the peer and Hugging Face paths write through: a chunk that would pass the size is
    refused whole, also after a client rewinds to restart a transfer; copy_capped reads at most size + 1."""
    import io

    from sparkfleet.model.hubs import _fetch_script

    fetch = _fetch_script()
    out = io.BytesIO()
    capped = fetch.CappedFile(out, 1000)
    capped.write(b"x" * 999)
    with pytest.raises(fetch.TooLong):
        capped.write(b"yy")
    capped.write(b"z")
    assert out.getvalue() == b"x" * 999 + b"z"
    capped.seek(0)
    capped.truncate()
    capped.write(b"w" * 1000)
    assert out.getvalue() == b"w" * 1000

    class Endless:
        asked = 0

        def read(self, n):
            Endless.asked += n
            return b"\1" * n

    target = io.BytesIO()
    assert fetch.copy_capped(Endless(), target, 1000) is False
    assert (Endless.asked, target.getvalue()) == (1001, b"")
    assert fetch.copy_capped(io.BytesIO(b"k" * 1000), io.BytesIO(), 1000) is True
