"""Preflight decisions from host facts: one line per problem, each naming what was found, what is
required and the fix."""

import pytest

from sparkfleet.host.facts import JsonObject, Unreadable, json_object
from sparkfleet.host.nvidia_smi import GpuReport, parse_nvidia_smi
from sparkfleet.host.preflight import HostFacts, preflight_problems
from sparkfleet.contract.settings import SettingsError, parse_settings

from .helpers import host_data

GIB = 1024**3
SPARK = dict(arch="aarch64", gpu=GpuReport("NVIDIA GB10", "580.95.05", "13.0"),
             meminfo={"MemTotal": 128 * 1024**2 * 0.95, "MemAvailable": 120 * 1024**2}, free_bytes=500 * GIB,
             needed_bytes=37 * GIB, docker={"installed": True, "active": True}, python="3.12",
             model_files={"record": {}, "files": {}}, release=JsonObject("/etc/sparkfleet/release.json"))


def problems(data=None, in_group=False, **facts):
    return preflight_problems("spark-a", parse_settings("spark-a", host_data(**(data or {}))),
                              HostFacts(**{**SPARK, **facts}), in_group)


def test_a_refused_kernel_or_driver_is_one_line_naming_the_version_why_and_the_fix():
    assert problems(kernel="6.17.0-1008-nvidia") == [
        "spark-a: kernel 6.17.0-1008-nvidia is refused (refused_kernels '6.17.0-1008*'): kernel panics reported on "
        "NVIDIA's DGX Spark forum: move the host to another kernel (and reboot), or take '6.17.0-1008*' out of "
        "refused_kernels once checked"]
    found = problems({"refused_drivers": {"580.9?.*": "decode 30 % slower"}}, kernel="6.17.0-1032-nvidia")
    assert found == ["spark-a: NVIDIA driver 580.95.05 is refused (refused_drivers '580.9?.*'): decode 30 % slower: "
                     "move the host to another NVIDIA driver (and reboot), or take '580.9?.*' out of refused_drivers "
                     "once checked"]
    assert problems({"refused_drivers": {"580.95": "an exact version"}}) == []  # a glob matches the whole version
    assert problems({"refused_kernels": {}}, kernel="6.17.0-1008-nvidia") == []  # an office took it out


def test_the_pair_kernels_are_refused_on_a_group_member_only():
    assert problems(kernel="7.0.0-1019-nvidia") == []  # NCCL over RoCE is a pair's problem
    assert problems(in_group=True, kernel="7.0.0-1019-nvidia") == [
        "spark-a: kernel 7.0.0-1019-nvidia is refused (refused_pair_kernels '7.0.0-1019*'): NCCL over RoCE between "
        "two Sparks broken (eugr/spark-vllm-docker #392): move the host to another kernel (and "
        "reboot), or take '7.0.0-1019*' out of refused_pair_kernels once checked"]
    assert problems(in_group=True, kernel=None) == []  # not read (an old host): no guess


def test_a_refused_version_setting_takes_globs_only():
    for bad in ({"6.17; reboot": "x"}, {"*": "two\nlines"}):
        with pytest.raises((SettingsError, ValueError)):
            parse_settings("spark-a", host_data(refused_kernels=bad))


def test_a_spark_passes():
    assert problems() == []


def test_an_office_floor_of_its_own_replaces_the_planned_memory():
    """min_memory_gib, where set, is the floor (the simulator's hosts share one machine's memory)."""
    assert problems({"min_memory_gib": 100}, meminfo={"MemTotal": 16 * 1024**2}) == [
        "spark-a: memory (MemTotal): found 16.0 GiB, required >= 100 GiB: use a host with more memory, "
        "or lower min_memory_gib"]
    assert problems({"min_memory_gib": 4}, meminfo={"MemTotal": 16 * 1024**2}) == []


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
        "spark-a: memory (MemTotal): found 16.0 GiB, required >= 107.3 GiB (90% of host_memory_gb = 128, the memory "
        "the plan fits the models in): set host_memory_gb = 17 for this host (a 64 GB DGX Spark: 64) and plan "
        "again, or use a host with more memory",
        "spark-a: free disk at /var/lib/sparkfleet/models: found 10.0 GiB, required 37.0 GiB for the model files "
        "still to fetch: free space there (old models under model_root), or set model_root to a larger disk",
        "spark-a: Docker: found docker.service not active, required running: systemctl enable --now docker",
        "spark-a: python3: found not installed, required python3 >= 3.10: apt-get install python3 (DGX OS ships it)",
    ]


def test_a_small_model_on_a_nearly_full_disk_is_said_in_mib():
    """The sim's 8 MB model on a 12 MiB disk that holds the running release: '0.0 GiB' would say nothing."""
    [line] = problems(free_bytes=4_177_920, needed_bytes=8_386_675)
    assert line == ("spark-a: free disk at /var/lib/sparkfleet/models: found 4.0 MiB, required 8.0 MiB for the model "
                    "files still to fetch: free space there (old models under model_root), or set model_root to a "
                    "larger disk")


def test_no_driver_says_so_once():
    [line] = problems(gpu=GpuReport(None, None, None, error="nvidia-smi printed no driver line (NVIDIA-SMI has failed)"))
    assert line == ("spark-a: GPU driver: found nvidia-smi printed no driver line (NVIDIA-SMI has failed), "
                    "required driver >= 580.95.05: install the NVIDIA driver (DGX OS ships it) and reboot")


def test_cuda_not_available_is_one_problem_not_a_comparison():
    gb10 = "| NVIDIA-SMI 580.95.05   Driver Version: 580.95.05   CUDA Version: N/A |\n|   0  NVIDIA GB10   On |"
    [line] = problems(gpu=parse_nvidia_smi(gb10))
    assert line.startswith("spark-a: GPU driver: found nvidia-smi reads CUDA Version: N/A, not a version, required")


def test_verified_files_need_no_disk():
    assert problems(free_bytes=1 * GIB, needed_bytes=0) == []


def test_unreadable_host_output_stops_the_host_before_any_comparison():
    found = problems(meminfo=Unreadable("/proc/meminfo", "no MemTotal line"),
                     free_bytes=Unreadable("df /var/lib/sparkfleet/models", "free bytes read '-', not a number"),
                     release=json_object("/etc/sparkfleet/release.json", "{ truncated"))
    assert found == [
        "spark-a: /proc/meminfo: no MemTotal line: fix or remove it by hand; sparkfleet changes nothing on doubt",
        "spark-a: df /var/lib/sparkfleet/models: free bytes read '-', not a number: fix or remove it by hand; "
        "sparkfleet changes nothing on doubt",
        "spark-a: /etc/sparkfleet/release.json: not valid JSON (Expecting property name enclosed in double quotes: "
        "line 1 column 3 (char 2)): fix or remove it by hand; sparkfleet changes nothing on doubt",
    ]


def test_a_release_record_whose_history_is_not_a_list_stops_the_host():
    [line] = problems(release=json_object("/etc/sparkfleet/release.json", '{"model_history": "/m/a"}'))
    assert line.startswith("spark-a: /etc/sparkfleet/release.json: `model_history` is not a list of directories")


def test_a_release_record_of_an_older_sparkfleet_does_not_stop_a_converge():
    assert problems(release=json_object("/etc/sparkfleet/release.json", '{"release_id": "a", "previous": '
                                        '{"release_id": "z", "model_dir": "/m/z"}, "model_history": ["/m/a"]}')) == []
