"""A converged Spark's services (the `services` setting: RAG models, other chat models): each unit, port, verified
model and answer.
A host without services has nothing of theirs to check: each check of its services skips, saying so; only the check
that no service left over from an older setting remains runs (and fails where one does)."""

import json
import shlex

import pytest

from sparkfleet.contract import paths
from sparkfleet.contract.shared import verify
from sparkfleet.host.services import wake_command


def test_no_unit_of_a_dropped_service_is_left(spark):
    installed = spark.host.check_output("ls /etc/systemd/system | grep '^sparkfleet-vllm-' || true").split()
    assert sorted(installed) == sorted(svc.unit for svc in spark.plan.services)


def services_of(spark) -> list:
    """The host's planned services, or a skip: a check with nothing to check does not pass."""
    if not spark.plan.services:
        pytest.skip(f"{spark.plan.name} runs no service (its `services` setting is empty): nothing to check")
    return spark.plan.services


def test_each_service_unit_is_the_plans_and_runs(spark):
    """An always-on service's unit runs, enabled; an on-demand one's socket listens, enabled, beside its proxy."""
    for svc in services_of(spark):
        assert spark.host.file(f"/etc/systemd/system/{svc.unit}").content_string == spark.plan.render_service_unit(svc)
        if svc.on_demand:
            for unit, text in ((svc.socket, spark.plan.render_on_demand_socket(svc)),
                               (svc.proxy, spark.plan.render_on_demand_proxy(svc))):
                assert spark.host.file(f"/etc/systemd/system/{unit}").content_string == text, unit
            socket = spark.host.service(svc.socket)
            assert socket.is_enabled and socket.is_running, svc.socket
            continue
        service = spark.host.service(svc.unit)
        assert service.is_enabled and service.is_running, svc.unit


def wake(spark, svc) -> None:
    """An on-demand service asked through its socket until it answers, as its first request would start it (it idles
    out again after its idle time)."""
    if svc.on_demand:
        spark.host.check_output(wake_command(svc.service.api_port, spark.s.health_timeout_s).get_raw_value())


def test_each_service_listens_on_its_own_port(spark):
    for svc in services_of(spark):
        wake(spark, svc)
        assert spark.host.socket(f"tcp://{spark.s.api_host}:{svc.service.api_port}").is_listening, svc.name
        engine_port = paths.engine_port(svc.service.api_port)
        assert spark.host.socket(f"tcp://{paths.ENGINE_HOST}:{engine_port}").is_listening, svc.name
        assert not spark.host.socket(f"tcp://0.0.0.0:{engine_port}").is_listening, svc.name


def test_each_service_model_has_the_manifest_hashes(spark):
    for svc in services_of(spark):
        seen = json.loads(spark.host.check_output(
            f"python3 {paths.HOST_MODULE} {shlex.quote(svc.model_dir)}"))
        assert verify.files_needing_work(svc.manifest.entries, seen["record"], seen["files"]) == [], svc.name
        assert verify.extras(svc.manifest.entries, seen["files"], seen["others"]) == [], svc.name


def test_each_service_answers_its_request(spark):
    """The health gate's own check on the host: a chat, embeddings through the openai client, or /v1/rerank."""
    services = services_of(spark)
    runtime = spark.host.check_output(paths.NEWEST_RUNTIME_COMMAND)
    for svc in services:
        wake(spark, svc)
        out = spark.host.check_output(
            f"PYTHONPATH={runtime} python3 {paths.BIN_DIR}/sparkfleet-health --serving {paths.SERVING_FILE} --port {paths.engine_port(svc.service.api_port)} "
            f"--served-name {shlex.quote(svc.service.served_model_name)} --kind {svc.kind} --timeout 30 "
            f"--env-file {paths.ENGINE_ENV} --container {svc.container}")
        report = json.loads(out.splitlines()[-1])
        assert report["models"] == [svc.service.served_model_name]
        answered = {"embedding": report.get("embedding_dims"), "reranker": len(report.get("rerank", [])) == 2,
                    "chat": (report.get("usage") or {}).get("completion_tokens")}
        assert answered[svc.kind], (svc.kind, report)
