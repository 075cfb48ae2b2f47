"""Each recipe says which DGX Spark it fits, the 128 GB one and the 64 GB one: its `[fit]` table is what the
planner computes for the recipe's settings on a host of that `host_memory_gb`, never a hand-written claim.

    .venv/bin/python -m tests.unit.test_recipe_fit   # prints every recipe's [fit] as the planner computes it
"""

from __future__ import annotations

import tomllib

import pytest

from sparkfleet import RECIPES_DIR
from sparkfleet.contract.formats import host_memory_bytes
from sparkfleet.contract.recipes import catalogue
from sparkfleet.contract.settings import SettingsError
from sparkfleet.model.fit import SUGGESTION_GRANULARITY, FitReport, sparks_needed_problem
from sparkfleet.release.plan import plan_hosts
from sparkfleet.release.services import min_share

from .helpers import host_data

SIZES = {"spark_128gb": 128, "spark_64gb": 64}  # the [fit] keys: each DGX Spark's memory, in GB
PAIR = ["spark-1", "spark-2"]


def _hosts(name: str, memory_gb: float, size: int = 1) -> list[tuple[str, dict]]:
    """An offline inventory that runs the recipe at its own settings: a chat recipe as the host's model (on `size`
    Sparks, a tensor-parallel group as docs/two-sparks.md's), a service recipe beside the default chat model."""
    if catalogue()[name].kind != "chat":
        return [("spark-1", host_data(host_memory_gb=memory_gb, services={"svc": {"recipe": name}}))]
    if size == 1:
        return [("spark-1", host_data(recipe=name, host_memory_gb=memory_gb))]
    group = [f"spark-{n}" for n in range(1, size + 1)]
    return [(h, host_data(recipe=name, host_memory_gb=memory_gb, tensor_parallel_hosts=group,
                          tensor_parallel_size=size, fabric_interface="enp1s0f0np0",
                          fabric_address=f"192.168.100.{n}"))
            for n, h in enumerate(group, 1)]


def reviewed_size(name: str) -> int:
    """The Sparks a recipe is reviewed on: the fewest 128 GB ones it plans on (two for Qwen3-235B-A22B)."""
    for size in (1, 2, 4, 8):
        try:
            plan_hosts(_hosts(name, 128, size))
            return size
        except SettingsError:
            continue
    raise AssertionError(f"{name}: plans on no group of 128 GB Sparks")


def _report(name: str, memory_gb: float) -> FitReport:
    """The planner's fit of the recipe on a host of `memory_gb`: planned on the 128 GB Spark every recipe is
    reviewed on, then fitted in the other size by the plan's own fit (HostPlan.fit, a service's fit)."""
    plan = plan_hosts(_hosts(name, 128, reviewed_size(name)))[0]
    if catalogue()[name].kind != "chat":
        return plan.services[0].fit(host_memory_bytes(memory_gb))
    plan.settings = plan.settings.model_copy(update={"host_memory_gb": memory_gb})
    report = plan.fit
    assert report is not None, f"{name}: the recipe carries the facts of an offline fit"
    return report


def computed_fit(name: str, memory_gb: float) -> str:
    """"fits" at the recipe's settings; else what would: a shorter max_model_len, more Sparks, or (a service, a
    share of its host) a larger gpu_memory_utilization."""
    report = _report(name, memory_gb)
    if report.fits:
        return "fits"
    if catalogue()[name].kind != "chat":
        return f"gpu_memory_utilization >= {min_share(report):g}"
    if sparks_needed_problem(report):
        return f"needs {report.sparks_needed} Sparks"
    longest = report.largest_context // SUGGESTION_GRANULARITY * SUGGESTION_GRANULARITY
    return f"max_model_len <= {longest}" if longest else "does not fit"


def _written(name: str) -> dict:
    """The recipe file's own [fit] (not one it `extends`: a variant's fit is its own)."""
    return tomllib.loads((RECIPES_DIR / f"{name}.toml").read_text()).get("fit", {})


@pytest.mark.parametrize("name", sorted(catalogue()))
def test_every_recipe_says_which_spark_it_fits_as_the_planner_computes_it(name):
    assert _written(name) == {key: computed_fit(name, gb) for key, gb in SIZES.items()}, (
        f"recipes/{name}.toml: [fit] is the planner's: python -m tests.unit.test_recipe_fit")


@pytest.mark.parametrize("name", sorted(catalogue()))
def test_what_fits_on_the_64_gb_spark_plans_there_and_what_does_not_is_refused(name):
    """The [fit] line is the plan's answer: a recipe that "fits" plans on a host of host_memory_gb = 64 as is; any
    other is refused there, before any host is touched."""
    hosts = _hosts(name, 64, reviewed_size(name))
    if _written(name).get("spark_64gb") == "fits":
        assert plan_hosts(hosts)
    else:
        with pytest.raises(SettingsError):
            plan_hosts(hosts)


def test_the_64_gb_spark_has_half_the_budget_of_the_128_gb_one():
    small, large = _report("qwen3.5-35b-a3b-fp8", 64), _report("qwen3.5-35b-a3b-fp8", 128)
    assert (small.memory_bytes, large.memory_bytes) == (64 * 10**9, 128 * 10**9)
    assert small.budget_bytes * 2 == large.budget_bytes and small.kv_memory_bytes < large.kv_memory_bytes / 2


if __name__ == "__main__":
    for recipe_name in sorted(catalogue()):
        print(f"{recipe_name}: " + ", ".join(f"{k} = {computed_fit(recipe_name, gb)!r}" for k, gb in SIZES.items()))
