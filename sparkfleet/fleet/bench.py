"""How fast does a served model answer? Streaming chat completions, timed chunk by chunk.

    sparkfleet bench (INVENTORY [--limit NAME] [--front-door] | --url URL) [--model NAME]
                     [--concurrency 1,4,8,16] [--max-tokens 512] [--think/--no-think]
                     [--requests N] [--timeout S] [--roofline TOKENS_PER_S] [--out DIR] [--json]

The key is the inventory host's api_key (or, with --front-door, its first user's), or $SPARKFLEET_API_KEY
(which wins when set): never an argument, since a command line is seen by every user of the machine.

Any engine: the timings are the client's (llama-server and SGLang stream the
same OpenAI chunks, take ``ignore_eos`` and ``chat_template_kwargs``); the
engine (the inventory's ``engine``, else told by its /metrics names) picks
the counters read beside them (contract/engines.py): its generated-tokens
counter over the run, a cross-check of the client's count. The prefix-cache
counters and the speculative-decoding ones below are vLLM's; SGLang offers
only its own running ``sglang:cache_hit_rate`` gauge, llama.cpp neither: the
report says "not exported by <engine>".

A thin client over the official ``openai`` package (``stream=True`` with
``stream_options={"include_usage": True}``); each chunk is stamped with
``time.perf_counter``. Per concurrency level (``c`` requests in flight at
once, ``--requests`` of them in all; default ``max(4, 2 x c)``):

- TTFT: request sent -> first chunk carrying content, reasoning or a tool call;
- TPOT: (last token - first token) / (completion_tokens - 1), per request;
- ITL: gaps between token-carrying chunks, over all requests of the level;
- per-request tokens/s: completion_tokens / request latency (what one user sees),
  and per-request decode tokens/s = 1 / TPOT;
- aggregate throughput: completion tokens of the level / the level's wall time;
- errors (exception type and message, the first few kept).

Single-stream decode tokens/s is the median over the concurrency-1 requests
of (completion_tokens - 1) / (last token - first token). The prefix-cache hit
rate comes from the server's ``/metrics`` counters (``vllm:prefix_cache_hits``
and ``vllm:prefix_cache_queries``, with or without ``_total``) read before and
after the run. Given a roofline (the plan's fit: its decode bound for the
inventory's model, memory and bandwidth settings, or ``--roofline``), the report says how much
of it single-stream decode reaches.

With speculative decoding the server exports vLLM's counters
``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens``,
``..._num_accepted_tokens`` and ``..._num_accepted_tokens_per_pos`` (by
``position``; vllm/v1/spec_decode/metrics.py, ``_total`` as Prometheus
counters). Over the run: acceptance rate = accepted / draft tokens, mean
accepted length = 1 + accepted / drafts (tokens per target step, the bonus
token included), and per position accepted / drafts. A step that accepts k
drafts emits k + 1 tokens, so decode may exceed the plain roofline.

Requests ask for exactly ``max_tokens`` tokens (``ignore_eos``, as
``vllm bench serve`` does), so every level generates the same work. Only the
given URL is contacted (plus the hub, for the roofline, when an inventory is
given). Not a tool of its own because neither ``vllm bench serve`` (needs a
vLLM install: a GPU build) nor guidellm is installable on the controller here.

Public API: :func:`run_bench`, :func:`write_outputs`, :func:`print_table`; the
command line (its arguments and run) is sparkfleet/commands/bench.py.
"""

from __future__ import annotations

import datetime
import json
import math
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from pathlib import Path

import requests

from sparkfleet.contract import engines
from sparkfleet.fleet.metrics import read_by_label, read_metrics
from sparkfleet.fleet.status import api_headers
from sparkfleet.tables import console as _console
from sparkfleet.tables import literal as _literal
from sparkfleet.tables import print_table as _print_table

__all__ = ["BenchError", "print_table", "run_bench", "write_outputs"]

DEFAULT_MODEL = "Qwen3.5-35B-A3B"
API_KEY_VARIABLE = "SPARKFLEET_API_KEY"  # the key for --url (or over the inventory's): never an argument
DEFAULT_CONCURRENCY = (1, 4, 8, 16)
DEFAULT_MAX_TOKENS = 512
DEFAULT_TIMEOUT_S = 300.0
MAX_ERROR_MESSAGES = 5

# A shared system prompt (what the prefix cache can reuse) and a per-request question.
SYSTEM_PROMPT = (
    "You are a patient storyteller. Write long, plain prose with no lists, no headings "
    "and no code. Keep going until you are told to stop; never summarise or conclude early. "
    "Describe places, people and weather in concrete detail, one paragraph after another."
)
PROMPT_TOKENS = 128  # about what SYSTEM_PROMPT and QUESTION take: the roofline's context is this + max_tokens
QUESTION = "Story {n}: tell the story of a lighthouse keeper on a small northern island, chapter by chapter."

# The counters read before and after a run: each engine's own (contract/engines.py `bench`); a server whose engine
# is not known is read with the default engine's.
DEFAULT_COUNTERS = engines.descriptor(engines.DEFAULT_ENGINE).bench


def counters_of(engine: str | None) -> engines.BenchCounters:
    """The counters of `engine`: the default engine's when it is not known, none for a name sparkfleet lacks."""
    if not engine:
        return DEFAULT_COUNTERS
    return engines.DESCRIPTORS[engine].bench if engine in engines.DESCRIPTORS else engines.BenchCounters()


class BenchError(RuntimeError):
    """The server cannot be benchmarked (the warm-up request failed)."""


# --------------------------------------------------------------------------
# statistics
# --------------------------------------------------------------------------


def _pct(values: list[float], p: float) -> float | None:
    """The p-th percentile, linear between closest ranks (numpy's default)."""
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _summary(values: list[float], scale: float = 1.0) -> dict:
    """{"mean", "p50", "p90", "p99"} of values x scale; Nones when there are none."""
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    return {"mean": statistics.fmean(values) * scale,
            **{f"p{p}": _pct(values, p) * scale for p in (50, 90, 99)}}


# --------------------------------------------------------------------------
# /metrics
# --------------------------------------------------------------------------


def _root(url: str) -> str:
    """The server root: "http://h:8000" from "http://h:8000", ".../" or ".../v1"."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def parse_prefix_cache(text: str, counters: engines.BenchCounters = DEFAULT_COUNTERS) -> dict | None:
    """{"hits", "queries", "hit_rate"} from Prometheus text (summed over labels); None if absent."""
    sums = read_metrics(text)
    hits = next((sums[n] for n in counters.prefix_hits if n in sums), None)
    queries = next((sums[n] for n in counters.prefix_queries if n in sums), None)
    if hits is None or queries is None:
        return None
    return {"hits": hits, "queries": queries, "hit_rate": hits / queries if queries else None}


def parse_spec_decode(text: str, counters: engines.BenchCounters = DEFAULT_COUNTERS) -> dict | None:
    """{"drafts", "draft_tokens", "accepted_tokens", "accepted_per_position"} from Prometheus text (summed
    over labels); None when the server does no speculative decoding (vLLM registers the counters only then)."""
    sums = read_metrics(text)
    drafts, draft_tokens, accepted = (next((sums[n] for n in names if n in sums), None) for names in (
        counters.spec_drafts, counters.spec_draft_tokens, counters.spec_accepted))
    if drafts is None or draft_tokens is None or accepted is None:
        return None
    per_pos = next((found for found in (read_by_label(text, n, "position") for n in counters.spec_per_pos)
                    if found), {})
    return {"drafts": drafts, "draft_tokens": draft_tokens, "accepted_tokens": accepted,
            "accepted_per_position": [per_pos[k] for k in sorted(per_pos, key=int)]}


def engine_of(text: str | None) -> str | None:
    """Which engine exported this /metrics text (the one whose running-requests series it holds); None: unknown."""
    found = read_metrics(text or "")
    return next((e for e in engines.ENGINES if engines.metrics(e).running in found), None)


def engine_tokens(engine: str | None, before: str | None, after: str | None) -> float | None:
    """Tokens the engine counted as generated between two scrapes (its counter, contract/engines.py); None
    where the engine, a scrape or the counter is missing."""
    name = engines.metrics(engine).generation_tokens if engine else None
    counts = [read_metrics(text).get(name) if text and name else None for text in (before, after)]
    return None if None in counts else counts[1] - counts[0]


def _other_engine_cache(engine: str, after: str | None) -> dict:
    """What stands in _prefix_cache_report's place for an engine without prefix-cache counters: its own gauge
    (SGLang's running hit rate) at the end of the run, else None; `not_exported_by` names the engine."""
    gauge = counters_of(engine).prefix_gauge
    value = read_metrics(after or "").get(gauge) if gauge else None
    return {"before": None, "after": None, "during": None, "not_exported_by": engine,
            "engine_gauge": {"name": gauge, "value": value} if value is not None else None}


def _scrape(root: str, api_key: str | None) -> str | None:
    """The server's /metrics text, or None when it cannot be read (the report then says so)."""
    try:
        reply = requests.get(f"{root}/metrics", headers=api_headers(api_key), timeout=10)
        reply.raise_for_status()
    except requests.RequestException:
        return None
    return reply.text


def spec_decode_report(before: dict | None, after: dict | None) -> dict | None:
    """Speculative decoding during the run (after - before): acceptance rate, mean accepted length, per position."""
    if not (before and after):
        return None
    drafts = after["drafts"] - before["drafts"]
    draft_tokens = after["draft_tokens"] - before["draft_tokens"]
    accepted = after["accepted_tokens"] - before["accepted_tokens"]
    base = before["accepted_per_position"] or [0.0] * len(after["accepted_per_position"])
    return {
        "drafts": drafts,
        "draft_tokens": draft_tokens,
        "accepted_tokens": accepted,
        "num_speculative_tokens": round(draft_tokens / drafts) if drafts else None,
        "acceptance_rate": accepted / draft_tokens if draft_tokens else None,
        "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
        # a before of another length (the engine restarted with other settings) compares the positions both have
        "acceptance_per_position": ([(a - b) / drafts for a, b in zip(after["accepted_per_position"], base,
                                                                       strict=False)] if drafts else []),
    }


def _prefix_cache_report(before: dict | None, after: dict | None) -> dict:
    during = None
    if before and after:
        hits, queries = after["hits"] - before["hits"], after["queries"] - before["queries"]
        during = {"hits": hits, "queries": queries, "hit_rate": hits / queries if queries > 0 else None}
    return {"before": before, "after": after, "during": during}


# --------------------------------------------------------------------------
# one request
# --------------------------------------------------------------------------


def _has_token(delta) -> bool:
    """Does this chunk's delta carry generated text (answer, reasoning or a tool call)?"""
    if delta is None:
        return False
    if delta.content or delta.tool_calls:
        return True
    extra = delta.model_extra or {}
    return bool(getattr(delta, "reasoning", None) or getattr(delta, "reasoning_content", None)
                or extra.get("reasoning") or extra.get("reasoning_content"))


def _one_request(client, model: str, n: int, max_tokens: int, extra_body: dict) -> dict:
    """Stream one chat completion; return its timings (seconds) or its error."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": QUESTION.format(n=n)}]
    stamps: list[float] = []
    usage = None
    start = time.perf_counter()
    try:
        stream = client.chat.completions.create(
            model=model, messages=messages, max_tokens=max_tokens, stream=True,
            stream_options={"include_usage": True}, extra_body=extra_body)
        for chunk in stream:
            now = time.perf_counter()
            if chunk.usage is not None:
                usage = chunk.usage
            if any(_has_token(choice.delta) for choice in chunk.choices):
                stamps.append(now)
    except Exception as exc:  # openai's and httpx's errors alike: count them, keep going
        return {"error": f"{type(exc).__name__}: {exc}", "start": start, "end": time.perf_counter()}
    end = time.perf_counter()
    if not stamps:
        return {"error": "the stream carried no tokens", "start": start, "end": end}
    tokens = usage.completion_tokens if usage is not None else len(stamps)
    span = stamps[-1] - stamps[0]
    return {
        "start": start,
        "end": end,
        "ttft": stamps[0] - start,
        "e2e": end - start,
        "completion_tokens": tokens,
        "prompt_tokens": usage.prompt_tokens if usage is not None else None,
        "tpot": span / (tokens - 1) if tokens > 1 else None,
        "decode_tokens_per_s": (tokens - 1) / span if tokens > 1 and span > 0 else None,
        "itl": [b - a for a, b in pairwise(stamps)],
    }


def _level(client, model: str, concurrency: int, count: int, max_tokens: int, extra_body: dict,
           first_n: int) -> dict:
    """`count` requests with `concurrency` in flight at once."""
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix=f"bench-c{concurrency}") as pool:
        futures = [pool.submit(_one_request, client, model, first_n + i, max_tokens, extra_body)
                   for i in range(count)]
        results = [f.result() for f in futures]
    wall = time.perf_counter() - started
    ok = [r for r in results if "error" not in r]
    errors = [r["error"] for r in results if "error" in r]
    tokens = sum(r["completion_tokens"] for r in ok)
    return {
        "concurrency": concurrency,
        "requests": count,
        "ok": len(ok),
        "errors": len(errors),
        "error_messages": sorted(set(errors))[:MAX_ERROR_MESSAGES],
        "duration_s": wall,
        "completion_tokens": tokens,
        "prompt_tokens": sum(r["prompt_tokens"] or 0 for r in ok),
        "aggregate_tokens_per_s": tokens / wall if wall > 0 else None,
        "requests_per_s": len(ok) / wall if wall > 0 else None,
        "ttft_ms": _summary([r["ttft"] for r in ok], 1000),
        "tpot_ms": _summary([r["tpot"] for r in ok if r["tpot"] is not None], 1000),
        "itl_ms": _summary([gap for r in ok for gap in r["itl"]], 1000),
        "e2e_ms": _summary([r["e2e"] for r in ok], 1000),
        "request_tokens_per_s": _summary([r["completion_tokens"] / r["e2e"] for r in ok if r["e2e"] > 0]),
        "decode_tokens_per_s": _summary([r["decode_tokens_per_s"] for r in ok
                                         if r["decode_tokens_per_s"] is not None]),
        "_decode_rates": [r["decode_tokens_per_s"] for r in ok if r["decode_tokens_per_s"] is not None],
    }


# --------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------


def run_bench(url: str, model: str, api_key: str | None, concurrency: list[int], max_tokens: int,
              think: bool, requests_per_level: int | None = None, roofline: float | None = None,
              timeout_s: float = DEFAULT_TIMEOUT_S, engine: str | None = None) -> dict:
    """Benchmark the OpenAI-compatible server at `url` (root or .../v1); return a JSON-able dict.

    `requests_per_level`: requests per concurrency level (default max(4, 2 x level)).
    `roofline`: the decode upper bound in tokens/s (the plan's fit), for the ratio.
    `timeout_s`: per request. Raises BenchError when a first (warm-up) request fails.
    `engine`: the server's (contract/engines.py ENGINES); None: told by its /metrics, where readable.
    """
    from openai import OpenAI

    levels = [int(c) for c in concurrency]
    if not levels or any(c < 1 for c in levels):
        raise ValueError(f"concurrency levels must be positive integers, not {concurrency!r}")
    if max_tokens < 2:
        raise ValueError("max_tokens must be at least 2 (decode speed needs two tokens)")
    root = _root(url)
    client = OpenAI(base_url=f"{root}/v1", api_key=api_key or "none", timeout=timeout_s, max_retries=0)
    extra_body: dict = {"ignore_eos": True}
    if not think:
        extra_body["chat_template_kwargs"] = {"enable_thinking": False}

    warm = _one_request(client, model, 0, 2, extra_body)  # connection set-up, model name, key
    if "error" in warm:
        raise BenchError(f"{root}: the warm-up request failed: {warm['error']}")

    before = _scrape(root, api_key)
    engine = engine or engine_of(before)
    started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    results, n = [], 1
    for c in levels:
        count = requests_per_level or max(4, 2 * c)
        results.append(_level(client, model, c, count, max_tokens, extra_body, n))
        n += count
    after = _scrape(root, api_key)
    counters = counters_of(engine)

    single = [rate for level in results if level["concurrency"] == 1 for rate in level["_decode_rates"]]
    for level in results:
        del level["_decode_rates"]
    single_stream = statistics.median(single) if single else None
    return {
        "tool": "sparkfleet bench",
        "started_at": started_at,
        "url": root,
        "model": model,
        "engine": engine,
        "think": think,
        "max_tokens": max_tokens,
        "concurrency": levels,
        "requests_per_level": requests_per_level,
        "levels": results,
        "errors": sum(level["errors"] for level in results),
        "single_stream_decode_tokens_per_s": single_stream,
        "roofline_tokens_per_s": roofline,
        "decode_vs_roofline": single_stream / roofline if single_stream and roofline else None,
        "engine_generation_tokens": engine_tokens(engine, before, after),
        "prefix_cache": (_prefix_cache_report(*(parse_prefix_cache(t, counters) if t else None
                                                for t in (before, after)))
                         if counters.prefix_hits else _other_engine_cache(engine, after)),
        "speculative_decoding": (spec_decode_report(*(parse_spec_decode(t, counters) if t else None
                                                      for t in (before, after)))
                                 if counters.spec_drafts else None),
    }


# --------------------------------------------------------------------------
# outputs
# --------------------------------------------------------------------------


def write_outputs(result: dict, out_dir: Path) -> tuple[Path, Path]:
    """Write out_dir/bench.json and out_dir/bench.png (throughput and TTFT against concurrency)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out_dir / "bench.json", out_dir / "bench.png"
    json_path.write_text(json.dumps(result, indent=2) + "\n")

    levels = result["levels"]
    xs = [level["concurrency"] for level in levels]
    fig = Figure(figsize=(10, 4.2), dpi=100, layout="constrained")
    thr, ttft = fig.subplots(1, 2)
    thr.plot(xs, [level["aggregate_tokens_per_s"] or 0 for level in levels], "o-", label="aggregate")
    thr.plot(xs, [level["request_tokens_per_s"]["p50"] or 0 for level in levels], "s--",
             label="per request (p50)")
    if result.get("roofline_tokens_per_s"):
        thr.axhline(result["roofline_tokens_per_s"], color="grey", linestyle=":",
                    label="single-stream roofline")
    thr.set(title="Output throughput", xlabel="concurrency", ylabel="tokens/s")
    for p, style in (("p50", "o-"), ("p90", "^--"), ("p99", "v:")):
        ttft.plot(xs, [level["ttft_ms"][p] if level["ttft_ms"][p] is not None else math.nan
                       for level in levels], style, label=f"TTFT {p}")
    ttft.set(title="Time to first token", xlabel="concurrency", ylabel="ms")
    for ax in (thr, ttft):
        ax.set_xticks(xs)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(f"{result['model']} at {result['url']} - max_tokens {result['max_tokens']}, "
                 f"thinking {'on' if result['think'] else 'off'}")
    fig.savefig(png_path, format="png")
    return json_path, png_path


def _f(value, fmt: str = ".1f") -> str:
    return "-" if value is None else format(value, fmt)


def _pct_of(share: float | None) -> float | None:
    return None if share is None else share * 100


def print_table(result: dict, console=None) -> None:
    """The run as a table, then single-stream decode, roofline and prefix cache."""
    console = console or _console()
    rows = []
    for level in result["levels"]:
        t, i = level["ttft_ms"], level["itl_ms"]
        rows.append((
            str(level["concurrency"]), str(level["requests"]),
            f"[red]{level['errors']}[/]" if level["errors"] else "0",
            f"{_f(t['p50'], '.0f')} / {_f(t['p90'], '.0f')} / {_f(t['p99'], '.0f')}",
            _f(level["tpot_ms"]["p50"]),
            f"{_f(i['p50'])} / {_f(i['p90'])} / {_f(i['p99'])}",
            _f(level["request_tokens_per_s"]["p50"]), _f(level["aggregate_tokens_per_s"]),
        ))
    _print_table(f"sparkfleet bench: {_literal(result['model'])} at {_literal(result['url'])} "
                 f"(max_tokens {result['max_tokens']}, thinking {'on' if result['think'] else 'off'})",
                 ("conc.", "reqs", "errors", "TTFT p50/p90/p99 ms", "TPOT p50 ms", "ITL p50/p90/p99 ms",
                  "req tok/s p50", "aggregate tok/s"), rows, justify="right", out=console)
    single, roof = result["single_stream_decode_tokens_per_s"], result["roofline_tokens_per_s"]
    line = f"single-stream decode: {_f(single)} tokens/s"
    spec = result.get("speculative_decoding")
    if roof:
        line += f"; roofline {roof:.1f} tokens/s; measured / roofline = {_f(result['decode_vs_roofline'], '.0%')}"
        if spec:
            line += " (speculative decoding may exceed the plain roofline: a step emits 1 + its accepted drafts)"
    elif single is None:
        line += " (no concurrency-1 level)"
    console.print(line)
    if spec:
        console.print(
            f"speculative decoding: acceptance rate {_f(_pct_of(spec['acceptance_rate']))} % of "
            f"{_f(spec['num_speculative_tokens'], 'd')} draft tokens per step, mean accepted length "
            f"{_f(spec['mean_acceptance_length'], '.2f')} tokens per step, per position "
            f"{' / '.join(f'{p * 100:.0f} %' for p in spec['acceptance_per_position']) or '-'} "
            f"({_f(spec['drafts'], '.0f')} drafts during the run, from /metrics)")
    engine = result.get("engine")
    counted = result.get("engine_generation_tokens")
    if counted is not None:
        client = sum(level["completion_tokens"] for level in result["levels"])
        console.print(f"{engine} counted {counted:.0f} tokens generated during the run "
                      f"({engines.metrics(engine).generation_tokens}; the client counted {client})")
    cache = result["prefix_cache"]
    if cache.get("not_exported_by"):
        gauge = cache.get("engine_gauge")
        console.print(f"prefix cache: hit counters not exported by {cache['not_exported_by']}" + (
            f"; its own {gauge['name']} reads {gauge['value'] * 100:.1f} % after the run" if gauge else ""))
        console.print(f"speculative decoding: counters not exported by {cache['not_exported_by']}")
    elif cache["before"] is None or cache["after"] is None:
        counters = counters_of(engine)
        console.print(f"prefix cache: no {counters.prefix_hits[-1]} or {counters.prefix_queries[-1]} counters in "
                      f"/metrics")
    else:
        rate = lambda d: _f(d["hit_rate"] * 100 if d and d["hit_rate"] is not None else None, ".1f")  # noqa: E731
        console.print(f"prefix cache hit rate: before {rate(cache['before'])} %, after {rate(cache['after'])} %, "
                      f"during the run {rate(cache['during'])} %")
    for level in result["levels"]:
        for message in level["error_messages"]:
            console.print(f"[red]concurrency {level['concurrency']}: {_literal(message)}[/]")


def _roofline(name: str, data: dict, max_tokens: int) -> float | None:
    """The plan's single-stream decode bound (its fit) at this run's context; None when the model is unknown."""
    from sparkfleet.model.hubs import hub_resolver
    from sparkfleet.release.plan import plan_hosts
    from sparkfleet.contract.settings import SettingsError

    try:
        fit = plan_hosts([(name, data)], resolve=hub_resolver)[0].fit
    except SettingsError:  # the roofline is a bonus: a model the hub cannot describe gets no ratio
        return None
    return fit.decode_tokens_per_s(max_tokens + PROMPT_TOKENS) if fit else None
