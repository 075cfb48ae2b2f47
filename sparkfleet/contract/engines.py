"""One descriptor per engine: everything the rest of sparkfleet knows about an engine, in one place.

How an engine is started (its arguments, docker options and refusals) is the release's business
(sparkfleet/release/engines/<engine>.py, which take their name, label, version setting and image from here);
what hosts, controller, monitoring and the planner agree on about each engine is here: its name, the setting
that pins its version, the image repositories its project publishes, the API key variable it reads from
engine.env, the /metrics series sparkfleet reads (and whether its key guards them), the counters `bench`
reads, the journal lines of its start that progress shows, and what it can do (tensor parallelism over Sparks,
pooling models for RAG services, GGUF models), the engine_env variables that open its admin surface, the
variable that tells it a group member's own address, whether its KV cache is exactly its context, and whether a
silent listener is a frozen engine. The settings' engine names and refused engine_env variables, the recipes'
checks, the serving file's key variable and watchdog rule (so the host helpers read the right line of
engine.env), the memory plan's shares, a group's fabric environment, `status`, `bench`, progress, the alert
rules, the status page and the Grafana dashboard, the topology advice and the engines' common refusals all derive
from DESCRIPTORS; none of them names an engine or a `vllm:` series itself (tests/unit/test_engine_descriptor.py
holds them to it).

Adding an engine: docs/development.md, "Adding an engine".
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class EngineMetrics:
    """The /metrics series of one engine that sparkfleet reads, by what they mean (None: the engine has none)."""

    running: str  # requests being decoded now (gauge)
    waiting: str  # requests queued (gauge)
    kv_usage: str | None  # KV cache in use, 0..1 (gauge)
    prompt_tokens: str | None  # prompt tokens processed (counter)
    generation_tokens: str | None  # tokens generated (counter)
    model_name_label: bool = False  # its series carry the served model's name as the label `model_name`
    ttft_seconds: str | None = None  # time to first token (histogram: its _bucket series)
    inter_token_seconds: str | None = None  # time between output tokens (histogram: its _bucket series)
    finished: tuple[str, str] | None = None  # requests finished (counter), and the label that says why
    steps: str | None = None  # engine steps, prefill and decode alike (counter), where its token counters move late


@dataclass(frozen=True)
class BenchCounters:
    """The /metrics series `bench` reads before and after a run, each name with and without `_total` (Prometheus
    clients differ); empty where the engine exports none."""

    prefix_hits: tuple[str, ...] = ()  # prefix-cache hits (counter, tokens)
    prefix_queries: tuple[str, ...] = ()  # prefix-cache queries (counter, tokens)
    prefix_gauge: str | None = None  # the engine's own running hit rate (gauge), where it has no counters
    spec_drafts: tuple[str, ...] = ()  # speculative decoding: drafts (counter)
    spec_draft_tokens: tuple[str, ...] = ()  # drafted tokens (counter)
    spec_accepted: tuple[str, ...] = ()  # accepted tokens (counter)
    spec_per_pos: tuple[str, ...] = ()  # accepted tokens per draft position (counter, label `position`)


@dataclass(frozen=True)
class StartPhase:
    """A journal line of the engine's start that progress shows (controller/progress.py)."""

    key: str  # a fixed string the line holds: what the host's grep -F keeps
    label: str
    pattern: str = ""  # a regex the line must match too (its groups n, N: "loading shards 7/14")
    ready: bool = False
    failed: bool = False


@dataclass(frozen=True)
class EngineDescriptor:
    name: str  # the setting `engine`'s value
    label: str  # as messages, tables and the unit's Description name it
    version_setting: str  # the setting that pins its version (its flag table; group_data/all.py its default)
    images: tuple[str, ...]  # the image repositories its project (or NVIDIA) publishes; the first is the default's
    version_tag: str | None  # the tag its first repository gives `version` ("v{version}"); None: no rule checked
    key_var: str | None  # the engine.env variable it reads its API key from; None: it reads none (engine.env
    #                      then carries no key: the host's guard in front demands it)
    metrics: EngineMetrics
    metrics_need_key: bool  # its key guards /metrics too (status then sends it, from engine.env)
    bench: BenchCounters
    start_phases: tuple[StartPhase, ...]  # its journal lines, in the order it prints them
    tensor_parallel: bool  # runs a tensor-parallel group over Sparks (Ray)
    pooling: bool  # runs the RAG services' pooling models (embeddings, rerank)
    model_format: str  # "safetensors" or "gguf": what it serves
    # Its container's listener on the API port that gives no HTTP answer at all is a loaded engine that froze
    # (`docker pause`, a wedged event loop), never one still loading: the watchdog then ends its start at once
    # and counts the silence (files/sparkfleet-watchdog `probe`), whoever saw it answer before. True where the
    # engine listens only once its model is loaded, or answers at once (503) while it loads.
    silent_listener_frozen: bool
    legacy_kv_usage: tuple[str, ...] = field(default=())  # older names of its KV gauge that the alerts read too
    # engine_env variables that open its admin surface, run code or log what users send, each with why: refused
    # whatever the value and whichever engine the host runs (contract/settings.py ADMIN_ENV)
    admin_env: tuple[tuple[str, str], ...] = ()
    # The variable that tells it a tensor-parallel member's own fabric address (release/group.py); None: none
    host_ip_var: str | None = None
    # Its KV cache is exactly its context (max_model_len): a chat service on it whose entry sets no share asks
    # what its weights, that cache and the reserve take, as a fixed KV cache does (release/services.py)
    kv_cache_is_context: bool = False


_VLLM_COUNT = r"\|\s*(\d+)/(\d+)\s*\["  # tqdm's "| 7/14 [": vLLM's bar format and tqdm's default alike


def _counter(name: str) -> tuple[str, str]:
    return f"{name}_total", name


VLLM = EngineDescriptor(
    name="vllm", label="vLLM", version_setting="vllm_version",
    images=("vllm/vllm-openai", "nvcr.io/nvidia/vllm"), version_tag="v{version}",
    key_var="VLLM_API_KEY",  # vllm/entrypoints/openai/api_server.py reads it
    # vllm/v1/metrics/loggers.py (0.33): gauges and counters labelled model_name
    metrics=EngineMetrics(running="vllm:num_requests_running", waiting="vllm:num_requests_waiting",
                          kv_usage="vllm:kv_cache_usage_perc", prompt_tokens="vllm:prompt_tokens_total",
                          generation_tokens="vllm:generation_tokens_total", model_name_label=True,
                          ttft_seconds="vllm:time_to_first_token_seconds",
                          inter_token_seconds="vllm:inter_token_latency_seconds",
                          finished=("vllm:request_success_total", "finished_reason")),
    metrics_need_key=False,  # vLLM's key guards /v1 only
    # vllm/v1/metrics/loggers.py (prefix cache), vllm/v1/spec_decode/metrics.py (registered only when drafting)
    bench=BenchCounters(prefix_hits=_counter("vllm:prefix_cache_hits"),
                        prefix_queries=_counter("vllm:prefix_cache_queries"),
                        spec_drafts=_counter("vllm:spec_decode_num_drafts"),
                        spec_draft_tokens=_counter("vllm:spec_decode_num_draft_tokens"),
                        spec_accepted=_counter("vllm:spec_decode_num_accepted_tokens"),
                        spec_per_pos=_counter("vllm:spec_decode_num_accepted_tokens_per_pos")),
    # vllm/model_executor/model_loader/weight_utils.py, vllm/v1/worker/gpu_model_runner.py,
    # vllm/entrypoints/openai/api_server.py, uvicorn
    start_phases=(
        StartPhase("vLLM API server version", "starting"),
        StartPhase("Starting to load model", "loading model"),
        StartPhase("Loading safetensors checkpoint shards", "loading shards", _VLLM_COUNT),
        StartPhase("Loading weights took", "weights loaded"),
        StartPhase("Model loading took", "weights loaded"),
        StartPhase("Capturing CUDA graphs", "CUDA graphs", _VLLM_COUNT),
        StartPhase("Graph capturing finished", "CUDA graphs captured"),
        StartPhase("Starting vLLM API server", "API server starting", r"Starting vLLM API server \d+ on "),
        StartPhase("Application startup complete", "ready", ready=True),
        StartPhase("EngineCore failed to start", "failed to start", failed=True),
        StartPhase("Engine core initialization failed", "failed to start", failed=True),
    ),
    tensor_parallel=True, pooling=True, model_format="safetensors",
    silent_listener_frozen=True,  # api_server.py binds early but listens (uvicorn) only once the engine is built
    legacy_kv_usage=("vllm:gpu_cache_usage_perc",),  # vLLM's older name of its KV gauge
    # vllm/envs.py and the routers that read them (vllm/entrypoints/serve/); vLLM parses "1", "true", "True"...
    admin_env=(
        ("VLLM_SERVER_DEV_MODE", "opens vLLM's development endpoints (/collective_rpc runs a method on every "
                                 "worker, /sleep, /wake_up, /reset_prefix_cache, /server_info) to whoever reaches "
                                 "the API"),
        ("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "opens /v1/load_lora_adapter and /v1/unload_lora_adapter: any API "
                                             "caller loads weights from a path or the hub into the running engine"),
        ("VLLM_ALLOW_INSECURE_SERIALIZATION", "lets the engine's processes exchange pickled objects, which run "
                                              "code when read"),
        ("VLLM_DEBUG_LOG_API_SERVER_RESPONSE", "writes every API response body (users' completions) to the "
                                               "journal"),
        ("VLLM_TORCH_PROFILER_DIR", "opens /start_profile and /stop_profile to whoever reaches the API, and fills "
                                    "a directory with traces"),
        ("VLLM_TORCH_CUDA_PROFILE", "opens /start_profile and /stop_profile to whoever reaches the API"),
    ),
    host_ip_var="VLLM_HOST_IP",  # vllm/envs.py: the address its workers on a Ray node announce
)

SGLANG = EngineDescriptor(
    name="sglang", label="SGLang", version_setting="sglang_version",
    images=("lmsysorg/sglang",), version_tag=None,
    # SGLang 0.5.23 reads its key only from --api-key, which it would log at start-up: it runs without one, on
    # loopback, behind the host's guard (release/engines/sglang.py)
    key_var=None,
    # sglang/srt/metrics/collector.py: SchedulerMetricsCollector and TokenizerMetricsCollector (--enable-metrics)
    metrics=EngineMetrics(running="sglang:num_running_reqs", waiting="sglang:num_queue_reqs",
                          kv_usage="sglang:token_usage", prompt_tokens="sglang:prompt_tokens_total",
                          generation_tokens="sglang:generation_tokens_total", model_name_label=True),
    metrics_need_key=False,
    bench=BenchCounters(prefix_gauge="sglang:cache_hit_rate"),  # a running hit rate, no counters
    # sglang/srt/model_executor/model_runner.py, sglang/srt/entrypoints/http_server.py, uvicorn: its weight
    # loader prints the same tqdm bar as vLLM's
    start_phases=(
        StartPhase("Load weight begin", "loading model"),
        StartPhase("Loading safetensors checkpoint shards", "loading shards", _VLLM_COUNT),
        StartPhase("Load weight end", "weights loaded"),
        StartPhase("Capture cuda graph begin", "CUDA graphs"),
        StartPhase("Capture cuda graph end", "CUDA graphs captured"),
        StartPhase("Application startup complete", "ready", ready=True),
        StartPhase("The server is fired up and ready to roll", "ready", ready=True),
    ),
    tensor_parallel=False, pooling=False, model_format="safetensors",
    silent_listener_frozen=True,  # launch_server starts uvicorn once its schedulers loaded the model
)

LLAMACPP = EngineDescriptor(
    name="llamacpp", label="llama.cpp", version_setting="llamacpp_version",
    images=("ghcr.io/ggml-org/llama.cpp",), version_tag=None,
    key_var="LLAMA_API_KEY",  # llama-server reads it (--api-key's env)
    # llama.cpp tools/server (server-context.cpp), /metrics with --metrics (which the key guards too). Its
    # llamacpp:kv_cache_usage_ratio (and kv_cache_tokens) went with the KV cache API rework of 2025: builds
    # of that age and later (b10488 reported without it) export no KV gauge, so sparkfleet reads none.
    metrics=EngineMetrics(running="llamacpp:requests_processing", waiting="llamacpp:requests_deferred",
                          kv_usage=None,
                          prompt_tokens="llamacpp:prompt_tokens_total",
                          generation_tokens="llamacpp:tokens_predicted_total",
                          # its token counters move when a prompt or an answer ends; this, at each llama_decode()
                          steps="llamacpp:n_decode_total"),
    metrics_need_key=True,
    bench=BenchCounters(),
    # tools/server/server.cpp's log lines, prefixed "main:" or "srv  llama_server:" by the build
    start_phases=(
        StartPhase("loading model", "loading model"),
        StartPhase("model loaded", "weights loaded"),
        StartPhase("server is listening on", "ready", ready=True),
        StartPhase("exiting due to model loading error", "failed to start", failed=True),
    ),
    tensor_parallel=False, pooling=False, model_format="gguf",
    silent_listener_frozen=True,  # llama-server listens before it loads, and answers 503 "Loading model" meanwhile
    kv_cache_is_context=True,  # llama-server allocates the KV cache of its whole context (-c) at start
)

DESCRIPTORS: dict[str, EngineDescriptor] = {d.name: d for d in (VLLM, SGLANG, LLAMACPP)}
ENGINES = tuple(DESCRIPTORS)
DEFAULT_ENGINE = VLLM.name  # group_data/all.py's `engine`, and a recipe's that names none

# Every engine's older KV gauge names: the alerts read them beside the current ones.
LEGACY_KV_USAGE = tuple(name for d in DESCRIPTORS.values() for name in d.legacy_kv_usage)
# Every engine.env variable an engine reads its key from: what the planner refuses in engine_env (sparkfleet
# writes it from `api_key`).
KEY_VARS = tuple(dict.fromkeys(d.key_var for d in DESCRIPTORS.values() if d.key_var))
VERSION_SETTINGS = tuple(d.version_setting for d in DESCRIPTORS.values())
# Every engine_env variable that opens an engine's admin surface, with why: refused whichever engine runs.
ADMIN_ENV = {var: why for d in DESCRIPTORS.values() for var, why in d.admin_env}
# The variables that tell a tensor-parallel engine a member's own fabric address (release/group.py).
HOST_IP_VARS = tuple(d.host_ip_var for d in DESCRIPTORS.values() if d.tensor_parallel and d.host_ip_var)


def descriptor(engine: str) -> EngineDescriptor:
    """The descriptor of `engine` (one of ENGINES); KeyError otherwise."""
    return DESCRIPTORS[engine]


def metrics(engine: str) -> EngineMetrics:
    """The metric names of `engine` (one of ENGINES)."""
    return DESCRIPTORS[engine].metrics


def every(field_name: str) -> tuple[str, ...]:
    """One meaning's series of every engine that exports it (EngineMetrics field name), in ENGINES order: what
    an alert or a panel reads to cover a fleet of mixed engines."""
    return tuple(name for name in (getattr(d.metrics, field_name) for d in DESCRIPTORS.values()) if name)


def kv_usage_series() -> tuple[str, ...]:
    """Every engine's KV cache gauge (0..1), each followed by its older names, in ENGINES order."""
    return tuple(name for d in DESCRIPTORS.values() for name in (d.metrics.kv_usage, *d.legacy_kv_usage) if name)


def able(capability: str) -> tuple[EngineDescriptor, ...]:
    """The engines with a capability ("tensor_parallel", "pooling"), in ENGINES order."""
    return tuple(d for d in DESCRIPTORS.values() if getattr(d, capability))


def serving_format(model_format: str) -> tuple[EngineDescriptor, ...]:
    """The engines that serve a model format ("safetensors", "gguf"), in ENGINES order."""
    return tuple(d for d in DESCRIPTORS.values() if d.model_format == model_format)


def names(found: tuple[EngineDescriptor, ...]) -> str:
    """Engines as a refusal's fix names them: `engine = "a"` (or `engine = "b"`)."""
    return " or ".join(f'engine = "{d.name}"' for d in found)


def start_phases() -> tuple[StartPhase, ...]:
    """Every engine's start lines, in ENGINES order (the journal holds one engine's: the first match counts)."""
    return tuple(phase for d in DESCRIPTORS.values() for phase in d.start_phases)


# The engine the RAG services' pooling models run on (embeddings, rerank): the first that can, in ENGINES order.
POOLING_ENGINE = able("pooling")[0].name
