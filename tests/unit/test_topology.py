"""Topology advice: one tensor-parallel pair or two replicas, from the roofline and the published measurements."""

from __future__ import annotations

import pytest

from sparkfleet.commands import plan as plan_command
from sparkfleet.contract.recipes import recipe
from sparkfleet.model.fit import fit_report
from sparkfleet.model.topology import EVIDENCE, PAIR, REPLICAS, advise, is_sparse
from sparkfleet.release.plan import plan_hosts

from .helpers import host_data


def reports(name: str, max_model_len: int = 32768):
    r = recipe(name)
    return tuple(fit_report(r.model.config, r.model.weight_bytes, max_model_len=max_model_len,
                            tensor_parallel_size=n) for n in (1, 2))


MOE = "qwen3.5-35b-a3b-fp8"  # 3B of 35B active
DENSE = "qwen3-8b-gguf"  # every weight read per token


def test_sparse_and_dense_are_told_by_the_active_share():
    assert is_sparse(reports(MOE)[0]) and not is_sparse(reports(DENSE)[0])


@pytest.mark.parametrize("users,choice", [(1, PAIR), (16, PAIR), (32, PAIR), (33, REPLICAS), (64, REPLICAS),
                                          (200, REPLICAS)])
def test_a_sparse_moe_splits_up_to_32_users_and_replicates_beyond(users, choice):
    advice = advise(*reports(MOE), users)
    assert advice.choice == choice and advice.sparse
    assert any("kubis.ai" in s for s in advice.sources)
    nearest = min((1, 2, 4, 8, 16, 32, 64), key=lambda n: (abs(n - users), n))
    assert f"{nearest} users: pair" in advice.reasons[2]


@pytest.mark.parametrize("users", [1, 8, 64])
def test_a_dense_model_is_served_by_two_replicas(users):
    advice = advise(*reports(DENSE, 8192), users)
    assert advice.choice == REPLICAS and not advice.sparse
    assert "half" in advice.reasons[0] and any("al-engr.com" in s for s in advice.sources)


def test_only_vllm_forms_a_pair():
    advice = advise(*reports(MOE), 4, engine="sglang")
    assert advice.choice == REPLICAS and advice.reasons[0].startswith("engine sglang")


def test_the_roofline_figures_come_from_the_planner():
    one, pair = reports(MOE)
    advice = advise(one, pair, 8)
    assert advice.roofline["one_spark_tokens_per_s"] == round(one.decode_tokens_per_s_at_0, 1)
    assert advice.roofline["pair_tokens_per_s"] > advice.roofline["one_spark_tokens_per_s"]  # the bound, no fabric
    assert advice.roofline["replicas_seqs_at_8192"] == 2 * one.seqs_at_8192
    assert "upper bound" in advice.reasons[1]
    assert advice.to_dict()["choice"] == PAIR


def test_more_users_than_the_kv_cache_holds_are_named():
    one, pair = reports(MOE)
    advice = advise(one, pair, 10 * one.seqs_at_8192)
    assert "expect queueing, or add Sparks" in advice.reasons[-1]


def test_a_model_that_needs_the_pair_gets_no_advice():
    one, pair = reports("qwen3-235b-a22b-gptq-int4", 40960)
    assert advise(one, pair, 8) is None


def test_the_evidence_is_the_published_figures():
    moe, dense = EVIDENCE
    assert (moe.pair[1], moe.other[1], moe.pair[32], moe.other[32], moe.pair[64], moe.other[64]) == \
        (69.0, 57.7, 471.7, 382.1, 471.8, 567.9)
    assert all(dense.pair[n] < dense.other[n] / 1.8 for n in dense.pair)  # about half, or worse


# ---- plan shows it ------------------------------------------------------------------------------------

def two_hosts(**extra):
    return [(name, host_data(ssh_hostname=f"10.0.0.{i}", **extra)) for i, name in ((1, "spark-1"), (2, "spark-2"))]


def test_plan_advises_two_hosts_serving_the_same_model(capsys):
    plans = plan_hosts(two_hosts(expected_concurrency=64), resolve=False)
    [advice] = plan_command.topology(plans)
    assert advice["hosts"] == ["spark-1", "spark-2"] and advice["choice"] == REPLICAS
    assert advice["model_repo"] == "Qwen/Qwen3.5-35B-A3B-FP8"


def test_plan_advises_a_tensor_parallel_pair():
    pair = ["spark-1", "spark-2"]
    hosts = [(name, host_data(ssh_hostname=f"10.0.0.{i}", tensor_parallel_hosts=pair, tensor_parallel_size=2,
                              fabric_address=f"192.168.100.{i}", expected_concurrency=8))
             for i, name in ((1, "spark-1"), (2, "spark-2"))]
    found = plan_command.topology(plan_hosts(hosts, resolve=False))
    assert [a["hosts"] for a in found] == [pair] and found[0]["choice"] == PAIR


def test_no_expected_concurrency_no_advice():
    assert plan_command.topology(plan_hosts(two_hosts(), resolve=False)) == []
