"""Preflight decisions from host facts: one line per problem, each naming what was found, what is
required and the fix."""

from sparkfleet.host.nvidia_smi import GpuReport
from sparkfleet.host.preflight import HostFacts, preflight_problems
from sparkfleet.release.settings import parse_settings

from .helpers import host_data

GIB = 1024**3
SPARK = dict(arch="aarch64", gpu=GpuReport("NVIDIA GB10", "580.95.05", "13.0"),
             meminfo={"MemTotal": 128 * 1024**2 * 0.95, "MemAvailable": 120 * 1024**2}, free_bytes=500 * GIB,
             needed_bytes=37 * GIB, docker={"installed": True, "active": True}, python="3.12",
             model_files={"record": {}, "files": {}})


def problems(**facts):
    return preflight_problems("spark-a", parse_settings("spark-a", host_data()), HostFacts(**{**SPARK, **facts}))


def test_a_spark_passes():
    assert problems() == []


def test_each_problem_is_one_line_with_a_fix():
    found = problems(arch="x86_64", gpu=GpuReport("NVIDIA H100", "550.54.14", "12.4"),
                     meminfo={"MemTotal": 16 * 1024**2}, free_bytes=10 * GIB,
                     docker={"installed": True, "active": False}, python=None)
    assert found == [
        "spark-a: CPU architecture: found x86_64, required aarch64: run on a DGX Spark (or set expected_arch for this host)",
        "spark-a: GPU: found NVIDIA H100, required NVIDIA GB10: check the host, or set expected_gpu_name",
        "spark-a: NVIDIA driver: found 550.54.14, required >= 580.95.05: upgrade the driver (apt upgrade on DGX OS) "
        "and reboot",
        "spark-a: CUDA version: found 12.4, required >= 13.0: upgrade the NVIDIA driver",
        "spark-a: memory (MemTotal): found 16.0 GiB, required >= 100 GiB: use a host with more memory, "
        "or lower min_memory_gib",
        "spark-a: free disk at /var/lib/sparkfleet/models: found 10.0 GiB, required 37.0 GiB for the model files "
        "still to fetch: free space there (old models under model_root), or set model_root to a larger disk",
        "spark-a: Docker: found docker.service not active, required running: systemctl enable --now docker",
        "spark-a: python3: found not installed, required python3 >= 3.10: apt-get install python3 (DGX OS ships it)",
    ]


def test_no_driver_says_so_once():
    [line] = problems(gpu=GpuReport(None, None, None, error="NVIDIA-SMI has failed"))
    assert line.startswith("spark-a: GPU driver: found nvidia-smi failing (NVIDIA-SMI has failed)")


def test_verified_files_need_no_disk():
    assert problems(free_bytes=1 * GIB, needed_bytes=0) == []
