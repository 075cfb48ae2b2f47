"""A converged Spark: what a CI job asserts against a real (or simulated) fleet."""

import json
import shlex

from sparkfleet.contract import paths
from sparkfleet.host.nvidia_smi import at_least, parse_nvidia_smi
from sparkfleet.contract.shared import verify

from .conftest import container_sees_the_gpu


def test_driver_and_cuda_meet_the_minimums(spark):
    gpu = parse_nvidia_smi(spark.host.check_output("nvidia-smi"))
    assert gpu.name == spark.s.expected_gpu_name
    assert at_least(gpu.driver, spark.s.min_driver_version), gpu.driver
    assert at_least(gpu.cuda, spark.s.min_cuda_version), gpu.cuda


def test_toolkit_packages_at_the_pinned_version(spark):
    """Pinned: exactly that version; toolkit_version None: at least min_toolkit_version (dpkg's ordering)."""
    for name in paths.TOOLKIT_PACKAGES:
        package = spark.host.package(name)
        assert package.is_installed, name
        if spark.s.toolkit_version:
            assert package.version == spark.s.toolkit_version, (name, package.version)
        else:
            assert spark.host.run(f"dpkg --compare-versions {shlex.quote(package.version)} ge "
                                  f"{shlex.quote(spark.s.min_toolkit_version)}").rc == 0, (name, package.version)


def test_docker_has_the_nvidia_runtime(spark):
    daemon = json.loads(spark.host.file(paths.DAEMON_JSON).content_string)
    assert daemon["runtimes"]["nvidia"]["path"] == "nvidia-container-runtime"


def test_every_model_file_has_the_manifest_hash(spark, full_verify):
    """The record vouches for every manifest file (the host module's own check), and nothing else is there."""
    model_dir = spark.plan.model_dir
    seen = json.loads(spark.host.check_output(f"python3 {paths.HOST_MODULE} {shlex.quote(model_dir)}"))
    entries = spark.plan.manifest.entries
    assert verify.files_needing_work(entries, seen["record"], seen["files"]) == []
    assert verify.extras(entries, seen["files"], seen["others"]) == []
    for entry in spark.plan.manifest.files:
        f = spark.host.file(f"{model_dir}/{entry.path}")
        assert f.exists and f.size == entry.size, entry.path
        if full_verify:
            if entry.sha256:
                assert f.sha256sum == entry.sha256, entry.path
            else:
                blob = spark.host.check_output(
                    f"(printf 'blob %s\\0' {entry.size}; cat '{model_dir}/{entry.path}') | sha1sum")
                assert blob.split()[0] == entry.blob_sha1, entry.path


def test_unit_on_disk_is_the_plans(engine):
    assert engine.host.file(paths.UNIT_PATH).content_string == engine.plan.render_unit()


def test_secrets_file_is_root_only(spark):
    env = spark.host.file(paths.ENGINE_ENV)
    assert env.user == "root" and env.mode == 0o600


def test_service_enabled_and_active(engine):
    service = engine.host.service(paths.UNIT_NAME)
    assert service.is_enabled and service.is_running


def test_engine_container_sees_the_gpu(engine):
    """The GPU where vLLM runs, not just on the host (a daemon-reload or a stale CDI spec loses it there)."""
    container_sees_the_gpu(engine, engine.s.container_name)


def test_port_listening(engine):
    """The guard on the API port; the engine on loopback only, behind it."""
    assert engine.host.socket(f"tcp://{engine.s.api_host}:{engine.s.api_port}").is_listening
    engine_port = paths.engine_port(engine.s.api_port)
    assert engine.host.socket(f"tcp://{paths.ENGINE_HOST}:{engine_port}").is_listening
    assert not engine.host.socket(f"tcp://0.0.0.0:{engine_port}").is_listening


def test_models_and_chat_answer(engine):
    """The health gate's own checks, run on the host with the official openai client."""
    runtime = engine.host.check_output(paths.NEWEST_RUNTIME_COMMAND)
    out = engine.host.check_output(
        f"PYTHONPATH={runtime} python3 {paths.BIN_DIR}/sparkfleet-health --serving {paths.SERVING_FILE} --port {paths.engine_port(engine.s.api_port)} "
        f"--served-name '{engine.s.served_model_name}' --timeout 30 --env-file {paths.ENGINE_ENV} "
        f"--container {engine.s.container_name}")
    report = json.loads(out.splitlines()[-1])
    assert engine.s.served_model_name in report["models"]
    assert report["chat"] and report["usage"]["completion_tokens"] > 0
