"""Will the model fit, how much context and how many sequences, how fast can it decode.

Pure functions of a model's config.json and a few numbers; no host is asked.

Memory follows vLLM's own budget (as of 0.33.0):

    budget    = host memory x gpu_memory_utilization
    KV memory = budget - weights - activation/CUDA-graph reserve

and a sequence of T tokens costs ``T x KV bytes per token`` (full-attention
layers only) plus, for hybrid models, one linear-attention state (Gated
DeltaNet: a fixed size whatever T is). vLLM refuses to start when one sequence
of max_model_len does not fit, and names the largest length that would;
:func:`check_fit` says the same before any host is touched.

Speed is a decode roofline: generating one token reads every active weight
once, the KV cache of the context and the linear state; a Spark's unified
memory moves about 273 GB/s, so ``tokens/s <= bandwidth / bytes per token``.
It is an upper bound: measured decode is lower (kernels, launches, sampling).

With speculative decoding (vLLM's "mtp" method) the draft's KV cache and
linear states are counted too (see :func:`fit_report`).

With tensor parallelism over N Sparks (one GPU each, vLLM over Ray) every
figure is per GPU: each member holds weights / N, the KV heads are split
over the N GPUs (see :func:`kv_bytes_per_token`), and each member has its
own budget; a model that fits no single Spark is refused with the number of
Sparks that it needs (:func:`sparks_needed_problem`, :func:`check_fit`).

Public API: :func:`fit_report` -> :class:`FitReport`, :func:`check_fit`,
:func:`linear_state_bytes`, :func:`kv_bytes_per_token`, :func:`param_counts`,
:func:`draft_weight_bytes`. What a sequence costs (KV per token, linear
state) is computed in model/kv.py, the parameter counts in model/params.py;
their public names are importable from here as before.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from sparkfleet.model.config import mtp_layers
from sparkfleet.model.kv import (
    draft_kv_bytes_per_token,
    kv_bytes_per_token,
    layer_counts,
    linear_state_bytes,
    require,
    text_config,
)
from sparkfleet.model.params import ParamCounts, draft_weight_bytes, param_counts, weight_bytes_per_param

__all__ = [
    "ACTIVATION_RESERVE_BYTES",
    "CUDA_GRAPH_RESERVE_BYTES",
    "REFERENCE_DECODE_TOKENS_PER_S",
    "RESERVE_BYTES",
    "SPARK_BANDWIDTH_BYTES_PER_S",
    "SPARK_MEMORY_BYTES",
    "SUGGESTION_GRANULARITY",
    "FitReport",
    "ParamCounts",
    "check_fit",
    "draft_weight_bytes",
    "fit_report",
    "kv_bytes_per_token",
    "linear_state_bytes",
    "param_counts",
    "sparks_needed_problem",
]

GIB = 1024**3

# A DGX Spark has 128 GB of LPDDR5x shared by CPU and GPU: 128e9 bytes =
# 119.2 GiB. vLLM sizes its budget from the CUDA device's total memory, which
# on GB10's unified memory follows the kernel's MemTotal (about 119.7 GiB is
# the figure quoted for DGX OS, ~0.4 % more; not checked on a host here).
# 128e9 is that within half a percent and on the safe side. It is the default of fit_report alone: the plan passes
# each host's own `host_memory_gb` (contract/formats.py host_memory_bytes; 64 for a 64 GB DGX Spark), which
# preflight holds against the host's MemTotal (host/preflight.py memory_problem).
SPARK_MEMORY_BYTES = 128 * 10**9

# GB10 LPDDR5x bandwidth, from NVIDIA's published DGX Spark specification.
SPARK_BANDWIDTH_BYTES_PER_S = 273e9

# What vLLM keeps out of the KV cache besides the weights. vLLM measures it at
# start-up (a profiling forward pass of max_num_batched_tokens, the sampler's
# dummy batch, non-torch allocations such as cuBLAS/NCCL workspaces, then
# CUDA graph capture); we cannot run that here, so it is an estimate:
# - activations: the peak of one chunked-prefill step plus the sampler's
#   logits (max_num_seqs x vocab x 4 bytes, ~0.24 GiB at 256 x 248,320) and
#   workspaces: 2 GiB is a round, generous figure for a 2048-hidden MoE;
# - CUDA graphs: vLLM's start-up log ("Graph capturing finished ... took
#   N GiB") typically reads 0.5-1.5 GiB for models of this size: 1 GiB.
# Not measured on a Spark: refine it from a real start-up log's "Available KV
# cache memory" line when one is at hand.
ACTIVATION_RESERVE_BYTES = 2 * GIB
CUDA_GRAPH_RESERVE_BYTES = 1 * GIB
RESERVE_BYTES = ACTIVATION_RESERVE_BYTES + CUDA_GRAPH_RESERVE_BYTES

# Measured in the reference write-up for the default release
# (Qwen3.5-35B-A3B-FP8 on vLLM in Docker on one Spark): single stream,
# thinking off. (43 t/s with thinking, 31 t/s for the BF16 checkpoint.)
REFERENCE_DECODE_TOKENS_PER_S = 50.3

# check_fit suggests a max_model_len rounded DOWN to a multiple of this, so
# the suggestion is a round number that still fits.
SUGGESTION_GRANULARITY = 1024

# The most Sparks a plan considers for one model (the stacked-Sparks playbooks stop well below).
MAX_SPARKS = 8

# The short context the report counts concurrent sequences at.
SHORT_CONTEXT_TOKENS = 8192


@dataclass(frozen=True)
class FitReport:
    """Memory and speed of one model on one host at one setting. Bytes are bytes (not GiB)."""

    # Inputs.
    memory_bytes: int
    gpu_memory_utilization: float
    max_model_len: int
    kv_cache_dtype: str
    max_num_seqs: int | None
    bandwidth_bytes_per_s: float
    context: int
    # Model.
    max_position_embeddings: int
    full_attention_layers: int
    linear_attention_layers: int
    total_params: int
    active_params: int
    # Memory.
    budget_bytes: int  # memory x utilization
    weights_bytes: int  # the manifest's weight files' total (Manifest.weight_bytes: .gguf, else .safetensors)
    estimated_weights_bytes: int  # from the parameter count: a cross-check of weights_bytes
    reserve_bytes: int  # activations + CUDA graphs (RESERVE_BYTES)
    kv_memory_bytes: int  # budget - weights - reserve; negative when the weights do not fit
    kv_bytes_per_token: int  # the target model's full-attention layers
    linear_state_bytes: int  # one sequence's linear-attention states: x linear_state_copies x (1 + draft tokens)
    largest_context: int  # longest ONE sequence that fits, capped at max_position_embeddings
    fits: bool  # one sequence of max_model_len fits (and max_model_len <= max_position_embeddings)
    seqs_at_max_model_len: int  # sequences of max_model_len tokens that fit (memory only)
    seqs_at_8192: int  # sequences of 8192 tokens that fit (memory only)
    # Decode roofline (one stream).
    active_weight_bytes_per_token: int
    decode_bytes_per_token_at_0: int
    decode_bytes_per_token_at_context: int
    decode_tokens_per_s_at_0: float
    decode_tokens_per_s_at_context: float
    # Speculative decoding with the checkpoint's MTP layers (all 0 without it).
    num_speculative_tokens: int = 0
    draft_layers: int = 0
    draft_weights_bytes: int = 0  # the MTP layers' weights: inside weights_bytes (the same safetensors)
    draft_kv_bytes_per_token: int = 0  # the MTP layers' attention KV, beside the target's
    # Tensor parallelism: the figures above are per GPU (one Spark each) when this is > 1.
    tensor_parallel_size: int = 1
    weights_per_gpu_bytes: int = 0  # weights_bytes / tensor_parallel_size: what each member loads
    sparks_needed: int | None = 1  # the fewest Sparks (up to MAX_SPARKS) on which max_model_len fits; None: none

    @property
    def kv_bytes_per_token_total(self) -> int:
        """What one more token of context costs: the target's KV and the draft layers' KV."""
        return self.kv_bytes_per_token + self.draft_kv_bytes_per_token

    @property
    def draft_memory_bytes(self) -> int:
        """The draft's share of memory at max_model_len: its weights and one sequence's draft KV."""
        return self.draft_weights_bytes + self.max_model_len * self.draft_kv_bytes_per_token

    def concurrency(self, seqs: int) -> int:
        """Sequences vLLM will run at once: what fits, capped by max_num_seqs when set."""
        return seqs if self.max_num_seqs is None else min(seqs, self.max_num_seqs)

    def decode_tokens_per_s(self, context: int) -> float:
        """The single-stream decode roofline with `context` tokens already in the KV cache."""
        return self.bandwidth_bytes_per_s / (self.decode_bytes_per_token_at_0 + context * self.kv_bytes_per_token)

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "kv_bytes_per_token_total": self.kv_bytes_per_token_total,
                "draft_memory_bytes": self.draft_memory_bytes}


def _seqs(kv_memory: int, tokens: int, kv_per_token: int, state: int) -> int:
    per_seq = tokens * kv_per_token + state
    return max(0, kv_memory // per_seq) if per_seq else 0


def _largest_uncapped(kv_memory: int, kv_per_token: int, state: int) -> int:
    return max(0, (kv_memory - state) // kv_per_token)


def fit_report(
    config: dict,
    weights_bytes: int,
    *,
    memory_bytes: int = SPARK_MEMORY_BYTES,
    gpu_memory_utilization: float = 0.88,
    max_model_len: int | None = None,
    kv_cache_dtype: str = "auto",
    max_num_seqs: int | None = None,
    bandwidth: float = SPARK_BANDWIDTH_BYTES_PER_S,
    context: int = SHORT_CONTEXT_TOKENS,
    reserve_bytes: int = RESERVE_BYTES,
    linear_state_copies: int = 1,
    num_speculative_tokens: int = 0,
    tensor_parallel_size: int = 1,
) -> FitReport:
    """Plan the fit of `config` with `weights_bytes` of weights on one host.

    `max_model_len` defaults to the model's max_position_embeddings.
    `linear_state_copies`: linear-attention states held per sequence; 1 is
    the floor, prefix caching keeps more (the reference: "doubled or more").
    The roofline reads one copy whatever this is.

    `num_speculative_tokens` > 0: vLLM's "mtp" speculative decoding with the
    checkpoint's own MTP layers. What the draft costs:
    - its weights (:func:`draft_weight_bytes`) are mtp.* tensors of the same
      safetensors, so `weights_bytes` (the files' total) already counts them;
      without speculative decoding vLLM skips them, and the plain plan is
      conservative by that much;
    - each MTP layer is a full-attention layer with its own KV cache: per
      token 2 x KV heads x head_dim x dtype bytes each (2,048 for Qwen3.5);
    - vLLM keeps one linear-attention state per draft position besides the
      running one (MambaSpec.num_speculative_blocks), so a sequence's linear
      state is (1 + num_speculative_tokens) times larger.
    The roofline stays the plain one: a step of the target that accepts k
    drafts emits k + 1 tokens, so measured decode may exceed it.

    `tensor_parallel_size` N > 1: N Sparks, one GPU each, and every memory
    figure is one member's: the budget is each member's own, the weights are
    weights_bytes / N, the KV cache per token counts the KV heads one GPU keeps
    (:func:`kv_bytes_per_token`) and the linear-attention heads split N ways.
    The roofline reads one member's share of the active weights at one
    member's bandwidth; the all-reduces over the fabric are not counted, so it
    is a looser upper bound than on one Spark.
    """
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], not {gpu_memory_utilization}")
    text = text_config(config)
    max_pos = int(require(text, "max_position_embeddings"))
    max_model_len = int(max_model_len or max_pos)
    full, linear = layer_counts(text)
    draft_layers = mtp_layers(config) if num_speculative_tokens else 0
    if num_speculative_tokens and not draft_layers:
        raise ValueError("config.json has no MTP layer (mtp_num_hidden_layers): cannot plan MTP speculative decoding")
    budget = int(memory_bytes * gpu_memory_utilization)

    def per_gpu(n: int) -> tuple[int, int, int, int, int]:
        """(weights, KV memory, target KV per token, draft KV per token, linear state) of one GPU of n."""
        kv_token = kv_bytes_per_token(config, kv_cache_dtype, n)
        draft = draft_kv_bytes_per_token(config, draft_layers, kv_cache_dtype, n)
        state = linear_state_bytes(config) * linear_state_copies * (1 + num_speculative_tokens) // n
        weights = -(-int(weights_bytes) // n)
        return weights, budget - weights - reserve_bytes, kv_token, draft, state

    def fits(n: int) -> bool:
        _, kv_memory_n, kv_token, draft, state = per_gpu(n)
        return max_model_len <= max_pos and _largest_uncapped(kv_memory_n, kv_token + draft, state) >= max_model_len

    heads = int(require(text, "num_attention_heads"))
    needed = next((n for n in range(1, MAX_SPARKS + 1) if heads % n == 0 and fits(n)), None)
    weights_gpu, kv_memory, kv_per_token, draft_kv, state = per_gpu(tensor_parallel_size)
    state_one = linear_state_bytes(config) // tensor_parallel_size
    kv_all = kv_per_token + draft_kv
    params = param_counts(config)
    narrow_bytes, wide_bytes = weight_bytes_per_param(config, weights_bytes, params)
    largest = _largest_uncapped(kv_memory, kv_all, state)

    active_weight_bytes = int(params.active_narrow * narrow_bytes + params.active_wide * wide_bytes)
    at_0 = -(-active_weight_bytes // tensor_parallel_size) + state_one
    at_ctx = at_0 + context * kv_per_token
    return FitReport(
        memory_bytes=int(memory_bytes),
        gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=max_model_len,
        kv_cache_dtype=kv_cache_dtype,
        max_num_seqs=max_num_seqs,
        bandwidth_bytes_per_s=bandwidth,
        context=context,
        max_position_embeddings=max_pos,
        full_attention_layers=full,
        linear_attention_layers=linear,
        total_params=params.total,
        active_params=params.active,
        budget_bytes=budget,
        weights_bytes=int(weights_bytes),
        estimated_weights_bytes=int(params.total_narrow * narrow_bytes + params.total_wide * wide_bytes),
        reserve_bytes=reserve_bytes,
        kv_memory_bytes=kv_memory,
        kv_bytes_per_token=kv_per_token,
        linear_state_bytes=state,
        largest_context=min(largest, max_pos),
        fits=largest >= max_model_len <= max_pos,
        seqs_at_max_model_len=_seqs(kv_memory, max_model_len, kv_all, state),
        seqs_at_8192=_seqs(kv_memory, SHORT_CONTEXT_TOKENS, kv_all, state),
        active_weight_bytes_per_token=active_weight_bytes,
        decode_bytes_per_token_at_0=at_0,
        decode_bytes_per_token_at_context=at_ctx,
        decode_tokens_per_s_at_0=bandwidth / at_0,
        decode_tokens_per_s_at_context=bandwidth / at_ctx,
        num_speculative_tokens=num_speculative_tokens,
        draft_layers=draft_layers,
        draft_weights_bytes=draft_weight_bytes(config) if draft_layers else 0,
        draft_kv_bytes_per_token=draft_kv,
        tensor_parallel_size=tensor_parallel_size,
        weights_per_gpu_bytes=weights_gpu,
        sparks_needed=needed,
    )


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def sparks_needed_problem(report: FitReport) -> str | None:
    """Why one Spark (or this group) is too small for the model, with the fewest Sparks that it needs, or None.

    A single host is refused when no max_model_len of SUGGESTION_GRANULARITY or more fits it (shrinking the
    context would not do) but the full one fits on more Sparks; a group when it has fewer than that.
    """
    n, needed = report.tensor_parallel_size, report.sparks_needed
    if report.fits or not needed or needed <= n:
        return None
    if n == 1 and _largest_uncapped(report.kv_memory_bytes, report.kv_bytes_per_token_total,
                                    report.linear_state_bytes) >= SUGGESTION_GRANULARITY:
        return None
    what = (f"weights {_gib(report.weights_bytes)}" + (f" ({_gib(report.weights_per_gpu_bytes)} per GPU on {n})"
                                                       if n > 1 else ""))
    size = "" if report.memory_bytes == SPARK_MEMORY_BYTES else f" of {report.memory_bytes / 1e9:g} GB (host_memory_gb)"
    return (f"the model does not fit {'one Spark' if n == 1 else f'{n} Sparks'}{size} at gpu_memory_utilization="
            f"{report.gpu_memory_utilization:g} ({what}, budget {_gib(report.budget_bytes)} per Spark, "
            f"max_model_len={report.max_model_len}): needs {needed} "
            f"Sparks: set tensor_parallel_hosts with {needed} hosts and tensor_parallel_size = {needed}")


def fixed_kv_share(weights_bytes: int, reserve_bytes: int, kv_bytes: int, memory_bytes: int) -> float:
    """The gpu_memory_utilization of an engine with a fixed KV cache (vLLM's --kv-cache-memory-bytes): its weights,
    its reserve and that cache, rounded up to 1/10,000 of the host (12.8 MB of a Spark), so the memory plan and
    vLLM's own start check ask for what it will hold, not a share picked by hand."""
    return math.ceil((weights_bytes + reserve_bytes + kv_bytes) / memory_bytes * 10_000) / 10_000


def check_fit(report: FitReport) -> str | None:
    """None when one sequence of the report's max_model_len fits in memory; otherwise why not and what would.

    The suggested length is the largest that fits, rounded DOWN to a multiple
    of SUGGESTION_GRANULARITY (1024), and never above max_position_embeddings.
    "KV cache per sequence" includes the sequence's linear-attention state.
    The model's own limit (max_position_embeddings) is the planner's check
    (`release_problems`), not this one. A model that only more Sparks can hold
    is refused with how many (:func:`sparks_needed_problem`); with tensor
    parallelism every figure is one member's.
    """
    more = sparks_needed_problem(report)
    if more:
        return more
    n = report.tensor_parallel_size
    max_model_len = report.max_model_len
    need = max_model_len * report.kv_bytes_per_token_total + report.linear_state_bytes
    if need <= report.kv_memory_bytes:
        return None
    left = max(0, report.kv_memory_bytes)
    largest = _largest_uncapped(report.kv_memory_bytes, report.kv_bytes_per_token_total, report.linear_state_bytes)
    suggest = min(largest, report.max_position_embeddings) // SUGGESTION_GRANULARITY * SUGGESTION_GRANULARITY
    per_gpu = f" per GPU of {n}" if n > 1 else ""
    weights = report.weights_per_gpu_bytes if n > 1 else report.weights_bytes
    after = (
        f"after weights ({_gib(weights)}{per_gpu}) and the activation/CUDA-graph reserve "
        f"({_gib(report.reserve_bytes)})"
    )
    if suggest < SUGGESTION_GRANULARITY:
        return (
            f"max_model_len={max_model_len} needs {_gib(need)} of KV cache per sequence{per_gpu} but only "
            f"{_gib(left)} of the {_gib(report.budget_bytes)} budget is left {after}: no max_model_len of "
            f"{SUGGESTION_GRANULARITY} or more fits (raise gpu_memory_utilization or serve a smaller model)"
        )
    return (
        f"max_model_len={max_model_len} needs {_gib(need)} of KV cache per sequence{per_gpu} but only "
        f"{_gib(left)} is left {after}: set max_model_len <= {suggest} (or raise gpu_memory_utilization)"
    )
