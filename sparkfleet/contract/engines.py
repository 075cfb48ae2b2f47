"""What hosts, controller and monitoring agree on about each engine: its name and the metric names it exports.

How an engine is started (image, flags, key) is the release's business (sparkfleet/release/engines/); this
module holds only what the watchdog, `status`, `bench`, the alert rules and the status page read back from
a running engine, so each of them asks here instead of naming `vllm:` series itself.
"""

from __future__ import annotations

from dataclasses import dataclass

ENGINES = ("vllm", "sglang", "llamacpp")
DEFAULT_ENGINE = "vllm"


@dataclass(frozen=True)
class EngineMetrics:
    """The /metrics series of one engine that sparkfleet reads, by what they mean (None: the engine has none)."""

    running: str  # requests being decoded now (gauge)
    waiting: str  # requests queued (gauge)
    kv_usage: str | None  # KV cache in use, 0..1 (gauge)
    prompt_tokens: str | None  # prompt tokens processed (counter)
    generation_tokens: str | None  # tokens generated (counter)


METRICS = {
    # vllm/v1/metrics/loggers.py (0.33): gauges and counters labelled model_name
    "vllm": EngineMetrics(running="vllm:num_requests_running", waiting="vllm:num_requests_waiting",
                          kv_usage="vllm:kv_cache_usage_perc", prompt_tokens="vllm:prompt_tokens_total",
                          generation_tokens="vllm:generation_tokens_total"),
    # sglang/srt/metrics/collector.py: SchedulerMetricsCollector and TokenizerMetricsCollector (--enable-metrics)
    "sglang": EngineMetrics(running="sglang:num_running_reqs", waiting="sglang:num_queue_reqs",
                            kv_usage="sglang:token_usage", prompt_tokens="sglang:prompt_tokens_total",
                            generation_tokens="sglang:generation_tokens_total"),
    # llama.cpp tools/server (server-context.cpp), /metrics with --metrics (which the key guards too). Its
    # llamacpp:kv_cache_usage_ratio (and kv_cache_tokens) went with the KV cache API rework of 2025: builds
    # of that age and later (b10488 reported without it) export no KV gauge, so sparkfleet reads none.
    "llamacpp": EngineMetrics(running="llamacpp:requests_processing", waiting="llamacpp:requests_deferred",
                              kv_usage=None,
                              prompt_tokens="llamacpp:prompt_tokens_total",
                              generation_tokens="llamacpp:tokens_predicted_total"),
}


# vLLM's older name of its KV gauge: the alerts read it beside the current one
LEGACY_KV_USAGE = ("vllm:gpu_cache_usage_perc",)


def every(field: str) -> tuple[str, ...]:
    """One meaning's series of every engine that exports it (EngineMetrics field name), in ENGINES order: what
    an alert or a panel reads to cover a fleet of mixed engines."""
    return tuple(name for name in (getattr(METRICS[e], field) for e in ENGINES) if name)


def metrics(engine: str) -> EngineMetrics:
    """The metric names of `engine` (one of ENGINES)."""
    return METRICS[engine]
