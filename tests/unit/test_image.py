"""The engine image pinned by content: a registry on 127.0.0.1 (tokens, manifest lists, 404), a `docker save`
tar built here, and what the plan does with the pin (release id, units, JSON, offline)."""

import hashlib
import io
import json
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sparkfleet.release import image as image_mod
from sparkfleet.release.image import ImageError, archive_image_id, parse_image, registry_digest
from sparkfleet.release.plan import plan_hosts
from tests.unit.helpers import host_data

INDEX = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                    "manifests": []}).encode()
INDEX_DIGEST = "sha256:" + hashlib.sha256(INDEX).hexdigest()


class Registry(BaseHTTPRequestHandler):
    """A Distribution API stand-in: manifests of vllm/vllm-openai by tag; with `token`, Docker Hub's flow."""
    token: str | None = None
    send_digest = True
    seen: list

    def log_message(self, *args):
        pass

    def _manifest(self, body: bool):
        self.seen.append((self.command, self.path, self.headers.get("Accept"), self.headers.get("Authorization")))
        if self.path.startswith("/token?"):
            payload = json.dumps({"token": self.token}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        if self.token and self.headers.get("Authorization") != f"Bearer {self.token}":
            self.send_response(401)
            host = f"http://127.0.0.1:{self.server.server_port}"
            self.send_header("WWW-Authenticate", f'Bearer realm="{host}/token",service="registry.test",'
                                                 f'scope="repository:vllm/vllm-openai:pull"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path != "/v2/vllm/vllm-openai/manifests/v0.33.0":
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.oci.image.index.v1+json")
        if self.send_digest:
            self.send_header("Docker-Content-Digest", INDEX_DIGEST)
        self.send_header("Content-Length", str(len(INDEX)))
        self.end_headers()
        if body:
            self.wfile.write(INDEX)

    def do_HEAD(self):
        self._manifest(False)

    def do_GET(self):
        self._manifest(True)


@pytest.fixture
def registry():
    handler = type("Handler", (Registry,), {"seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield handler, f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def fresh_cache():
    image_mod._cache.clear()
    yield
    image_mod._cache.clear()


def test_reference_grammar_names_the_default_registry_once():
    assert parse_image("vllm/vllm-openai:v0.33.0").repository == "vllm/vllm-openai"
    assert parse_image("ubuntu").repository == "library/ubuntu"
    sim = parse_image("sparkfleet-registry:5000/vllm/vllm-openai:v0.33.0")
    assert (sim.domain, sim.path, sim.tag) == ("sparkfleet-registry:5000", "vllm/vllm-openai", "v0.33.0")
    hub = image_mod.registry_base(parse_image("vllm/vllm-openai:v0.33.0"), None)
    assert hub == f"https://{image_mod.DOCKER_HUB[1]}"
    # RepoDigests list the familiar name: the pin must be written the same way or it would never match
    assert parse_image("docker.io/library/ubuntu:24.04").pinned(INDEX_DIGEST) == f"ubuntu@{INDEX_DIGEST}"
    assert parse_image("docker.io/vllm/vllm-openai:v1").repository == "vllm/vllm-openai"
    assert parse_image("docker.io/ubuntu").repository == "library/ubuntu"
    given = parse_image(f"localhost:5000/a/b:t@{INDEX_DIGEST}")
    assert given.pinned(given.digest) == f"localhost:5000/a/b@{INDEX_DIGEST}"


def test_digest_is_the_registry_header_for_every_manifest_type(registry):
    handler, url = registry
    assert registry_digest("sparkfleet-registry:5000/vllm/vllm-openai:v0.33.0", url) == INDEX_DIGEST
    method, path, accept, _ = handler.seen[0]
    assert (method, path) == ("HEAD", "/v2/vllm/vllm-openai/manifests/v0.33.0")
    for media in ("oci.image.index", "oci.image.manifest", "docker.distribution.manifest.list",
                  "docker.distribution.manifest.v2"):
        assert media in accept


def test_anonymous_bearer_token_flow(registry):
    handler, url = registry
    handler.token = "anon-token-1234"
    assert registry_digest("vllm/vllm-openai:v0.33.0", url) == INDEX_DIGEST
    token_call = [s for s in handler.seen if s[1].startswith("/token?")]
    assert token_call and "service=registry.test" in token_call[0][1] and "scope=repository" in token_call[0][1]
    assert handler.seen[-1][3] == "Bearer anon-token-1234"


def test_no_digest_header_hashes_the_manifest_body(registry):
    handler, url = registry
    handler.send_digest = False
    assert registry_digest("vllm/vllm-openai:v0.33.0", url) == INDEX_DIGEST


def test_unknown_tag_is_one_line_naming_image_and_fix(registry):
    _, url = registry
    with pytest.raises(ImageError) as exc:
        registry_digest("vllm/vllm-openai:v9.9.9", url)
    text = str(exc.value)
    assert "\n" not in text and "vllm/vllm-openai:v9.9.9" in text and "HTTP 404" in text and "@sha256:" in text


def test_unreachable_registry_is_one_line():
    with pytest.raises(ImageError) as exc:
        registry_digest("vllm/vllm-openai:v0.33.0", "http://127.0.0.1:9")
    assert "unreachable" in str(exc.value) and "engine_image_archive" in str(exc.value)


def docker_save(path, ref="vllm/vllm-openai:v0.33.0", config=b'{"architecture":"arm64"}', oci=True):
    """A minimal `docker save` tar: manifest.json naming the config, which is what the image id hashes."""
    name = f"blobs/sha256/{hashlib.sha256(config).hexdigest()}" if oci else "0123.json"
    manifest = json.dumps([{"Config": name, "RepoTags": [ref], "Layers": []}]).encode()
    with tarfile.open(path, "w") as tar:
        for member, data in ((name, config), ("manifest.json", manifest)):
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return "sha256:" + hashlib.sha256(config).hexdigest()


@pytest.mark.parametrize("oci", [True, False])
def test_archive_pin_is_the_config_hash(tmp_path, oci):
    expected = docker_save(tmp_path / "vllm.tar", oci=oci)
    assert archive_image_id(str(tmp_path / "vllm.tar"), "vllm/vllm-openai:v0.33.0") == expected


def test_archive_config_is_hashed_not_trusted_by_name(tmp_path):
    """A config file named after one digest but holding other bytes pins the bytes."""
    archive = tmp_path / "vllm.tar"
    config = b'{"architecture":"evil"}'
    lying = "blobs/sha256/" + "a" * 64
    manifest = json.dumps([{"Config": lying, "RepoTags": ["vllm/vllm-openai:v0.33.0"]}]).encode()
    with tarfile.open(archive, "w") as tar:
        for member, data in ((lying, config), ("manifest.json", manifest)):
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert archive_image_id(str(archive), "vllm/vllm-openai:v0.33.0") == "sha256:" + hashlib.sha256(config).hexdigest()


def test_unreadable_archive_is_one_line(tmp_path):
    (tmp_path / "vllm.tar").write_bytes(b"not a tar")
    with pytest.raises(ImageError) as exc:
        archive_image_id(str(tmp_path / "vllm.tar"), "vllm/vllm-openai:v0.33.0")
    assert "\n" not in str(exc.value) and "docker save" in str(exc.value)


def resolver_at(url):
    def resolve(s):
        return image_mod.image_resolver(s.model_copy(update={"controller_registry_url": url}))
    return resolve


def model(settings):
    """A resolver answering a one-file manifest: plans with a release id."""
    from sparkfleet.model.manifest import Manifest, ManifestFile
    return Manifest("modelscope", settings.model_repo, "master", "f" * 40,
                    (ManifestFile("config.json", 4000, blob_sha1="c" * 40),)), None, None


def test_plan_pins_the_unit_and_the_release_id_covers_the_digest(registry):
    handler, url = registry
    before = plan_hosts([("spark-1", host_data())], resolve=model, resolve_image=resolver_at(url))[0]
    assert before.image_pin.ref == f"vllm/vllm-openai@{INDEX_DIGEST}"
    unit = before.render_unit()
    assert f"vllm/vllm-openai@{INDEX_DIGEST}" in unit and "vllm/vllm-openai:v0.33.0" not in unit
    d = before.to_dict()
    assert d["image_pinned"] == f"vllm/vllm-openai@{INDEX_DIGEST}" and d["image_unknown"] is None
    assert d["image_source"] == "registry"

    moved = "sha256:" + "d" * 64  # the same tag, other bytes
    other = plan_hosts([("spark-1", host_data())], resolve=model,
                       resolve_image=lambda s: (image_mod.ImagePin(f"vllm/vllm-openai@{moved}", moved, "registry"),
                                                None))[0]
    assert before.release_id and other.chat_release_id != before.chat_release_id
    assert other.release_id != before.release_id


def test_registry_asked_once_per_image_per_run(registry):
    handler, url = registry
    plan_hosts([("spark-1", host_data()), ("spark-2", host_data())], resolve_image=resolver_at(url))
    assert len([s for s in handler.seen if s[0] == "HEAD"]) == 1


def test_offline_plan_says_the_digest_is_unknown():
    plan = plan_hosts([("spark-1", host_data())])[0]
    assert plan.image_pin is None and "digest unknown (offline plan)" in plan.image_error
    assert plan.to_dict()["image_unknown"] == plan.image_error and plan.to_dict()["image_pinned"] is None


def test_pinned_reference_needs_no_registry():
    ref = f"vllm/vllm-openai:v0.33.0@{INDEX_DIGEST}"
    plan = plan_hosts([("spark-1", host_data(engine_image=ref))])[0]
    assert plan.image_pin.ref == f"vllm/vllm-openai@{INDEX_DIGEST}" and plan.image_error is None


def test_archive_pin_runs_the_image_id(tmp_path):
    expected = docker_save(tmp_path / "vllm.tar")
    s = plan_hosts([("spark-1", host_data(engine_image_archive=str(tmp_path / "vllm.tar")))],
                   resolve_image=image_mod.image_resolver)[0]
    assert s.image_pin == image_mod.ImagePin(expected, expected, "archive")
    assert f" {expected}" in s.render_unit()


def test_deploy_refuses_a_plan_whose_digest_is_unknown(monkeypatch):
    from sparkfleet.controller import inventory
    from sparkfleet.controller.inventory import DeployRefused, plan_for

    class State:
        inventory = []

    plan = plan_hosts([("spark-1", host_data())])[0]
    monkeypatch.setattr(inventory, "plan_hosts", lambda hosts, **resolvers: [plan])
    plan.manifest = object()  # the model resolved; only the image is unknown
    plan.services = []

    class Host:
        name = "spark-1"

    with pytest.raises(DeployRefused) as exc:
        plan_for(State, Host)
    assert "digest unknown" in str(exc.value) and "engine_image_archive" in str(exc.value)
