"""Every custom operation against fake facts (pyinfra-testing's runner), and the
model operation in Python: converged facts must produce no commands."""

from pathlib import Path

from pyinfra.context import ctx_host, ctx_state
from pyinfra_testing.operations import make_operation_tests
from pyinfra_testing.util import FakeState, create_host

from sparkfleet.host.model_files import model_verified
from sparkfleet.model.manifest import Manifest, ManifestFile

CASES = Path(__file__).parent / "operations"

TestDockerNvidiaRuntime = make_operation_tests("sparkfleet.host", "operations.docker_nvidia_runtime",
                                               CASES / "docker_nvidia_runtime")
TestAptKeyring = make_operation_tests("sparkfleet.host", "operations.apt_keyring", CASES / "apt_keyring")
TestRuntimeBundle = make_operation_tests("sparkfleet.host", "model_files.runtime_bundle", CASES / "runtime_bundle")
TestOldModelsRemoved = make_operation_tests("sparkfleet.host", "operations.old_models_removed",
                                           CASES / "old_models_removed")
TestImageLoaded = make_operation_tests("sparkfleet.host", "operations.image_loaded", CASES / "image_loaded")
TestHealthGate = make_operation_tests("sparkfleet.host", "operations.health_gate", CASES / "health_gate")

MANIFEST = Manifest("huggingface", "Qwen/Qwen3.5-35B-A3B-FP8", "main", "a" * 40, (
    ManifestFile("config.json", 120, blob_sha1="1" * 40),
    ManifestFile("model-00001-of-00002.safetensors", 4096, sha256="2" * 64),
    ManifestFile("model-00002-of-00002.safetensors", 4096, sha256="3" * 64),
))
MODEL_DIR = "/var/lib/sparkfleet/models/Qwen--Qwen3.5-35B-A3B-FP8@aaaaaaaaaaaaaaaa"
STATS = {
    "config.json": {"size": 120, "mtime_ns": 1_700_000_000_000_000_000, "ino": 11},
    "model-00001-of-00002.safetensors": {"size": 4096, "mtime_ns": 1_700_000_000_100_000_000, "ino": 12},
    "model-00002-of-00002.safetensors": {"size": 4096, "mtime_ns": 1_700_000_000_200_000_000, "ino": 13},
}
HASHES = {"config.json": "1" * 40, "model-00001-of-00002.safetensors": "2" * 64,
          "model-00002-of-00002.safetensors": "3" * 64}


def run_model_op(record, files, full_verify=False):
    facts = {"facts.ModelFiles": {f"model_dir={MODEL_DIR}, record=.sparkfleet-verified.json":
                                  {"record": record, "files": files}},
             "files.File": {f"path=/var/lib/sparkfleet/manifests/{MODEL_DIR.rsplit('/', 1)[1]}.json": None},
             "files.Directory": {f"path=/var/lib/sparkfleet/manifests/{MODEL_DIR.rsplit('/', 1)[1]}.json": None,
                                 "path=/var/lib/sparkfleet/manifests": {"mode": 755}}}
    host = create_host(FakeState(), facts=facts)
    with ctx_state.use(host.state), ctx_host.use(host):
        commands = [str(getattr(c, "get_raw_value", lambda: c)()) for c in
                    model_verified._inner(MANIFEST, MODEL_DIR, "http://hub:8080", "/opt/sparkfleet/runtime/r1",
                                          full_verify=full_verify)]
    return commands, host.noop_description


def converged_record():
    return {path: {**STATS[path], "hash": HASHES[path]} for path in STATS}


def test_verified_model_needs_no_commands_and_no_reads():
    commands, noop = run_model_op(converged_record(), STATS)
    assert commands == [] and noop == f"3 model files verified in {MODEL_DIR}"


def test_touched_file_is_rehashed():
    files = {**STATS, "model-00002-of-00002.safetensors": {**STATS["model-00002-of-00002.safetensors"],
                                                           "mtime_ns": 1}}
    commands, _ = run_model_op(converged_record(), files)
    assert any("sparkfleet-fetch" in c for c in commands)


def test_missing_file_is_fetched():
    files = {k: v for k, v in STATS.items() if k != "config.json"}
    commands, _ = run_model_op(converged_record(), files)
    assert commands[0] == "mkdir -p /var/lib/sparkfleet/manifests"
    assert commands[-1].startswith("PYTHONPATH=/opt/sparkfleet/runtime/r1 python3 /opt/sparkfleet/bin/sparkfleet-fetch")


def test_full_verify_rehashes_a_converged_model():
    commands, _ = run_model_op(converged_record(), STATS, full_verify=True)
    assert commands[-1].endswith("--full-verify")


def test_missing_image_is_loaded_from_the_archive(tmp_path):
    archive = tmp_path / "vllm.tar"
    archive.write_bytes(b"docker save output")
    facts = {"facts.DockerImagePresent": {"image=vllm/vllm-openai:v0.33.0": False},
             "files.File": {"path=/var/lib/sparkfleet/vllm.tar": None},
             "files.Directory": {"path=/var/lib/sparkfleet/vllm.tar": None, "path=/var/lib/sparkfleet": {"mode": 755}}}
    host = create_host(FakeState(), facts=facts)
    from sparkfleet.host.operations import image_loaded

    with ctx_state.use(host.state), ctx_host.use(host):
        commands = [c.get_raw_value() if hasattr(c, "get_raw_value") else repr(c) for c in
                    image_loaded._inner("vllm/vllm-openai:v0.33.0", str(archive))]
    assert commands[0] == f"FileUploadCommand({archive}, /var/lib/sparkfleet/vllm.tar)"
    assert commands[-1] == "docker load -i /var/lib/sparkfleet/vllm.tar && rm -f /var/lib/sparkfleet/vllm.tar"
