"""The toolkit on a host: a shipped toolkit kept when new enough, the CDI spec kept current for the
driver, the GPU checked in a container started like the engine, and the unit's GPU options per mode."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest
from pyinfra_testing.operations import make_operation_tests

from sparkfleet import TEMPLATES_DIR
from sparkfleet.host.toolkit import (
    CDI_FEATURE_MERGE,
    DebVersionAtLeast,
    cdi_stale,
    docker_cdi_support,
    installed_toolkit,
)
from sparkfleet.release.plan import plan_hosts
from sparkfleet.contract.settings import SettingsError, parse_settings

from .helpers import host_data

CASES = Path(__file__).parent / "operations"

TestToolkitAtLeast = make_operation_tests("sparkfleet.host", "toolkit.toolkit_at_least", CASES / "toolkit_at_least")
TestCdiSpecCurrent = make_operation_tests("sparkfleet.host", "toolkit.cdi_spec_current", CASES / "cdi_spec_current")
TestDockerTakesCdiDevices = make_operation_tests("sparkfleet.host", "toolkit.docker_takes_cdi_devices",
                                                 CASES / "docker_takes_cdi_devices")
TestContainerSeesGpu = make_operation_tests("sparkfleet.host", "toolkit.container_sees_gpu",
                                            CASES / "container_sees_gpu")

FOUR = ("nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
        "libnvidia-container1")


def test_installed_toolkit_is_all_four_packages_at_one_version():
    assert installed_toolkit({name: ["1.18.2-1"] for name in FOUR}) == "1.18.2-1"
    assert installed_toolkit({**{name: ["1.18.2-1"] for name in FOUR}, "libnvidia-container1": ["1.17.8-1"]}) is None
    assert installed_toolkit({name: ["1.18.2-1"] for name in FOUR[:3]}) is None
    assert installed_toolkit({}) is None


def test_dpkg_decides_the_version_order():
    fact = DebVersionAtLeast()
    assert fact.command(version="1.18.2-1", minimum="1:1.17.8~rc1") == (
        "dpkg --compare-versions 1.18.2-1 ge '1:1.17.8~rc1' && echo yes || echo no")
    assert fact.process(["yes"]) is True and fact.process(["no"]) is False


def test_cdi_spec_is_stale_when_never_made_or_made_for_another_driver():
    assert cdi_stale(None, "580.95.05") is True
    assert cdi_stale([], "580.95.05") is True
    assert cdi_stale(["580.95.05"], "580.105.08") is True
    assert cdi_stale(["580.95.05"], None) is True  # driver unknown: regenerating is cheap, a stale spec is not
    assert cdi_stale(["580.95.05 "], "580.95.05") is False


def plan(**overrides):
    [one] = plan_hosts([("spark-a", host_data(**overrides))], resolve=False)
    return one


def test_gpu_device_mode_picks_the_unit_gpu_options():
    runtime, cdi = plan().render_unit(), plan(gpu_device_mode="cdi").render_unit()
    assert "--gpus all" in runtime and "nvidia.com/gpu" not in runtime
    assert "--device nvidia.com/gpu=all" in cdi and "--gpus" not in cdi
    assert plan().docker_options[:2] == ["--gpus", "all"]


def test_gpu_device_mode_and_toolkit_settings_are_validated():
    assert parse_settings("spark-a", host_data()).gpu_device_mode == "runtime"
    try:
        parse_settings("spark-a", host_data(gpu_device_mode="legacy"))
    except SettingsError as exc:
        assert "spark-a" in str(exc) and "gpu_device_mode" in str(exc)
    else:
        raise AssertionError("gpu_device_mode 'legacy' accepted")
    kept = parse_settings("spark-a", host_data(toolkit_version=None, min_toolkit_version="1.18.0-1"))
    assert (kept.toolkit_version, kept.min_toolkit_version) == (None, "1.18.0-1")
    try:
        parse_settings("spark-a", host_data(min_toolkit_version="1.18; reboot"))
    except SettingsError as exc:
        assert "min_toolkit_version" in str(exc)
    else:
        raise AssertionError("a shell fragment accepted as min_toolkit_version")


def test_cdi_unit_runs_after_the_driver_and_before_the_engine():
    text = jinja2.Template((TEMPLATES_DIR / "sparkfleet-cdi.service.j2").read_text()).render(
        unit="sparkfleet-vllm.service", generate="/usr/bin/nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml",
        stamp="/var/lib/sparkfleet/cdi-driver")
    assert "After=systemd-modules-load.service nvidia-persistenced.service\n" in text
    assert "Before=docker.service sparkfleet-vllm.service\n" in text
    assert "ExecStart=/usr/bin/nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml\n" in text
    assert "> \"$$1\"' stamp /var/lib/sparkfleet/cdi-driver\n" in text
    assert "WantedBy=multi-user.target" in text


@pytest.mark.parametrize("version, support", [
    ((20, 10), "none"), ((24, 0), "none"), ((25, 0), "feature"), ((27, 5), "feature"), ((28, 1), "feature"),
    ((28, 2), "default"), ((29, 0), "default"),
])
def test_docker_takes_cdi_devices_from_25_and_by_default_from_28_2(version, support):
    assert docker_cdi_support(version) == support


def merge(path: Path) -> subprocess.CompletedProcess:
    """The merge, run exactly as the host runs it (python3 -c SCRIPT daemon.json), on a local file."""
    return subprocess.run([sys.executable, "-c", CDI_FEATURE_MERGE, str(path)], capture_output=True, text=True)


def test_cdi_feature_merge_keeps_every_user_key_and_feature_and_the_mode(tmp_path):
    daemon = tmp_path / "daemon.json"
    daemon.write_text('{"log-driver": "json-file", "insecure-registries": ["registry.lan:5000"], '
                      '"features": {"containerd-snapshotter": true},\n'
                      '"runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}}')
    os.chmod(daemon, 0o600)
    assert merge(daemon).returncode == 0
    assert json.loads(daemon.read_text()) == {
        "log-driver": "json-file", "insecure-registries": ["registry.lan:5000"],
        "features": {"containerd-snapshotter": True, "cdi": True},
        "runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}}
    assert oct(daemon.stat().st_mode & 0o777) == "0o600"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["daemon.json"]


def test_cdi_feature_merge_writes_a_missing_file_and_leaves_one_with_cdi_on_alone(tmp_path):
    daemon = tmp_path / "daemon.json"
    assert merge(daemon).returncode == 0
    assert daemon.read_text() == '{\n    "features": {\n        "cdi": true\n    }\n}\n'
    daemon.write_text('{"features":{"cdi":true}}')
    before = daemon.stat().st_mtime_ns
    assert merge(daemon).returncode == 0
    assert daemon.read_text() == '{"features":{"cdi":true}}' and daemon.stat().st_mtime_ns == before


@pytest.mark.parametrize("text, problem", [
    ("{ not json", "not valid JSON (Expecting property name enclosed in double quotes: line 1 column 3 (char 2))"),
    ("", "not valid JSON (Expecting value: line 1 column 1 (char 0))"),
    ('["features"]', "not a JSON object with an object features"),
    ('{"features": "cdi"}', "not a JSON object with an object features"),
])
def test_cdi_feature_merge_refuses_a_file_it_cannot_read_and_leaves_it_untouched(tmp_path, text, problem):
    daemon = tmp_path / "daemon.json"
    daemon.write_text(text)
    done = merge(daemon)
    assert done.returncode == 1
    assert done.stderr == f"{daemon}: {problem}: fix it by hand; sparkfleet will not overwrite it\n"
    assert daemon.read_text() == text and sorted(p.name for p in tmp_path.iterdir()) == ["daemon.json"]
