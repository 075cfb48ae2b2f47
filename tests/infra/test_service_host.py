"""A service host (only in the groups front_door and/or monitoring) is what it is: its roles, and nothing of a
Spark's: no engine, no guard, no Docker, no GPU tooling, no model."""

from __future__ import annotations

from sparkfleet.contract import paths


def test_runs_no_engine_and_no_guard(service_host):
    for unit, path in ((paths.UNIT_NAME, paths.UNIT_PATH), (paths.RAY_UNIT_NAME, paths.RAY_UNIT_PATH),
                       (paths.GUARD_UNIT_NAME, paths.GUARD_UNIT_PATH)):
        assert service_host.host.run(f"systemctl is-active {unit}").stdout.strip() != "active", unit
        assert not service_host.host.file(path).exists, path


def test_has_no_docker_no_gpu_tooling_and_no_model(service_host):
    for command in ("docker", "nvidia-smi", "nvidia-ctk"):
        assert service_host.host.run(f"command -v {command}").rc != 0, command
    assert not service_host.host.file(paths.RELEASE_FILE).exists
    assert not service_host.host.file(service_host.s.model_root).exists


def test_debian_haproxy_is_off(service_host):
    """Only sparkfleet's own HAProxy units run (the front door's)."""
    service = service_host.host.service("haproxy.service")
    assert not service.is_running and not service.is_enabled
