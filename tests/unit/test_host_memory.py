"""A Spark's memory: the plan fits models in the host's `host_memory_gb` (128, or 64 for a 64 GB DGX Spark), and
preflight refuses a host whose MemTotal is clearly below what the plan assumed, naming the setting and its value."""

from __future__ import annotations

import pytest

from sparkfleet.contract.settings import SettingsError, parse_settings
from sparkfleet.host.nvidia_smi import GpuReport
from sparkfleet.host.facts import JsonObject
from sparkfleet.host.preflight import HostFacts, memory_floor, preflight_problems
from sparkfleet.release.plan import plan_hosts

from .helpers import host_data

GIB = 1024**3
SPARK_128_KB = 125_518_336  # MemTotal of a 128 GB Spark: about 119.7 GiB (128.5 GB)
SPARK_64_KB = 62_759_168  # half of it: a 64 GB Spark


def facts(mem_total_kb: int) -> HostFacts:
    return HostFacts(arch="aarch64", gpu=GpuReport("NVIDIA GB10", "580.95.05", "13.0"),
                     meminfo={"MemTotal": mem_total_kb}, free_bytes=500 * GIB, needed_bytes=37 * GIB,
                     docker={"installed": True, "active": True}, python="3.12",
                     model_files={"record": {}, "files": {}}, release=JsonObject("/etc/sparkfleet/release.json"))


def problems(mem_total_kb: int, **data) -> list[str]:
    return preflight_problems("spark-9", parse_settings("spark-9", host_data(**data)), facts(mem_total_kb))


def test_a_64_gb_spark_left_at_the_128_gb_default_is_refused_with_the_setting_to_write():
    assert problems(SPARK_64_KB) == [
        "spark-9: memory (MemTotal): found 59.9 GiB, required >= 107.3 GiB (90% of host_memory_gb = 128, the memory "
        "the plan fits the models in): set host_memory_gb = 64 for this host (a 64 GB DGX Spark: 64) and plan "
        "again, or use a host with more memory"]


@pytest.mark.parametrize("mem_total_kb, data", [(SPARK_64_KB, {"host_memory_gb": 64}), (SPARK_128_KB, {}),
                                                (SPARK_128_KB, {"host_memory_gb": 64})])
def test_a_spark_planned_as_the_one_it_is_passes(mem_total_kb, data):
    """A 128 GB Spark planned as a 64 GB one is not refused: the plan then assumes less than there is."""
    assert problems(mem_total_kb, **data) == []


def test_the_floor_follows_the_planned_memory_unless_the_office_sets_its_own():
    assert memory_floor(parse_settings("a", host_data(host_memory_gb=64))) == (64e9 * 0.9 / GIB, "host_memory_gb")
    assert memory_floor(parse_settings("a", host_data(min_memory_gib=4))) == (4, "min_memory_gib")


@pytest.mark.parametrize("value", [0, 0.5, 1025, "64GB", -64])
def test_host_memory_gb_is_typed_and_bounded(value):
    with pytest.raises(SettingsError, match="host_memory_gb"):
        parse_settings("a", host_data(host_memory_gb=value))


def test_the_plan_fits_a_64_gb_spark_in_its_own_memory():
    """Half the memory, half the budget; a model whose weights pass it is refused naming the size and the setting."""
    small, large = (plan_hosts([("a", host_data(host_memory_gb=gb))])[0].fit for gb in (64, 128))
    assert small and large and small.budget_bytes * 2 == large.budget_bytes == int(128e9 * 0.88)
    with pytest.raises(SettingsError) as refused:
        plan_hosts([("a", host_data(recipe="gpt-oss-120b", host_memory_gb=64))])
    assert refused.value.problems == [
        "a: the model does not fit one Spark of 64 GB (host_memory_gb) at gpu_memory_utilization=0.88 (weights "
        "60.8 GiB, budget 52.5 GiB per Spark, max_model_len=131072): needs 2 Sparks: set tensor_parallel_hosts with "
        "2 hosts and tensor_parallel_size = 2"]
