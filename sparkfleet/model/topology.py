"""Two Sparks and a model that fits one: a tensor-parallel pair, or two replicas behind the front door?

The roofline (model/fit.py) says what splitting buys at best: each member reads half the active weights, so a
single stream could decode up to twice as fast, and the pair holds one KV pool where two replicas hold two. It
counts no all-reduce over the fabric, and that is what the published measurements show costs:

- gpt-oss-120b (a sparse MoE, 5.1B of 117B active), vLLM over two Sparks: the pair beat two replicas behind a
  router at every load up to 32 users and lost at 64 (EVIDENCE[0]);
- a dense 27B (Qwen3.6-27B-FP8), SGLang over two Sparks: the pair ran at about half one Spark's speed at 1 to 8
  users (EVIDENCE[1]): the synchronisation per layer outweighs the halved weight reads.

So the advice follows the measurements, the roofline shows the bounds and the memory, and every line names its
source. Pure functions of fit reports and a few settings: no host is asked.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkfleet.contract import engines
from sparkfleet.model.fit import FitReport

__all__ = ["EVIDENCE", "PAIR", "REPLICAS", "Evidence", "TopologyAdvice", "advise", "is_sparse"]

PAIR = "tensor-parallel pair"
REPLICAS = "two replicas"
# A model whose active parameters are at most this share of its total is a sparse MoE (gpt-oss-120b: 4 %,
# Qwen3.5-35B-A3B: 9 %); above it the model reads most of its weights per token, as a dense one does.
SPARSE_ACTIVE_SHARE = 0.5


@dataclass(frozen=True)
class Evidence:
    """One published two-Spark measurement: aggregate decode tokens/s by concurrent users."""

    model: str
    sparse: bool
    pair: dict[int, float]  # users -> tokens/s of the tensor-parallel pair
    other: dict[int, float]  # users -> tokens/s of the alternative (`other_is`)
    other_is: str
    source: str


EVIDENCE = (
    Evidence(model="gpt-oss-120b (MoE, MXFP4), vLLM", sparse=True,
             pair={1: 69.0, 2: 104.1, 4: 155.3, 8: 231.0, 16: 342.1, 32: 471.7, 64: 471.8},
             other={1: 57.7, 2: 99.4, 4: 127.9, 8: 177.5, 16: 268.6, 32: 382.1, 64: 567.9},
             other_is="two replicas behind a router (simple-shuffle)",
             source="kubis.ai, GPT-OSS-120B: Topology Benchmark on DGX Spark (2026-03-22, llama-benchy pp1024 tg128)"),
    Evidence(model="Qwen3.6-27B-FP8 (dense), SGLang 0.5.12", sparse=False,
             pair={1: 8.1, 4: 25.5, 8: 40.9}, other={1: 22.6, 4: 54.3, 8: 95.3},
             other_is="one Spark (with NEXTN speculative decoding; ~18-19 tokens/s at 1 user without)",
             source="al-engr.com, Two DGX Spark units with tensor parallelism: Qwen3.6 TP=2 benchmark (tg128)"),
)


@dataclass(frozen=True)
class TopologyAdvice:
    choice: str  # PAIR or REPLICAS
    expected_concurrency: int
    sparse: bool
    reasons: list[str]
    roofline: dict  # the planner's bounds for one Spark and for the pair
    sources: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"choice": self.choice, "expected_concurrency": self.expected_concurrency, "sparse": self.sparse,
                "reasons": list(self.reasons), "roofline": dict(self.roofline), "sources": list(self.sources)}


def is_sparse(report: FitReport) -> bool:
    """A sparse MoE reads a small share of its weights per token (see SPARSE_ACTIVE_SHARE)."""
    return report.total_params > 0 and report.active_params / report.total_params <= SPARSE_ACTIVE_SHARE


def _nearest(points: dict[int, float], users: int) -> int:
    return min(points, key=lambda n: (abs(n - users), n))


def _measured_line(e: Evidence, users: int) -> str:
    n = _nearest(e.pair, users)
    pair, other = e.pair[n], e.other[n]
    verdict = "the pair won" if pair > other else "the pair lost"
    return (f"measured, {e.model}, {n} users: pair {pair:g} vs {e.other_is} {other:g} tokens/s "
            f"({verdict}, {pair / other - 1:+.0%})")


def advise(one: FitReport, pair: FitReport, expected_concurrency: int,
           engine: str = engines.DEFAULT_ENGINE) -> TopologyAdvice | None:
    """Which of a pair or two replicas serves `expected_concurrency` users better; None when the model does not
    fit one Spark (the pair is then needed, not chosen).

    `one` is the model's fit on one Spark, `pair` on two (tensor_parallel_size 2).
    """
    if not one.fits or (one.sparks_needed or 0) > 1:
        return None
    users = expected_concurrency
    sparse = is_sparse(one)
    evidence = EVIDENCE[0] if sparse else EVIDENCE[1]
    roofline = {
        "one_spark_tokens_per_s": round(one.decode_tokens_per_s_at_0, 1),
        "pair_tokens_per_s": round(pair.decode_tokens_per_s_at_0, 1),
        "one_spark_seqs_at_8192": one.seqs_at_8192,
        "pair_seqs_at_8192": pair.seqs_at_8192,
        "replicas_seqs_at_8192": 2 * one.seqs_at_8192,
    }
    reasons = [f"roofline (no fabric all-reduce counted, an upper bound): one stream <= "
               f"{roofline['one_spark_tokens_per_s']:g} tokens/s on one Spark, <= {roofline['pair_tokens_per_s']:g} "
               f"on the pair; KV room for {roofline['replicas_seqs_at_8192']} sequences of 8K on two replicas, "
               f"{roofline['pair_seqs_at_8192']} on the pair", _measured_line(evidence, users)]
    if not engines.descriptor(engine).tensor_parallel:
        choice = REPLICAS
        able = " or ".join(d.label for d in engines.able("tensor_parallel"))
        reasons.insert(0, f"engine {engine}: sparkfleet's tensor-parallel groups are {able} over Ray, so two "
                          f"{engine} replicas are the choice")
    elif not sparse:
        choice = REPLICAS
        reasons.insert(0, "a dense model reads most of its weights per token: split over two Sparks it ran at about "
                          "half one Spark's speed, so two replicas serve more")
    elif users <= 32:
        choice = PAIR
        reasons.insert(0, f"a sparse MoE at {users} users: the measured pair beat two replicas up to 32 users")
    else:
        choice = REPLICAS
        reasons.insert(0, f"a sparse MoE at {users} users: the measured pair stopped scaling after 32 users and two "
                          f"replicas won at 64 (the crossover lies between)")
    room = roofline["pair_seqs_at_8192" if choice == PAIR else "replicas_seqs_at_8192"]
    if users > room:
        reasons.append(f"{users} users at 8K of context each need more KV cache than the {choice} holds ({room}): "
                       f"expect queueing, or add Sparks")
    return TopologyAdvice(choice=choice, expected_concurrency=users, sparse=sparse, reasons=reasons,
                          roofline=roofline, sources=[evidence.source, "sparkfleet/model/fit.py (roofline)"])
