#!/usr/bin/env python3
"""Stand-in for `vllm serve` (vLLM 0.33.0) in the simulated fleet.

Standard library only: it runs in a minimal image that has nothing but
python3. It accepts exactly the flags in vLLM's flag table (a JSON file made
from vLLM's own parser), loads the model directory the way vLLM would before
serving (config.json, every safetensors shard's header and size), then serves
the OpenAI-compatible endpoints vLLM serves, generating deterministic tokens
at a set rate.

    python3 standin_vllm.py [--flags-file PATH] MODEL_DIR [vllm serve flags...]
    python3 standin_vllm.py --mode sglang [--flags-file PATH] --model-path DIR [sglang.launch_server flags...]

With `--mode sglang` it stands in for SGLang 0.5.23's `python3 -m sglang.launch_server` (the image's
sglang/launch_server.py runs it so): SGLang's flags (its table), `--config FILE` (SGLang's YAML of
`key: value` lines, merged under the command line's flags: how the API key reaches it off the command line),
port 30000 by default, /health, /health_generate (one token), /get_model_info, the OpenAI routes, /metrics
with sglang: names only with --enable-metrics; the key guards every route but /health* and /metrics, as
SGLang's middleware does. Same engine, same faults.

Environment:
    SIM_LOAD_DELAY_S          seconds "loading" before the port is bound (2)
    SIM_TOKENS_PER_S          decode rate (50)
    SIM_FIRST_TOKEN_DELAY_MS  extra delay before the first token (0)
    SIM_PREFILL_TOKENS_PER_S  prefill rate of the prompt tokens the prefix cache does not hold (2000; 0: no prefill
                              time; see "Prefix cache and prefill")
    SIM_HOST_MEMORY_GB        the host's memory the KV budget is a share of (128, a DGX Spark's)
    SIM_FAIL_HEALTH=1         /health answers 503
    SIM_GUARD_READY=1         also answers GUARD_READY_PATH as its host's guard would (200 while it answers, 503 as
                              /health): for a test that puts a front door straight before the stand-in
    SIM_CRASH_ON_START=1      exit 1 after "loading" (a crash on every start)
    SIM_KNOB_FILE             fault knob file (/etc/sparkfleet-sim/engine.json)
    SIM_SPEC_ACCEPTANCE_RATE  with --speculative-config: share of draft tokens accepted (0.7)
    SIM_ANSWER_FAULT          answers gone bad: wrong, tool_text, cut or tool_args (unset: none; see "Answers")
    SIM_RAY_WAIT_S            with the Ray backend: seconds to wait for N GPU nodes before failing (300)
    SIM_RAY_CHECK_S           with the Ray backend: seconds between checks of the nodes while serving (3)
    RAY_ADDRESS               with the Ray backend: the cluster to join (HEAD:PORT; "auto" when unset)
    VLLM_API_KEY              API key when --api-key is not given

Fault knobs: the knob file is JSON, e.g. {"fault": "hang", "crash_on_start":
true, "load_delay_s": 40}; its keys override the SIM_* variables. In the
simulated fleet the stand-in runtime hook copies the sim host's
/etc/sparkfleet-sim/engine.json into every GPU container at start (start-time
knobs, survive restarts), and `python -m sim engine HOST --live ...` rewrites
the running container's copy (`docker exec`: gone after a restart). "fault" is
re-read on every request, so it is set and cleared without a restart:
    hang              nothing answers (port open, requests wait): a wedged engine
    generation-hang   /health, /v1/models answer; chat completions wait
"spec_acceptance_rate" (0..1) is also read on every decode step: with
--speculative-config '{"method": "mtp", "num_speculative_tokens": N}' each
step emits 1 + the accepted drafts at the plain step rate (SIM_TOKENS_PER_S),
and /metrics exports vLLM's vllm:spec_decode_* counters.
"answer_fault" (SIM_ANSWER_FAULT) is read on every request too (see "Answers").

Prefix cache and prefill. vLLM's automatic prefix cache, block by block: the prompt (the words of the chat
template's rendering, one token a word) in blocks of --block-size (16) tokens, each block's hash chained over every
block before it, so a block hits only when its whole prefix does; a request's hit is its leading run of cached
blocks, at most its length less one token (vLLM recomputes the last token for its logits), counted in tokens on
vLLM's counters vllm:prefix_cache_queries_total / vllm:prefix_cache_hits_total (vllm/v1/metrics/loggers.py
declares the Counters vllm:prefix_cache_queries and vllm:prefix_cache_hits; the client library adds _total). A
request's prompt blocks enter the cache when it is admitted, its generated tokens' blocks when it ends (so the next
turn, which re-sends the answer, hits them), and the least recently used blocks no running request holds leave
first once the cache is full. The budget, in blocks (KvBudget):
    --num-gpu-blocks-override N   N blocks (vLLM's own override)
    --kv-cache-memory-bytes B     B / (block size x KV bytes per token)
    else                          (SIM_HOST_MEMORY_GB x --gpu-memory-utilization - the shards' bytes - 3 GiB, the
                                  planner's activation and CUDA graph reserve) / (block size x KV bytes per token)
KV bytes per token from config.json (its text_config first), as sparkfleet/model/kv.py counts it: 2 (K and V) x
full-attention layers (layer_types, else every layer) x KV heads x head_dim x 2 bytes (1 with an fp8
--kv-cache-dtype); 20,480 (Qwen3.5-35B-A3B in bf16, /work/shared/reference/spark-and-vllm.md) where config.json
lacks a field. Simplified against vLLM: the running requests' partial last blocks and decode growth do not count
against the budget, and a cache whose every block is held by running requests overflows instead of preempting.
Prefill: the tokens the cache did not hold take uncached / SIM_PREFILL_TOKENS_PER_S seconds, one request's prefill
after another's on an engine (one GPU), before SIM_FIRST_TOKEN_DELAY_MS and the first token. The default, 2,000
tokens/s: the shared reference write-ups give no Spark prefill rate; vLLM's DGX Spark write-up (June 2026, as
summarised by AI-Daily-Builder, "Why DGX Spark's GB10 reads as 23 tok/s decode but 1,884 tok/s prefill") measured
1,636 tokens/s prefill at a 1,834-token prompt and ~1,884 at 7,234 tokens (Nemotron-3-Super-120B-A12B NVFP4, vLLM,
one Spark), and NVIDIA's own figure for GPT-OSS-20B MXFP4 on llama.cpp is 3,670 tokens/s at 2,048 tokens: 2,000
is between them, on the slow side for a 3B-active MoE. A short prompt (tens of tokens) adds tens of milliseconds
to the first token; the decode rate is unchanged.

Answers (chat completions; the same at any temperature, so a healthy engine repeats its answers at temperature 0).
A request the rules below do not recognise gets the steady stream of WORDS up to max_tokens (finish "length"), as
a benchmark wants. A recognised one gets a short answer, finish "stop" (or "length" when max_tokens cuts it):
    tools with tool_choice "auto"   a call of each tool the last user message names, in order (a name twice, two
                                    calls), else of the first tool; arguments: every required parameter, its enum's
                                    first value or its type's default ("sim", 0, false, [] with minItems "sim"s,
                                    an object's own required ones), valid for the tool's parameters schema
    a tool result last              "According to the tool, the result is: <the result's content>"
    response_format json_schema     the schema's minimal valid instance (json_object: {})
    "what is A op B" (+ - * x /)    the number
    "what is the X?"                the word after "the X is" anywhere in the conversation (a needle, an extraction)
    "reply with only the word X"    X
    "exactly N lines"               N one-word lines
    "at most N words"               fewer words than N
    a system message's "start/end every reply with the word X": the reply starts/ends with X (a short answer)
"answer_fault": wrong (each short answer's letters rotated by 13 and digits by one, the stream shifted: other
answers), tool_text (an "auto" tool call comes back as the model's raw markup in content, as vLLM does when the
tool parser does not match the model), cut (an answer ends after CUT_TOKENS tokens, finish "length", tool calls as
text), tool_args (calls parsed, their arguments breaking the schema). A --tool-call-parser that does not read the
model's tool format (TOOL_FORMATS, from config.json's model_type) is tool_text for good.

With --distributed-executor-backend ray and --tensor-parallel-size N the
stand-in joins the running Ray cluster as vLLM does (standin_ray.py, next to
this file; Ray is imported only then): it loads nothing and binds no port until
Ray gives it a placement group of N {"GPU": 1} bundles on N nodes, and exits 1
when that does not happen within "ray_wait_s"; while serving, fewer than N alive
GPU nodes make the engine dead for good (/health 503, requests 500) until it is
restarted.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import struct
import sys
import threading
import time
import uuid
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

VERSION = "0.33.0"
DEFAULT_MAX_TOKENS = 64
BLOCK_TOKENS = 16  # vLLM's default --block-size: the prefix cache's unit
DEFAULT_PREFILL_TOKENS_PER_S = 2000.0  # see "Prefix cache and prefill" for its sources
SPARK_MEMORY_GB = 128.0  # a DGX Spark's unified memory (sparkfleet/model/fit.py SPARK_MEMORY_BYTES, decimal)
KV_RESERVE_BYTES = 3 * 2**30  # sparkfleet/model/fit.py RESERVE_BYTES: activations (2 GiB) + CUDA graphs (1 GiB)
FALLBACK_KV_BYTES_PER_TOKEN = 20480  # Qwen3.5-35B-A3B, bf16 KV (the reference): where config.json lacks a field
WORDS = (
    "The simulated Spark answers every request with the same steady stream "
    "of words so that tests can count them and clocks can time them while "
    "the real engine waits on real hardware elsewhere"
).split()
REASONING_TEXT = "The user asked a question. I will answer it briefly."
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
                640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
               1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
               40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


# --------------------------------------------------------------------------
# logging, vLLM style


def log(msg: str, level: str = "INFO") -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"(APIServer pid={os.getpid()}) {level} {stamp} [standin_vllm.py] {msg}",
          flush=True)


def progress_bar(desc: str, total: int, seconds: float, vllm_format: bool) -> None:
    """A tqdm bar on stderr over `seconds`, a line per step (at most 10) as the journal stores it: vLLM's own bar
    format (its weight loader's) or tqdm's default (its CUDA graph capture's)."""
    t0 = time.monotonic()
    steps = min(total, 10)
    for step in range(steps + 1):
        n = total * step // steps
        if step:
            time.sleep(seconds / steps)
        elapsed = time.strftime("%M:%S", time.gmtime(time.monotonic() - t0))
        percent = 100 * n // total
        if vllm_format:
            line = f"{desc}: {percent:3d}% Completed | {n}/{total} [{elapsed}<00:00, ?it/s]"
        else:
            bar = ("\u2588" * (percent // 10)).ljust(10)
            line = f"{desc}: {percent:3d}%|{bar}| {n}/{total} [{elapsed}<00:00, ?it/s]"
        print(line, file=sys.stderr, flush=True)


DEFAULT_KNOB_FILE = "/etc/sparkfleet-sim/engine.json"
GUARD_READY_PATH = "/sparkfleet/ready"  # sparkfleet/roles/guard.py READY_PATH: a front door's check, at the guard
FAULTS = ("hang", "generation-hang")


def knobs() -> dict:
    """The fault knobs now: SIM_* variables, overridden by the knob file (read every call)."""
    values = {"crash_on_start": os.environ.get("SIM_CRASH_ON_START") == "1",
              "load_delay_s": os.environ.get("SIM_LOAD_DELAY_S", "2"), "fault": None,
              "spec_acceptance_rate": os.environ.get("SIM_SPEC_ACCEPTANCE_RATE", "0.7"),
              "ray_wait_s": os.environ.get("SIM_RAY_WAIT_S", "300"),
              "answer_fault": os.environ.get("SIM_ANSWER_FAULT") or None}
    try:
        with open(os.environ.get("SIM_KNOB_FILE", DEFAULT_KNOB_FILE)) as f:
            loaded = json.load(f)
        values.update(loaded if isinstance(loaded, dict) else {})
    except (OSError, ValueError):
        pass
    return values


def wait_while_faulty(faults: tuple[str, ...]) -> None:
    """Hold a request while the knob names one of `faults` (a wedged engine never answers)."""
    while knobs().get("fault") in faults:
        time.sleep(0.5)


class StartupError(Exception):
    """A failure vLLM reports as an exception before serving (exit 1)."""


def die_startup(exc: StartupError) -> None:
    """Print what vLLM's uncaught exception prints last, and exit 1."""
    kind, message = exc.args
    print("Traceback (most recent call last):\n"
          '  File "/usr/local/bin/vllm", line 10, in <module>\n'
          "    sys.exit(main())", file=sys.stderr)
    print(f"{kind}: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


# --------------------------------------------------------------------------
# argument parsing against the flag table


class UsageError(Exception):
    """An argparse-style error: printed with usage, exit 2."""

    def __init__(self, message: str, prog: str = "vllm serve"):  # "launch_server.py": SGLang's
        super().__init__(message)
        self.prog = prog


def default_flags_file() -> Path:
    here = Path(__file__).resolve().parent
    for cand in (here / "vllm-flags.json",
                 here.parent.parent / "sparkfleet" / "release" / "engines" / f"vllm-{VERSION}.json"):
        if cand.exists():
            return cand
    return here / "vllm-flags.json"


def load_table(path: Path) -> dict:
    try:
        table = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        print(f"standin_vllm: cannot read flag table {path}: {e}", file=sys.stderr)
        sys.exit(2)
    if not isinstance(table.get("flags"), dict):
        print(f"standin_vllm: flag table {path} has no 'flags'", file=sys.stderr)
        sys.exit(2)
    return table


def _normalise(arg: str) -> list[str]:
    """What FlexibleArgumentParser does before argparse sees an argument."""
    if arg.startswith("--"):
        key, eq, value = arg.partition("=")
        head, dot, tail = key[2:].partition(".")
        return ["--" + head.replace("_", "-") + dot + tail + eq + value]
    if arg.startswith("-O") and arg != "-O":
        level = arg[3:] if arg[2:3] == "=" else arg[2:]
        return ["--optimization-level", level]
    return [arg]


def _looks_negative_number(s: str) -> bool:
    return bool(re.fullmatch(r"-\d+(\.\d+)?", s))


def _is_option(s: str) -> bool:
    return s.startswith("-") and s != "-" and not _looks_negative_number(s)


def _check_value(flag: str, spec: dict, value: str):
    choices = spec.get("choices")
    if choices is not None and value not in choices:
        shown = ", ".join(repr(c) for c in choices)
        raise UsageError(f"argument {flag}: invalid choice: {value!r} (choose from {shown})")
    t = spec.get("type")
    try:
        if t == "int":
            return int(value)
        if t == "float":
            return float(value)
        if t in ("human_readable_int", "human_readable_int_or_auto"):
            return human_readable_int(value, allow_auto=t.endswith("auto"))
        if t == "loads":
            return json.loads(value)
    except (ValueError, TypeError):
        raise UsageError(f"argument {flag}: Value {value} cannot be converted to {t}.")
    return value


def human_readable_int(value: str, allow_auto: bool = False) -> int:
    value = value.strip()
    if allow_auto and (value == "-1" or value.lower() == "auto"):
        return -1
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if m:
        number, suffix = m.groups()
        dec = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
        if suffix in dec:
            return int(float(number) * dec[suffix])
        return int(number) * {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[suffix]
    return int(value)


def parse_serve_args(argv: list[str], table: dict) -> tuple[str | None, dict]:
    """Parse like `vllm serve`. Returns (model, {dest: value}) keyed by dest.

    Raises UsageError for what argparse would reject (exit 2)."""
    flags: dict = table["flags"]
    allow_abbrev = table.get("allow_abbrev", True)
    args: list[str] = []
    for a in argv:
        args.extend(_normalise(a))

    values: dict = {}
    dotted: dict[str, dict] = {}
    model = None
    extras: list[str] = []
    i = 0
    only_positional = False
    while i < len(args):
        arg = args[i]
        i += 1
        if only_positional or not _is_option(arg):
            if arg == "--" and not only_positional:
                only_positional = True
                continue
            if model is None:
                model = arg
            else:
                extras.append(arg)
            continue
        name, eq, inline = arg.partition("=")
        explicit = inline if eq else None
        # JSON keys passed one at a time: --compilation-config.mode 3
        if name.startswith("--") and "." in name:
            base, _, keypath = name.partition(".")
            spec = flags.get(base)
            if spec is None or not spec.get("value"):
                extras.append(arg)
                continue
            if explicit is None:
                if i >= len(args):
                    raise UsageError(f"argument {base}: expected one argument")
                explicit = args[i]
                i += 1
            try:
                leaf = json.loads(explicit)
            except ValueError:
                leaf = explicit
            node = dotted.setdefault(base, {})
            keys = keypath.rstrip("+").split(".")
            for k in keys[:-1]:
                node = node.setdefault(k, {})
            node[keys[-1]] = leaf
            continue
        spec = flags.get(name)
        if spec is None and allow_abbrev and name.startswith("--"):
            matches = sorted({f for f in flags if f.startswith(name) and f.startswith("--")})
            # aliases and negations of one flag count once
            canon = {flags[m].get("alias_of", m) for m in matches}
            if len(matches) == 1 or (len(canon) == 1 and matches):
                name = matches[0] if len(matches) == 1 else canon.pop()
                spec = flags[name]
            elif len(matches) > 1:
                raise UsageError(f"ambiguous option: {name} could match {', '.join(matches)}")
        if spec is None:
            extras.append(arg)
            continue
        canonical = spec.get("negates") or spec.get("alias_of") or name
        dest = spec.get("dest") or canonical.lstrip("-").replace("-", "_")
        if not spec.get("value"):
            if explicit is not None:
                raise UsageError(f"argument {name}: ignored explicit argument {explicit!r}")
            values[dest] = not bool(spec.get("negates"))
            continue
        nargs = spec.get("nargs")
        if explicit is not None:
            got = [explicit]
        else:
            got = []
            limit = {None: 1, "?": 1}.get(nargs, nargs if isinstance(nargs, int) else None)
            while i < len(args) and not _is_option(args[i]) and (limit is None or len(got) < limit):
                got.append(args[i])
                i += 1
        if nargs in (None,) and len(got) != 1:
            raise UsageError(f"argument {name}: expected one argument")
        if nargs == "+" and not got:
            raise UsageError(f"argument {name}: expected at least one argument")
        if isinstance(nargs, int) and len(got) != nargs:
            raise UsageError(f"argument {name}: expected {nargs} arguments")
        converted = [_check_value(name, spec, v) for v in got]
        if nargs in (None, "?"):
            value = converted[0] if converted else spec.get("default")
        else:
            value = converted
        if spec.get("append"):
            values.setdefault(dest, []).append(value)
        else:
            values[dest] = value
    for base, tree in dotted.items():
        dest = flags[base].get("dest") or base.lstrip("-").replace("-", "_")
        values[dest] = tree
    if extras:
        raise UsageError("unrecognized arguments: " + " ".join(extras), prog="vllm")
    return model, values


def usage_exit(err: UsageError) -> None:
    if err.prog == "vllm":
        print("usage: vllm [-h] [-v] {chat,complete,serve,bench,collect-env,run-batch} ...",
              file=sys.stderr)
    elif err.prog == "launch_server.py":
        print("usage: launch_server.py [-h] --model-path MODEL_PATH [options]", file=sys.stderr)
    else:
        print("usage: vllm serve [model_tag] [options]", file=sys.stderr)
    print(f"{err.prog}: error: {err}", file=sys.stderr, flush=True)
    sys.exit(2)


# --------------------------------------------------------------------------
# model directory, as vLLM's loader sees it


def read_safetensors_header(path: Path) -> dict:
    """Check one shard; return its header. Raises StartupError when damaged."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise ValueError("file is shorter than the 8-byte header length")
            (header_len,) = struct.unpack("<Q", raw)
            if header_len > size - 8:
                raise ValueError(f"header length {header_len} runs past the end "
                                 f"of the file ({size} bytes)")
            header = json.loads(f.read(header_len).decode("utf-8"))
    except FileNotFoundError:
        raise StartupError("FileNotFoundError", f"No such file or directory: '{path}'")
    except (ValueError, UnicodeDecodeError, struct.error) as e:
        raise StartupError("safetensors_rust.SafetensorError",
                           f"Error while deserializing header: {e} (file {path})")
    if not isinstance(header, dict):
        raise StartupError("safetensors_rust.SafetensorError",
                           f"Error while deserializing header: not a JSON object (file {path})")
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, stop = info["data_offsets"]
            end = max(end, int(stop))
        except (KeyError, TypeError, ValueError):
            raise StartupError("safetensors_rust.SafetensorError",
                               f"Error while deserializing header: tensor {name!r} has "
                               f"no valid data_offsets (file {path})")
    expected = 8 + header_len + end
    if size != expected:
        raise StartupError("safetensors_rust.SafetensorError",
                           f"Error while deserializing header: MetadataIncompleteBuffer: "
                           f"{path} is {size} bytes, its header describes {expected} bytes")
    return header


def load_model_dir(model: str) -> dict:
    """Returns {"max_position_embeddings": int|None, "shards": [...], "tensors": n, "config": {...},
    "weights_bytes": the shards' bytes}."""
    root = Path(model)
    if not root.is_dir():
        raise StartupError("OSError", f"{model} is not a local folder and the stand-in "
                                      "cannot download models: mount the model directory")
    cfg_path = root / "config.json"
    try:
        config = json.loads(cfg_path.read_text())
    except FileNotFoundError:
        raise StartupError("OSError", f"{model} does not appear to have a file named "
                                      "config.json.")
    except ValueError as e:
        raise StartupError("json.decoder.JSONDecodeError", f"{cfg_path}: {e}")
    text_cfg = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    max_pos = text_cfg.get("max_position_embeddings", config.get("max_position_embeddings"))

    index_path = root / "model.safetensors.index.json"
    if index_path.exists():
        try:
            weight_map = json.loads(index_path.read_text())["weight_map"]
            shard_names = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise StartupError("ValueError", f"cannot read {index_path}: {e}")
    else:
        shard_names = sorted(p.name for p in root.glob("*.safetensors"))
    if not shard_names:
        raise StartupError("RuntimeError", f"Cannot find any model weights with `{model}`")
    tensors = 0
    for name in shard_names:
        header = read_safetensors_header(root / name)
        tensors += sum(1 for k in header if k != "__metadata__")
    return {"max_position_embeddings": max_pos, "shards": shard_names, "tensors": tensors,
            "config": config, "weights_bytes": sum((root / name).stat().st_size for name in shard_names)}


# --------------------------------------------------------------------------
# engine state and metrics


class Histogram:
    def __init__(self, buckets):
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.sum += v
        self.count += 1
        for n, b in enumerate(self.buckets):
            if v <= b:
                self.counts[n] += 1


class Exposition:
    """Prometheus text lines, every series with the same labels."""

    def __init__(self, lbl: str):
        self.lbl = lbl
        self.out: list[str] = []

    def metric(self, mname, mtype, help_, value, extra=""):
        self.out += [f"# HELP {mname} {help_}", f"# TYPE {mname} {mtype}", f"{mname}{{{self.lbl}{extra}}} {value}"]

    def hist(self, mname, help_, h: Histogram):
        lbl = self.lbl
        self.out += [f"# HELP {mname} {help_}", f"# TYPE {mname} histogram"]
        for b, c in zip(h.buckets, h.counts):
            self.out.append(f'{mname}_bucket{{{lbl},le="{float(b)}"}} {float(c)}')
        self.out.append(f'{mname}_bucket{{{lbl},le="+Inf"}} {float(h.count)}')
        self.out.append(f"{mname}_count{{{lbl}}} {float(h.count)}")
        self.out.append(f"{mname}_sum{{{lbl}}} {h.sum}")


def kv_bytes_per_token(config: dict, kv_cache_dtype: str | None) -> int:
    """KV cache bytes one token costs (sparkfleet/model/kv.py's count): 2 x full-attention layers x KV heads x
    head_dim x dtype bytes; FALLBACK_KV_BYTES_PER_TOKEN where config.json lacks a field."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    try:
        layers = int(text["num_hidden_layers"])
        heads = int(text["num_attention_heads"])
        kv_heads = int(text.get("num_key_value_heads") or heads)
        dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return FALLBACK_KV_BYTES_PER_TOKEN
    types = text.get("layer_types") or ["full_attention"] * layers
    full = sum(1 for t in types if t in ("full_attention", "sliding_attention", "attention"))
    dtype = 1 if str(kv_cache_dtype or "auto").startswith("fp8") else 2
    return max(1, 2 * full * kv_heads * dim * dtype)


def kv_cache_blocks(cfg: dict, config: dict, weights_bytes: int) -> int:
    """The prefix cache's budget in blocks (the module docstring's "Prefix cache and prefill")."""
    if cfg.get("num_gpu_blocks_override"):
        return max(1, int(cfg["num_gpu_blocks_override"]))
    block_bytes = cfg["block_size"] * kv_bytes_per_token(config, cfg.get("kv_cache_dtype"))
    if cfg.get("kv_cache_memory_bytes"):
        return max(1, int(cfg["kv_cache_memory_bytes"]) // block_bytes)
    budget = cfg["host_memory_gb"] * 1e9 * cfg["gpu_memory_utilization"] - weights_bytes - KV_RESERVE_BYTES
    return max(1, int(budget // block_bytes))


class PrefixCache:
    """vLLM's automatic prefix cache, block-granular: chained block hashes, least recently used out first among the
    blocks no running request holds. Not locked: the engine calls it under its lock."""

    def __init__(self, capacity_blocks: int, block_tokens: int = BLOCK_TOKENS):
        self.capacity = max(1, capacity_blocks)
        self.block_tokens = block_tokens
        self.blocks: OrderedDict[str, None] = OrderedDict()  # oldest use first
        self.held: dict[str, int] = {}  # blocks running requests hold: how many hold each
        self.evicted = 0

    def hashes(self, tokens: list[str]) -> list[str]:
        """Each full block's hash, chained over every block before it (vLLM's parent hash)."""
        h = hashlib.sha256()
        out = []
        n = self.block_tokens
        for start in range(0, len(tokens) - len(tokens) % n, n):
            h.update("\x00".join(tokens[start:start + n]).encode() + b"\x01")
            out.append(h.hexdigest())
        return out

    def hit_tokens(self, tokens: list[str]) -> int:
        """Tokens of `tokens` the cache holds (its leading cached blocks, never the last token), touching them."""
        hit = 0
        for key in self.hashes(tokens[:-1]):
            if key not in self.blocks:
                break
            self.blocks.move_to_end(key)
            hit += self.block_tokens
        return hit

    def insert(self, keys: list[str]) -> None:
        """Cache these blocks (the most recently used now), evicting the least recently used unheld ones."""
        for key in keys:
            self.blocks[key] = None
            self.blocks.move_to_end(key)
        over = len(self.blocks) - self.capacity
        if over > 0:
            for key in [k for k in self.blocks if k not in self.held][:over]:
                del self.blocks[key]
                self.evicted += 1

    def hold(self, keys: list[str]) -> None:
        for key in keys:
            self.held[key] = self.held.get(key, 0) + 1

    def release(self, keys: list[str]) -> None:
        for key in keys:
            left = self.held.get(key, 0) - 1
            if left > 0:
                self.held[key] = left
            else:
                self.held.pop(key, None)


class Engine:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.lock = threading.Lock()
        self.slots = threading.Semaphore(cfg["max_num_seqs"])
        self.running = 0
        self.waiting = 0
        self.live_tokens: dict[str, int] = {}
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success: dict[str, int] = {"stop": 0, "length": 0, "abort": 0}
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.kv_capacity = max(1, cfg["max_num_seqs"] * cfg["max_model_len"] // 4)
        self.cache = PrefixCache(cfg.get("kv_cache_blocks") or 1, cfg.get("block_size") or BLOCK_TOKENS)
        self.prefill_free_at = 0.0  # monotonic time the engine's prefill queue is clear (one prefill at a time)
        self.spec_credit = 0.0  # accepted drafts owed: keeps the accepted share at the knob, step by step
        self.spec_drafts = self.spec_draft_tokens = self.spec_accepted = 0
        self.spec_per_pos = [0] * cfg["num_speculative_tokens"]
        self.dead: str | None = None  # why the engine died (a lost Ray node): it stays dead until restarted

    def die(self, reason: str) -> None:
        """What vLLM's engine core does when a Ray worker dies: log the error and fail from now on."""
        self.dead = reason
        log(f"EngineCore encountered a fatal error. {reason}", "ERROR")
        log("Engine is dead: /health answers 503 and requests fail until vLLM is restarted.", "ERROR")

    def account_prompt(self, tokens: list[str]) -> tuple[float, list[str]]:
        """Admit a prompt: count it, look it up in the prefix cache and cache its blocks (held while it runs).
        Returns (the monotonic time its prefill ends, the blocks it holds: release_blocks() them at its end)."""
        with self.lock:
            self.prompt_tokens += len(tokens)
            hit, keys = 0, []
            if self.cfg["enable_prefix_caching"]:
                self.prefix_queries += len(tokens)
                hit = self.cache.hit_tokens(tokens)
                self.prefix_hits += hit
                keys = self.cache.hashes(tokens)
                self.cache.hold(keys)
                self.cache.insert(keys)
            rate = self.cfg.get("prefill_tokens_per_s") or 0.0
            now = time.monotonic()
            if rate <= 0:
                return now, keys
            self.prefill_free_at = max(now, self.prefill_free_at) + (len(tokens) - hit) / rate
            return self.prefill_free_at, keys

    def finish_prompt(self, keys: list[str], tokens: list[str]) -> None:
        """A request ended: its blocks are no longer held, and the full blocks of its prompt and what it generated
        stay cached (the next turn re-sends the answer), until evicted."""
        with self.lock:
            self.cache.release(keys)
            if self.cfg["enable_prefix_caching"]:
                self.cache.insert(self.cache.hashes(tokens))

    def kv_usage(self) -> float:
        with self.lock:
            return min(1.0, sum(self.live_tokens.values()) / self.kv_capacity)

    def draft_step(self) -> int:
        """One decode step's accepted drafts (0 without speculative decoding), counted as vLLM counts them.

        Like vLLM's rejection sampler, drafts are accepted in order up to the first rejection; which step
        accepts how many is deterministic (a carried credit), so the accepted share equals the knob.
        """
        n = self.cfg["num_speculative_tokens"]
        if not n:
            return 0
        try:
            rate = min(1.0, max(0.0, float(knobs()["spec_acceptance_rate"])))
        except (TypeError, ValueError):
            rate = 0.0
        with self.lock:
            self.spec_credit += rate * n
            accepted = min(n, int(self.spec_credit + 1e-9))
            self.spec_credit -= accepted
            self.spec_drafts += 1
            self.spec_draft_tokens += n
            self.spec_accepted += accepted
            for pos in range(accepted):
                self.spec_per_pos[pos] += 1
        return accepted

    def metrics_text(self) -> str:
        if self.cfg.get("mode") == "sglang":
            return self.sglang_metrics_text()
        name = self.cfg["served_model_names"][0].replace("\\", "\\\\").replace('"', '\\"')
        lbl = f'engine="0",model_name="{name}"'
        text = Exposition(lbl)
        out, metric, hist = text.out, text.metric, text.hist

        usage = self.kv_usage()
        with self.lock:
            metric("vllm:num_requests_running", "gauge",
                   "Number of requests in model execution batches.", float(self.running))
            metric("vllm:num_requests_waiting", "gauge",
                   "Number of requests waiting to be processed.", float(self.waiting))
            metric("vllm:kv_cache_usage_perc", "gauge",
                   "KV-cache usage. 1 means 100 percent usage.", usage)
            metric("vllm:prefix_cache_queries_total", "counter",
                   "Prefix cache queries, in terms of number of queried tokens.",
                   float(self.prefix_queries))
            metric("vllm:prefix_cache_hits_total", "counter",
                   "Prefix cache hits, in terms of number of cached tokens.",
                   float(self.prefix_hits))
            metric("vllm:prompt_tokens_total", "counter",
                   "Number of prefill tokens processed.", float(self.prompt_tokens))
            metric("vllm:generation_tokens_total", "counter",
                   "Number of generation tokens processed.", float(self.generation_tokens))
            out.append("# HELP vllm:request_success_total Count of successfully processed requests.")
            out.append("# TYPE vllm:request_success_total counter")
            for reason, n in sorted(self.success.items()):
                out.append(f'vllm:request_success_total{{{lbl},finished_reason="{reason}"}} {float(n)}')
            if self.cfg["num_speculative_tokens"]:
                metric("vllm:spec_decode_num_drafts_total", "counter",
                       "Number of spec decoding drafts.", float(self.spec_drafts))
                metric("vllm:spec_decode_num_draft_tokens_total", "counter",
                       "Number of draft tokens.", float(self.spec_draft_tokens))
                metric("vllm:spec_decode_num_accepted_tokens_total", "counter",
                       "Number of accepted tokens.", float(self.spec_accepted))
                out.append("# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total "
                           "Accepted tokens per draft position.")
                out.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter")
                for pos, n in enumerate(self.spec_per_pos):
                    out.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lbl},position="{pos}"}} '
                               f'{float(n)}')
            hist("vllm:time_to_first_token_seconds",
                 "Histogram of time to first token in seconds.", self.ttft)
            hist("vllm:inter_token_latency_seconds",
                 "Histogram of inter-token latency in seconds.", self.itl)
            hist("vllm:e2e_request_latency_seconds",
                 "Histogram of e2e request latency in seconds.", self.e2e)
        return "\n".join(out) + "\n"

    def sglang_metrics_text(self) -> str:
        """SGLang's names (sglang/srt/metrics/collector.py: scheduler gauges, tokenizer counters and histograms)."""
        name = self.cfg["served_model_names"][0].replace("\\", "\\\\").replace('"', '\\"')
        text = Exposition(f'model_name="{name}"')
        usage = self.kv_usage()
        with self.lock:
            text.metric("sglang:num_running_reqs", "gauge", "The number of running requests.", float(self.running))
            text.metric("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.",
                        float(self.waiting))
            text.metric("sglang:num_used_tokens", "gauge", "The number of used tokens.",
                        float(sum(self.live_tokens.values())))
            text.metric("sglang:token_usage", "gauge", "The token usage.", usage)
            text.metric("sglang:gen_throughput", "gauge", "The generation throughput (token/s).",
                        self.running * self.cfg["tokens_per_s"])
            text.metric("sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.",
                        self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0)
            text.metric("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
                        float(self.prompt_tokens))
            text.metric("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.",
                        float(self.generation_tokens))
            text.metric("sglang:num_requests_total", "counter", "Number of requests processed.",
                        float(sum(self.success.values())))
            text.hist("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", self.ttft)
            text.hist("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", self.itl)
            text.hist("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
                      self.e2e)
        return "\n".join(text.out) + "\n"


# --------------------------------------------------------------------------
# requests


class HTTPError(Exception):
    def __init__(self, status: int, body: dict):
        super().__init__(body)
        self.status = status
        self.body = body


def error_body(message: str, err_type: str = "BadRequestError", code: int = 400,
               param: str | None = None) -> dict:
    # vLLM 0.33.0's ErrorResponse: {"error": {message, type, param, code}}
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def prompt_tokens_of(messages: list) -> list[str]:
    tokens: list[str] = []
    for m in messages:
        if not isinstance(m, dict):
            raise HTTPError(400, error_body("messages must be a list of objects"))
        tokens += ["<|im_start|>", str(m.get("role", "user"))]
        content = m.get("content")
        if isinstance(content, list):
            content = " ".join(p.get("text", "") for p in content
                               if isinstance(p, dict) and p.get("type") == "text")
        tokens += str(content or "").split()
        tokens.append("<|im_end|>")
    tokens += ["<|im_start|>", "assistant"]
    return tokens


ANSWER_FAULTS = ("wrong", "tool_text", "cut", "tool_args")
CUT_TOKENS = 2  # a "cut" answer's tokens
# The tool-call format of a model family (config.json's model_type, its text_config's first; the longest prefix
# wins) and the --tool-call-parser names (vLLM's, SGLang's) that read it. A family not here: any parser reads it.
TOOL_FORMATS = {
    "qwen3_5": ("xml", ("qwen3_coder", "qwen3_xml")),  # Qwen3.5: Qwen3-Coder's XML calls
    "qwen3_next": ("xml", ("qwen3_coder", "qwen3_xml")),
    "qwen3": ("hermes", ("hermes", "qwen3_json", "qwen25", "qwen")),  # a Qwen3-Coder (its name says so): xml
    "llama": ("json", ("llama3_json", "pythonic", "llama3")),
    "llama4": ("json", ("llama4_json", "llama4_pythonic", "pythonic", "llama4")),
    "gpt_oss": ("harmony", ("openai", "gpt-oss")),
    "mistral": ("mistral", ("mistral",)),
    "glm4_moe": ("glm", ("glm45", "glm47", "glm", "glm45")),
}
XML_PARSERS = ("qwen3_coder", "qwen3_xml")


def tool_format(config: dict, model: str, parser: str | None) -> tuple[str, bool]:
    """(the model's tool-call format, whether `parser` fails to read it) from its config.json."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    model_type = str(text.get("model_type") or config.get("model_type") or "")
    family = max((f for f in TOOL_FORMATS if model_type.startswith(f)), key=len, default=None)
    if family is None:
        return "hermes", False
    fmt, parsers = TOOL_FORMATS[family]
    if family == "qwen3" and "coder" in model.lower():
        fmt, parsers = "xml", XML_PARSERS
    return fmt, parser is not None and parser not in parsers


def default_value(spec: dict):
    """A value valid for `spec` (the subset of JSON Schema tools use): its const, its enum's first, or its type's."""
    if not isinstance(spec, dict):
        return "sim"
    if "const" in spec:
        return spec["const"]
    if spec.get("enum"):
        return spec["enum"][0]
    t = spec.get("type", "string")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), "string")
    if t in ("integer", "number"):
        low = spec.get("minimum", 0)
        return low if isinstance(low, int | float) else 0
    if t == "array":
        return [default_value(spec.get("items") or {}) for _ in range(int(spec.get("minItems", 0) or 0))]
    if t == "object":
        return fill_arguments({"function": {"parameters": spec}})
    if t == "boolean":
        return False
    if t == "null":
        return None
    return "sim" * max(1, -(-int(spec.get("minLength", 0) or 0) // 3))


def fill_arguments(tool: dict) -> dict:
    """Every required parameter of a tool (or an object schema) at a valid value."""
    params = ((tool.get("function") or {}).get("parameters") or {})
    props = params.get("properties") or {}
    return {name: default_value(props.get(name) or {}) for name in params.get("required") or []}


def bad_arguments(tool: dict, args: dict) -> dict:
    """The tool_args fault: each required value of another type, and a parameter the tool does not have."""
    return {**{k: 0 if isinstance(v, str) else "sim" for k, v in args.items()}, "sim_unexpected": True}


def tool_markup(tools: list[dict], fmt: str) -> str:
    """The calls as the model writes them, before a tool parser reads them (what tool_text returns as content)."""
    out = []
    for tool in tools:
        name = (tool.get("function") or {}).get("name", "tool")
        args = fill_arguments(tool)
        if fmt == "xml":
            params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
            out.append(f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>")
        elif fmt == "harmony":
            out.append(f"to=functions.{name} <|constrain|>json<|message|>{json.dumps(args)}<|call|>")
        elif fmt == "json":
            out.append(json.dumps({"name": name, "parameters": args}))
        elif fmt == "mistral":
            out.append("[TOOL_CALLS]" + json.dumps([{"name": name, "arguments": args}]))
        elif fmt == "glm":
            pairs = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in args.items())
            out.append(f"<tool_call>{name}\n{pairs}</tool_call>")
        else:
            out.append(f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>")
    return "\n".join(out)


def text_of(message) -> str:
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, list):
        content = " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return str(content or "")


def last_text(messages: list, role: str) -> str:
    return next((text_of(m) for m in reversed(messages) if isinstance(m, dict) and m.get("role") == role), "")


def named_tools(tools: list, text: str) -> list[dict]:
    """The tools `text` names, one call a mention in order (at most 8), else the first tool."""
    by_name = {(t.get("function") or {}).get("name"): t for t in tools if isinstance(t, dict)}
    names = [n for n in by_name if isinstance(n, str) and n]
    if not names:
        return tools[:1]
    mentions = re.findall(r"(?<![\w.])(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True))) +
                          r")(?![\w])", text)
    return [by_name[n] for n in mentions[:8]] or tools[:1]


NUMBER_WORDS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten".split())}
_NUMBER = r"(\d+|" + "|".join(NUMBER_WORDS) + r")"


def _count(word: str) -> int:
    return int(word) if word.isdigit() else NUMBER_WORDS[word]


def _arithmetic(a: str, op: str, b: str) -> str | None:
    x, y = float(a), float(b)
    if op in "/" and y == 0:
        return None
    value = {"+": x + y, "-": x - y, "*": x * y, "x": x * y, "\u00d7": x * y, "/": x / y if y else 0}[op]
    return str(int(value)) if float(value).is_integer() else f"{value:.4g}"


def instance_of(schema) -> object:
    """A schema's minimal valid instance (an object's required properties only)."""
    return default_value(schema if isinstance(schema, dict) else {})


def rotate(text: str) -> str:
    """The wrong fault: letters rotated by 13, digits by one (another answer, never the same one)."""
    out = []
    for ch in text:
        if "a" <= ch.lower() <= "z":
            base = ord("a") if ch.islower() else ord("A")
            ch = chr(base + (ord(ch) - base + 13) % 26)
        elif ch.isdigit() and ch.isascii():
            ch = str((int(ch) + 1) % 10)
        out.append(ch)
    return "".join(out)


def wrong_offset(prompt: list[str]) -> int:
    """The wrong fault's shift of the steady stream: from 1 to len(WORDS) - 1, the same for the same prompt."""
    return 1 + int(hashlib.sha256(" ".join(prompt).encode()).hexdigest(), 16) % (len(WORDS) - 1)


def answer_of(messages: list, body: dict, fault: str | None) -> str | None:
    """The short answer the rules in the module's docstring give, or None (the steady stream)."""
    fmt = body.get("response_format") if isinstance(body.get("response_format"), dict) else {}
    if fmt.get("type") == "json_schema":
        return json.dumps(instance_of((fmt.get("json_schema") or {}).get("schema")))
    if fmt.get("type") == "json_object":
        return "{}"
    answer = None
    last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
    if last.get("role") == "tool":
        answer = f"According to the tool, the result is: {text_of(last)}"
    question = last_text(messages, "user")
    low = question.lower()
    every = " ".join(text_of(m) for m in messages if isinstance(m, dict))
    system = " ".join(text_of(m) for m in messages if isinstance(m, dict) and m.get("role") == "system")
    start = re.search(r"start every (?:reply|answer|response) with the word (\w+)", system, re.I)
    end = re.search(r"end every (?:reply|answer|response) with the word (\w+)", system, re.I)
    if answer is None and (m := re.search(r"what is (-?\d+(?:\.\d+)?)\s*([-+*x/\u00d7])\s*(-?\d+(?:\.\d+)?)", low)):
        answer = _arithmetic(*m.groups())
    if answer is None and (m := re.search(r"what is the ([a-z][a-z ]{0,60}?)\?", low)):
        found = re.findall(r"\bthe " + re.escape(m.group(1)) + r" is (\S+)", every, re.I)
        answer = found[-1].rstrip(".,;:!?") if found else None
    if answer is None and (m := re.search(r"reply with only the word (\S+)", question, re.I)):
        answer = m.group(1).strip(".,;:!?\"'")
    if answer is None and (m := re.search(r"exactly " + _NUMBER + r" lines", low)):
        answer = "\n".join(WORDS[i % len(WORDS)].capitalize() for i in range(min(_count(m.group(1)), 50)))
    if answer is None and (m := re.search(r"at most " + _NUMBER + r" words", low)):
        answer = " ".join(WORDS[:max(1, min(_count(m.group(1)) - 1, 8))]) + "."
    if answer is None and (start or end):
        answer = " ".join(WORDS[:6]) + "."
    if answer is None:
        return None
    if start:
        answer = f"{start.group(1)} {answer}"
    if end:
        answer = f"{answer} {end.group(1)}"
    return rotate(answer) if fault == "wrong" else answer


class Plan:
    """What one chat request will produce."""

    def __init__(self, engine: Engine, body: dict):
        cfg = engine.cfg
        if not isinstance(body, dict):
            raise HTTPError(400, error_body("request body must be a JSON object"))
        model = body.get("model")
        if model and model not in cfg["served_model_names"]:
            raise HTTPError(404, error_body(
                f"The model `{model}` does not exist. "
                f"Valid aliases: {', '.join(cfg['served_model_names'])}.",
                "NotFoundError", 404, "model"))
        self.model = cfg["served_model_names"][0] if not model else model
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise HTTPError(400, error_body("messages: Field required", param="messages"))
        self.prompt = prompt_tokens_of(messages)
        tools = body.get("tools") or None
        if tools:  # the chat template renders the tool schemas into the prompt
            self.prompt += json.dumps(tools).split()
        tool_choice = body.get("tool_choice", "auto" if tools else None)
        if tool_choice not in (None, "none") and not tools:
            raise HTTPError(400, error_body("When using `tool_choice`, `tools` must be set.",
                                            param="tool_choice"))
        self.tool = None
        self.calls: list[dict] = []  # the tools called, in order
        if tools and tool_choice not in (None, "none"):
            parser_ready = cfg["tool_call_parser"] is not None
            if tool_choice == "auto":
                if not (cfg["enable_auto_tool_choice"] and parser_ready):
                    raise HTTPError(400, error_body(
                        '"auto" tool choice requires --enable-auto-tool-choice and '
                        "--tool-call-parser to be set"))
                # as a model does: a tool is called, then its result is answered in words (an agent's loop ends)
                messages = body.get("messages") or []
                answered = isinstance(messages[-1], dict) and messages[-1].get("role") == "tool" if messages else False
                self.calls = [] if answered else named_tools(tools, last_text(messages, "user"))
            else:
                if isinstance(tool_choice, dict):
                    wanted = (tool_choice.get("function") or {}).get("name")
                    desc = f'function "{wanted}"'
                    self.tool = next((t for t in tools
                                      if (t.get("function") or {}).get("name") == wanted), None)
                    if self.tool is None:
                        raise HTTPError(400, error_body(
                            f"Tool '{wanted}' has not been passed in `tools`.",
                            param="tool_choice"))
                elif tool_choice == "required":
                    desc = '"required"'
                    self.tool = tools[0]
                else:
                    raise HTTPError(400, error_body(
                        f"Invalid value for `tool_choice`: {tool_choice}! "
                        'Only named tools, "none", "auto" or "required" are supported.',
                        param="tool_choice"))
                if not parser_ready:
                    raise HTTPError(400, error_body(
                        f"tool_choice={desc} requires --tool-call-parser to be set"))
                self.calls = [self.tool]
        self.tool = self.calls[0] if self.calls else None
        fault = knobs().get("answer_fault")
        self.fault = fault if fault in ANSWER_FAULTS else None
        # "auto" goes through the tool parser (a named or "required" choice through structured outputs)
        self.as_text = tool_choice == "auto" and (self.fault in ("tool_text", "cut") or cfg.get("parser_mismatch"))
        self.answer = None if self.calls else answer_of(messages, body, self.fault)
        self.offset = wrong_offset(self.prompt) if self.fault == "wrong" else 0
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        room = cfg["max_model_len"] - len(self.prompt)
        if max_tokens is None:
            max_tokens = min(DEFAULT_MAX_TOKENS, room)
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise HTTPError(400, error_body("max_tokens must be at least 1, got "
                                            f"{max_tokens}.", param="max_tokens"))
        if room <= 0 or max_tokens > room:
            raise HTTPError(400, error_body(
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. "
                f"This model's maximum context length is {cfg['max_model_len']} tokens "
                f"and your request has {len(self.prompt)} input tokens "
                f"({max_tokens} > {cfg['max_model_len']} - {len(self.prompt)}).",
                param="max_tokens"))
        self.max_tokens = max_tokens
        self.engine_cfg = cfg
        kwargs = body.get("chat_template_kwargs") or {}
        thinking = kwargs.get("enable_thinking", kwargs.get("thinking", True))
        self.reasoning_words = (REASONING_TEXT.split()
                                if cfg["reasoning_parser"] and thinking is not False else [])
        stream_opts = body.get("stream_options") or {}
        self.stream = bool(body.get("stream"))
        self.include_usage = bool(stream_opts.get("include_usage"))
        self.id = "chatcmpl-" + uuid.uuid4().hex
        self.created = int(time.time())

    def pieces(self):
        """Yield (kind, text) per generated token (a content token with the space before it); then the finish
        reason."""
        budget = self.max_tokens
        for w in self.reasoning_words[:budget]:
            yield "reasoning", w
        budget -= min(budget, len(self.reasoning_words))
        fmt = self.engine_cfg.get("tool_format", "hermes")
        if self.calls and not self.as_text:
            if budget <= 0:
                return "length"
            for tool in self.calls:
                args = fill_arguments(tool)
                yield "tool", json.dumps(bad_arguments(tool, args) if self.fault == "tool_args" else args)
            return "tool_calls"
        answer = tool_markup(self.calls, fmt) if self.calls else self.answer
        if self.fault == "cut":
            budget = min(budget, CUT_TOKENS)
        if answer is None:  # the steady stream
            for n in range(budget):
                yield "content", (" " if n else "") + WORDS[(n + self.offset) % len(WORDS)]
            return "length"
        tokens = re.findall(r"\s*\S+", answer)
        for token in tokens[:budget]:
            yield "content", token
        return "length" if len(tokens) > budget else "stop"


def tool_call_obj(tool: dict, args: str) -> dict:
    return {"id": "chatcmpl-tool-" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": (tool.get("function") or {}).get("name", "tool"),
                         "arguments": args}}


# --------------------------------------------------------------------------
# pooling models (--runner pooling): embeddings, rerank and score, as vLLM 0.33 serves them

POOLING_ROUTES = {"embed": ("/v1/embeddings", "/pooling", "/score", "/v1/score", "/rerank", "/v1/rerank",
                            "/v2/rerank"),
                  "classify": ("/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank", "/classify")}


def pooling_task(values: dict, config: dict) -> str | None:
    """What vLLM would serve: None (generate), "embed" or "classify" (a sequence classifier: rerank/score)."""
    if values.get("runner") != "pooling":
        return None
    overrides = values.get("hf_overrides") or {}
    if isinstance(overrides, str):  # --hf-overrides takes a JSON object (vLLM: union_dict_and_str)
        try:
            overrides = json.loads(overrides)
        except ValueError:
            raise StartupError("ValueError", f"--hf-overrides is not a JSON object: {overrides[:80]}")
    overrides = overrides if isinstance(overrides, dict) else {}
    archs = overrides.get("architectures") or config.get("architectures") or []
    if values.get("convert") == "classify" or any("ForSequenceClassification" in a for a in archs):
        return "classify"
    return "embed"


def words_of(text) -> list[str]:
    """The stand-in's tokens: lower-case words (token ids count as words)."""
    if isinstance(text, list):
        return [str(t) for t in text]
    return re.findall(r"[a-z0-9]+", str(text).lower())


_WORD_VECTORS: dict = {}


def word_vector(word: str, dims: int) -> list[float]:
    key = (word, dims)
    if key not in _WORD_VECTORS:
        rng = __import__("random").Random(hashlib.sha256(word.encode()).hexdigest())
        _WORD_VECTORS[key] = [rng.gauss(0.0, 1.0) for _ in range(dims)]
    return _WORD_VECTORS[key]


def embed(words: list[str], dims: int) -> list[float]:
    """A deterministic, L2-normalised vector: the sum of each word's fixed random vector (shared words, closer)."""
    total = [0.0] * dims
    for w in words or ["<|endoftext|>"]:
        total = [a + b for a, b in zip(total, word_vector(w, dims))]
    norm = sum(x * x for x in total) ** 0.5 or 1.0
    return [x / norm for x in total]


def relevance(task: str, query: list[str], document: list[str], dims: int) -> float:
    """A classifier's score: the share of the query's words the document holds; an embedder's: cosine."""
    if task == "classify":
        return round(len(set(query) & set(document)) / len(set(query)), 6) if query else 0.0
    return round(sum(a * b for a, b in zip(embed(query, dims), embed(document, dims))), 6)


class Pooling:
    """The pooling endpoints of one engine: each method takes the request body, returns (status, body)."""

    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.dims = int(cfg["hidden_size"])

    def _model(self, body: dict) -> str:
        model = body.get("model")
        if model and model not in self.cfg["served_model_names"]:
            raise HTTPError(404, error_body(f"The model `{model}` does not exist.", "NotFoundError", 404, "model"))
        return model or self.cfg["served_model_names"][0]

    def _tokens(self, text) -> list[str]:
        words = words_of(text)
        if len(words) > self.cfg["max_model_len"]:
            raise HTTPError(400, error_body(
                f"This model's maximum context length is {self.cfg['max_model_len']} tokens. However, you "
                f"requested {len(words)} tokens in the input for embedding generation. Please reduce the "
                "length of the input."))
        return words

    @staticmethod
    def _usage(tokens: int) -> dict:
        return {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
                "prompt_tokens_details": None}

    def embeddings(self, body: dict) -> dict:
        model = self._model(body)
        given = body.get("input")
        if isinstance(given, str) or (isinstance(given, list) and given and isinstance(given[0], int)):
            given = [given]
        if not isinstance(given, list) or not given:
            raise HTTPError(400, error_body("input: Field required", param="input"))
        if body.get("dimensions") not in (None, self.dims):
            raise HTTPError(400, error_body(f"Model \"{model}\" does not support matryoshka representation, "
                                            "changing output dimensions will lead to poor results."))
        fmt = body.get("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            raise HTTPError(400, error_body(f"Unknown encoding_format {fmt!r}", param="encoding_format"))
        data, tokens = [], 0
        for i, text in enumerate(given):
            words = self._tokens(text)
            tokens += len(words)
            vector = embed(words, self.dims)
            if fmt == "base64":
                vector = __import__("base64").b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
            data.append({"index": i, "object": "embedding", "embedding": vector})
        return {"id": "embd-" + uuid.uuid4().hex, "object": "list", "created": int(time.time()), "model": model,
                "data": data, "usage": self._usage(tokens)}

    def _pairs(self, query, documents) -> tuple[list[float], int]:
        q = self._tokens(query)
        scores, tokens = [], 0
        for doc in documents:
            text = doc.get("text", "") if isinstance(doc, dict) else doc
            d = self._tokens(text)
            tokens += len(q) + len(d)
            scores.append(relevance(self.cfg["pooling"], q, d, self.dims))
        return scores, tokens

    def rerank(self, body: dict) -> dict:
        model = self._model(body)
        query, documents = body.get("query"), body.get("documents")
        if query is None or not isinstance(documents, list):
            raise HTTPError(400, error_body("query and documents: Field required", param="documents"))
        scores, tokens = self._pairs(query, documents)
        order = sorted(range(len(documents)), key=lambda i: -scores[i])
        top_n = body.get("top_n") or 0
        results = [{"index": i, "document": {"text": documents[i].get("text") if isinstance(documents[i], dict)
                                             else documents[i], "multi_modal": None},
                    "relevance_score": scores[i]} for i in order[:top_n or None]]
        return {"id": "rerank-" + uuid.uuid4().hex, "model": model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}, "results": results}

    def score(self, body: dict) -> dict:
        model = self._model(body)
        first = next((body[k] for k in ("text_1", "queries", "data_1") if k in body), None)
        second = next((body[k] for k in ("text_2", "documents", "items", "data_2") if k in body), None)
        if first is None or second is None:
            raise HTTPError(400, error_body("queries and documents (or text_1 and text_2): Field required"))
        second = second if isinstance(second, list) else [second]
        if isinstance(first, list) and len(first) != len(second):
            raise HTTPError(400, error_body("The number of queries must be 1 or equal to the number of documents"))
        pairs = zip(first, second) if isinstance(first, list) else ((first, d) for d in second)
        scores, tokens = [], 0
        for query, doc in pairs:
            found, used = self._pairs(query, [doc])
            scores += found
            tokens += used
        return {"id": "score-" + uuid.uuid4().hex, "object": "list", "created": int(time.time()), "model": model,
                "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
                "usage": self._usage(tokens)}

    def classify(self, body: dict) -> dict:
        model = self._model(body)
        given = body.get("input")
        given = [given] if isinstance(given, str) else given or []
        data = []
        for i, text in enumerate(given):
            yes = round(min(1.0, len(set(self._tokens(text))) / 10), 6)
            data.append({"index": i, "label": "yes" if yes >= 0.5 else "no", "probs": [1 - yes, yes],
                         "num_classes": 2})
        return {"id": "classify-" + uuid.uuid4().hex, "object": "list", "created": int(time.time()),
                "model": model, "data": data, "usage": self._usage(sum(len(words_of(t)) for t in given))}

    def handle(self, path: str, body) -> dict:
        if not isinstance(body, dict):
            raise HTTPError(400, error_body("request body must be a JSON object"))
        if path == "/v1/embeddings":
            return self.embeddings(body)
        if path.endswith("/rerank"):
            return self.rerank(body)
        if path.endswith("/score"):
            return self.score(body)
        if path == "/classify":
            return self.classify(body)
        return self.embeddings(body)  # /pooling: the embed task's vectors


# --------------------------------------------------------------------------
# HTTP


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    engine: Engine  # set on the class before serving

    def log_message(self, fmt, *args):  # access log is written by log_request
        pass

    def log_request(self, code="-", size="-"):
        if self.engine.cfg["disable_uvicorn_access_log"]:
            return
        try:
            phrase = self.responses[int(code)][0]
        except (KeyError, ValueError):
            phrase = ""
        host, port = self.client_address[:2]
        print(f'INFO:     {host}:{port} - "{self.requestline}" {code} {phrase}', flush=True)

    # ---- helpers
    def _send(self, status: int, body, ctype="application/json", headers=None):
        data = body if isinstance(body, bytes) else (
            json.dumps(body).encode() if ctype == "application/json" else body.encode())
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _authorised(self) -> bool:
        keys = self.engine.cfg["api_keys"]
        if self.engine.cfg.get("mode") == "sglang":  # SGLang's middleware: every route but /health* and /metrics
            open_ = self.path.startswith("/health") or self.path.startswith("/metrics")
        else:
            open_ = not self.path.startswith("/v1")
        if not keys or open_:
            return True
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        return scheme.lower() == "bearer" and token in keys

    def _read_json(self):
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw or b"null")
        except ValueError as e:
            raise HTTPError(400, error_body(f"JSON decode error: {e}"))

    # ---- verbs
    def do_GET(self):
        wait_while_faulty(("hang",))
        path = self.path.split("?", 1)[0]
        if not self._authorised():
            return self._send(401, {"error": "Unauthorized"})
        cfg = self.engine.cfg
        if path == "/health":
            status = 503 if os.environ.get("SIM_FAIL_HEALTH") == "1" or self.engine.dead else 200
            return self._send(status, b"", "application/json")
        if path == GUARD_READY_PATH and os.environ.get("SIM_GUARD_READY") == "1":
            status = 503 if os.environ.get("SIM_FAIL_HEALTH") == "1" or self.engine.dead else 200
            return self._send(status, {"ready": status == 200, "why": "the stand-in answers for its guard"})
        sglang = cfg.get("mode") == "sglang"
        if sglang and path == "/health_generate":  # SGLang generates one token: a wedged decode hangs here
            wait_while_faulty(FAULTS)
            if os.environ.get("SIM_FAIL_HEALTH") == "1" or self.engine.dead:
                return self._send(503, b"", "application/json")
            with self.engine.lock:
                self.engine.prompt_tokens += 1
                self.engine.generation_tokens += 1
            return self._send(200, b"", "application/json")
        if sglang and path == "/get_model_info":
            return self._send(200, {"model_path": cfg["model"], "tokenizer_path": cfg["model"],
                                    "is_generation": True})
        if path == "/metrics" and (cfg.get("enable_metrics") or not sglang):
            return self._send(200, self.engine.metrics_text(),
                              "text/plain; version=0.0.4; charset=utf-8")
        if path == "/version":
            return self._send(200, {"version": VERSION})
        if path == "/v1/models":
            data = [{"id": n, "object": "model", "created": cfg["started"], "owned_by": cfg.get("mode", "vllm"),
                     "root": cfg["model"], "parent": None,
                     "max_model_len": cfg["max_model_len"],
                     "permission": [{"id": "modelperm-" + uuid.uuid4().hex, "object":
                                     "model_permission", "created": cfg["started"],
                                     "allow_create_engine": False, "allow_sampling": True,
                                     "allow_logprobs": True, "allow_search_indices": False,
                                     "allow_view": True, "allow_fine_tuning": False,
                                     "organization": "*", "group": None,
                                     "is_blocking": False}]}
                    for n in cfg["served_model_names"]]
            return self._send(200, {"object": "list", "data": data})
        return self._send(404, {"detail": "Not Found"})

    do_HEAD = do_GET

    def do_POST(self):
        wait_while_faulty(FAULTS)
        path = self.path.split("?", 1)[0]
        if not self._authorised():
            return self._send(401, {"error": "Unauthorized"})
        if self.engine.dead:
            return self._send(500, error_body("EngineCore encountered an issue. See stack trace (above) for "
                                              "the root cause.", "EngineDeadError", 500))
        task = self.engine.cfg.get("pooling")
        if task and path in POOLING_ROUTES[task]:  # a pooling model serves these, never chat (vLLM: 404)
            try:
                return self._send(200, Pooling(self.engine.cfg).handle(path, self._read_json()))
            except HTTPError as e:
                return self._send(e.status, e.body)
        if path != "/v1/chat/completions" or task:
            return self._send(404, {"detail": "Not Found"})
        try:
            plan = Plan(self.engine, self._read_json())
        except HTTPError as e:
            return self._send(e.status, e.body)
        self._generate(plan)

    # ---- generation
    def _generate(self, plan: Plan) -> None:
        eng = self.engine
        cfg = eng.cfg
        t_arrive = time.monotonic()
        with eng.lock:
            eng.waiting += 1
        eng.slots.acquire()
        with eng.lock:
            eng.waiting -= 1
            eng.running += 1
            eng.live_tokens[plan.id] = len(plan.prompt)
        t_admit = time.monotonic()
        prefilled_at, held = eng.account_prompt(plan.prompt)
        out_tokens: list[str] = []  # what it generated, as the next turn's prompt renders it
        if cfg["enable_log_requests"]:
            log(f"Received request {plan.id}: max_tokens={plan.max_tokens}, "
                f"prompt_tokens={len(plan.prompt)}, stream={plan.stream}")
        generated = 0
        finish = "abort"
        reasoning, content, calls = [], [], []
        try:
            if plan.stream:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream; charset=utf-8")
                self.send_header("cache-control", "no-cache")
                self.send_header("connection", "close")
                self.end_headers()
                self.close_connection = True
                self._chunk(plan, {"role": "assistant", "content": ""}, None)
            # the prefill of what the prefix cache did not hold (queued behind the engine's other prefills), then
            # the set first-token delay; no prefill time: exactly the delay after arriving, as before
            first_at = t_arrive + cfg["first_token_delay_s"] + max(0.0, prefilled_at - t_admit)
            last_emit = None
            steps = step_end = 0  # engine steps so far; tokens generated when the current step ends
            gen = plan.pieces()
            while True:
                try:
                    kind, text = next(gen)
                except StopIteration as stop:
                    finish = stop.value or "length"
                    break
                if generated >= step_end:  # a new step: the target's token and the drafts it accepted
                    step_end = generated + 1 + (eng.draft_step() if generated else 0)
                    steps += 1
                due = first_at + (steps - 1) / cfg["tokens_per_s"]
                now = time.monotonic()
                if due > now:
                    time.sleep(due - now)
                now = time.monotonic()
                if last_emit is None:
                    eng.ttft.observe(now - t_arrive)
                else:
                    eng.itl.observe(now - last_emit)
                last_emit = now
                n_tokens = max(1, len(text.split())) if kind == "tool" else 1
                generated += n_tokens
                out_tokens += text.split()
                with eng.lock:
                    eng.generation_tokens += n_tokens
                    eng.live_tokens[plan.id] += n_tokens
                if kind == "reasoning":
                    reasoning.append(text)
                    delta = {"reasoning": (" " if len(reasoning) > 1 else "") + text}
                elif kind == "content":
                    delta = {"content": text}
                    content.append(text)
                else:
                    call = tool_call_obj(plan.calls[len(calls)], text)
                    delta = {"tool_calls": [dict(call, index=len(calls))]}
                    calls.append(call)
                if plan.stream:
                    self._chunk(plan, delta, None)
            if plan.stream:
                self._chunk(plan, {}, finish)
                if plan.include_usage:
                    self._sse({"id": plan.id, "object": "chat.completion.chunk",
                               "created": plan.created, "model": plan.model, "choices": [],
                               "usage": self._usage(plan, generated)})
                self._sse_raw(b"data: [DONE]\n\n")
            else:
                message = {"role": "assistant", "content": "".join(content) or None,
                           "refusal": None, "annotations": None, "audio": None,
                           "function_call": None, "reasoning": None}
                if reasoning:
                    message["reasoning"] = " ".join(reasoning)
                if calls:
                    message["tool_calls"] = calls
                    message["content"] = None
                body = {"id": plan.id, "object": "chat.completion", "created": plan.created,
                        "model": plan.model,
                        "choices": [{"index": 0, "message": message, "logprobs": None,
                                     "finish_reason": finish, "stop_reason": None}],
                        "service_tier": None, "system_fingerprint": None,
                        "usage": self._usage(plan, generated), "prompt_logprobs": None,
                        "kv_transfer_params": None}
                self._send(200, body)
        except (BrokenPipeError, ConnectionResetError):
            finish = "abort"
        finally:
            eng.finish_prompt(held, plan.prompt + out_tokens)
            with eng.lock:
                eng.running -= 1
                eng.live_tokens.pop(plan.id, None)
                eng.success[finish if finish in ("stop", "length", "abort") else "stop"] += 1
            eng.e2e.observe(time.monotonic() - t_arrive)
            eng.slots.release()

    def _usage(self, plan: Plan, generated: int) -> dict:
        return {"prompt_tokens": len(plan.prompt), "total_tokens": len(plan.prompt) + generated,
                "completion_tokens": generated, "prompt_tokens_details": None}

    def _chunk(self, plan: Plan, delta: dict, finish) -> None:
        self._sse({"id": plan.id, "object": "chat.completion.chunk", "created": plan.created,
                   "model": plan.model,
                   "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                "finish_reason": finish,
                                **({"stop_reason": None} if finish else {})}]})

    def _sse(self, obj: dict) -> None:
        self._sse_raw(b"data: " + json.dumps(obj).encode() + b"\n\n")

    def _sse_raw(self, data: bytes) -> None:
        self.wfile.write(data)
        self.wfile.flush()

    def version_string(self):
        return "uvicorn"


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


# --------------------------------------------------------------------------
# main


def build_config(model: str, v: dict, table: dict) -> dict:
    names = v.get("served_model_name") or [model]
    if isinstance(names, str):
        names = [names]
    api_keys = v.get("api_key") or ([os.environ["VLLM_API_KEY"]]
                                     if os.environ.get("VLLM_API_KEY") else [])
    if isinstance(api_keys, str):
        api_keys = [api_keys]
    gmu = v.get("gpu_memory_utilization", 0.92)
    if not (0 < gmu <= 1):
        raise StartupError("ValueError", "GPU memory utilization must be within (0, 1]. "
                                         f"Got {gmu}.")
    max_num_seqs = v.get("max_num_seqs") or 1024
    if max_num_seqs < 1:
        raise StartupError("ValueError", f"max_num_seqs ({max_num_seqs}) must be at least 1.")
    if v.get("enable_auto_tool_choice") and not v.get("tool_call_parser"):
        raise StartupError("TypeError",
                           "Error: --enable-auto-tool-choice requires --tool-call-parser")
    if v.get("enable_log_outputs") and not v.get("enable_log_requests"):
        raise StartupError("TypeError",
                           "Error: --enable-log-outputs requires --enable-log-requests")
    flags = table["flags"]
    tcp = v.get("tool_call_parser")
    known = flags.get("--tool-call-parser", {}).get("known_values")
    if v.get("enable_auto_tool_choice") and known and tcp not in known:
        raise StartupError("KeyError", f"'invalid tool call parser: {tcp} "
                                       f"(chose from {{ {','.join(known)} }})'")
    rp = v.get("reasoning_parser") or ""
    if rp.lower() == "none":
        rp = ""
    known = flags.get("--reasoning-parser", {}).get("known_values")
    if rp and known and rp not in known:
        raise StartupError("KeyError", f"'invalid reasoning parser: {rp} "
                                       f"(chose from {{ {','.join(known)} }})'")
    ab = v.get("attention_backend")
    known = flags.get("--attention-backend", {}).get("known_values")
    if ab and known and ab.lower() != "auto" and ab.upper() not in known:
        raise StartupError("ValueError", f"Unknown attention backend: '{ab.upper()}'. "
                                         f"Valid options are: "
                                         f"{', '.join(k for k in known if k != 'auto')}")
    lmm = v.get("limit_mm_per_prompt")
    if lmm is not None and not isinstance(lmm, dict):
        raise UsageError("argument --limit-mm-per-prompt: expected a JSON object")
    try:
        rate = float(os.environ.get("SIM_TOKENS_PER_S", "50"))
        first_ms = float(os.environ.get("SIM_FIRST_TOKEN_DELAY_MS", "0"))
        prefill = float(os.environ.get("SIM_PREFILL_TOKENS_PER_S", str(DEFAULT_PREFILL_TOKENS_PER_S)))
        host_gb = float(os.environ.get("SIM_HOST_MEMORY_GB", str(SPARK_MEMORY_GB)))
    except ValueError as e:
        raise StartupError("ValueError", f"bad SIM_* setting: {e}")
    port = v.get("port", 8000)
    if not (0 <= port <= 65535):
        raise StartupError("OverflowError", "bind(): port must be 0-65535.")
    return {
        "model": model,
        "served_model_names": names,
        "host": v.get("host") or "0.0.0.0",
        "port": port,
        "api_keys": api_keys,
        "max_model_len_arg": v.get("max_model_len"),
        "gpu_memory_utilization": gmu,
        "max_num_seqs": max_num_seqs,
        "enable_auto_tool_choice": bool(v.get("enable_auto_tool_choice")),
        "tool_call_parser": tcp,
        "reasoning_parser": rp or None,
        "enable_prefix_caching": v.get("enable_prefix_caching") is not False,
        "enable_log_requests": bool(v.get("enable_log_requests")),
        "disable_uvicorn_access_log": bool(v.get("disable_uvicorn_access_log")),
        "limit_mm_per_prompt": lmm or {},
        "tokens_per_s": rate if rate > 0 else 50.0,
        "first_token_delay_s": max(0.0, first_ms / 1000.0),
        "prefill_tokens_per_s": max(0.0, prefill),
        "host_memory_gb": host_gb if host_gb > 0 else SPARK_MEMORY_GB,
        "block_size": v.get("block_size") or BLOCK_TOKENS,
        "num_gpu_blocks_override": v.get("num_gpu_blocks_override"),
        "kv_cache_memory_bytes": v.get("kv_cache_memory_bytes"),
        "kv_cache_dtype": v.get("kv_cache_dtype"),
        "started": int(time.time()),
        "runner_values": {k: v.get(k) for k in ("runner", "convert", "hf_overrides")},
        "num_speculative_tokens": speculative_tokens(v.get("speculative_config")),
        # GPUs (= nodes) to get from Ray; None: no Ray (vLLM's default executor on one GPU)
        "ray_size": (1 if v.get("tensor_parallel_size") is None else v["tensor_parallel_size"])
        if v.get("distributed_executor_backend") == "ray" else None,
    }


# vLLM's MTP method names (vllm/config/speculative.py MTPModelTypes): all but "mtp" are deprecated aliases.
MTP_METHODS = ("mtp", "qwen3_5_mtp", "qwen3_next_mtp", "deepseek_mtp", "glm4_moe_mtp", "ernie_mtp")


def speculative_tokens(spec) -> int:
    """Draft tokens per step from --speculative-config; 0 without it. The stand-in drafts with MTP only."""
    if spec is None:
        return 0
    if not isinstance(spec, dict):
        raise UsageError("argument --speculative-config: expected a JSON object")
    method, n = spec.get("method"), spec.get("num_speculative_tokens")
    if method not in MTP_METHODS or spec.get("model"):
        raise StartupError("NotImplementedError", f"Unsupported speculative method: '{method}' "
                                                  "(the stand-in simulates the model's own MTP layers only)")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise StartupError("ValueError", "num_speculative_tokens must be a positive integer with method "
                                         f"'{method}', got {n!r}")
    return n


def join_ray(size: int, start: dict):
    """vLLM's Ray executor start: wait for `size` GPUs on as many nodes (standin_ray.py), or StartupError."""
    if size < 1:
        raise StartupError("ValueError", f"tensor_parallel_size ({size}) must be at least 1")
    try:
        wait_s, check_s = float(start["ray_wait_s"]), float(os.environ.get("SIM_RAY_CHECK_S", "3"))
    except (TypeError, ValueError) as e:
        raise StartupError("ValueError", f"bad ray_wait_s knob or SIM_RAY_CHECK_S: {e}")
    import standin_ray

    log(f"Initializing a V1 LLM engine (v{VERSION}) with config: distributed_executor_backend=ray, "
        f"tensor_parallel_size={size}")
    cluster = standin_ray.RayCluster(size, log, wait_s, check_s)
    t0 = time.monotonic()
    try:
        cluster.start()
    except standin_ray.RayStartupError as e:
        raise StartupError(*e.args) from None
    log(f"Ray gave {size} GPU worker(s) in {time.monotonic() - t0:.1f} seconds")
    return cluster


def sglang_config_args(argv: list[str]) -> list[str]:
    """SGLang's --config FILE (YAML of `key: value` lines) as flags placed before the command line's, which win;
    lists and nested YAML are beyond the stand-in (refused)."""
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--config" or arg.startswith("--config="):
            path = arg.partition("=")[2] if "=" in arg else (argv[i + 1] if i + 1 < len(argv) else None)
            i += 1 if "=" in arg else 2
            if path is None:
                raise UsageError("argument --config: expected one argument", prog="launch_server.py")
            try:
                lines = Path(path).read_text().splitlines()
            except OSError as e:
                raise StartupError("FileNotFoundError", f"Config file not found: {path} ({e.strerror})")
            config = []
            for line in lines:
                line = line.split(" #", 1)[0].rstrip()
                if not line.strip() or line.lstrip().startswith("#"):
                    continue
                key, sep, value = line.partition(":")
                if not sep or line[:1].isspace() or value.strip() in ("", "|", ">"):
                    raise StartupError("ValueError", f"{path}: the stand-in reads flat `key: value` YAML only")
                value = value.strip().strip("'\"")
                flag = "--" + key.strip().replace("_", "-")
                config += [flag] if value.lower() == "true" else [] if value.lower() == "false" else [flag, value]
            out = config + out
            continue
        out.append(arg)
        i += 1
    return out


def sglang_values(argv: list[str], table: dict) -> tuple[str, dict]:
    """Parse like `python3 -m sglang.launch_server` and say it in the vLLM stand-in's dests (one engine)."""
    model, v = parse_serve_args(sglang_config_args(argv) if "--config" in table["flags"] else argv, table)
    if model is not None:
        raise UsageError(f"unrecognized arguments: {model}", prog="launch_server.py")
    if not v.get("model_path"):
        raise UsageError("the following arguments are required: --model-path/--model", prog="launch_server.py")
    tp = v.get("tp_size") or 1
    if tp != 1:
        raise StartupError("ValueError", f"tp_size {tp}: the stand-in SGLang serves on one GPU (--tp 1)")
    name, ctx = v.get("served_model_name"), v.get("context_length")
    try:  # SGLang's table gives --context-length no type (a str until ServerArgs reads it)
        ctx = None if ctx is None else int(ctx)
    except ValueError:
        raise UsageError(f"argument --context-length: invalid int value: {ctx!r}", prog="launch_server.py")
    return v["model_path"], {
        "served_model_name": [name] if name else None, "api_key": v.get("api_key"),
        "host": v.get("host") or "127.0.0.1", "port": v.get("port", 30000),
        "max_model_len": ctx, "max_num_seqs": v.get("max_running_requests"),
        "gpu_memory_utilization": v.get("mem_fraction_static") or 0.88,
        "tool_call_parser": v.get("tool_call_parser"), "enable_auto_tool_choice": bool(v.get("tool_call_parser")),
        "reasoning_parser": v.get("reasoning_parser"), "enable_prefix_caching": not v.get("disable_radix_cache"),
        "enable_log_requests": bool(v.get("log_requests")), "enable_metrics": bool(v.get("enable_metrics")),
    }


def _on_sigterm(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    flags_file = None
    mode = "vllm"
    if argv[:2] == ["--mode", "sglang"]:
        mode, argv = "sglang", argv[2:]
    while argv and (argv[0] == "--flags-file" or argv[0].startswith("--flags-file=")):
        if "=" in argv[0]:
            flags_file = argv.pop(0).split("=", 1)[1]
        else:
            argv.pop(0)
            if not argv:
                print("standin_vllm: --flags-file needs a path", file=sys.stderr)
                return 2
            flags_file = argv.pop(0)
    if argv[:1] == ["serve"]:  # tolerate `... serve MODEL` as vllm's CLI would see it
        argv = argv[1:]
    table = load_table(Path(flags_file) if flags_file else default_flags_file())
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        if any(a in ("-h", "--help") or a.startswith("--help=") for a in argv):
            print("usage: vllm serve [model_tag] [options]\n\n"
                  f"(stand-in for vLLM {table.get('version')}; "
                  f"{len(table['flags'])} option strings accepted)")
            return 0
        if any(a in ("-v", "--version") for a in argv):
            print(table.get("version", VERSION))
            return 0
        try:
            if mode == "sglang":
                model, values = sglang_values(argv, table)
            else:
                model, values = parse_serve_args(argv, table)
            if values.get("model") and model is None:
                model = values["model"]
            if model is None:
                raise StartupError("ValueError", "model must be given as the first "
                                                 "positional argument")
            cfg = build_config(model, values, table)
            cfg["mode"], cfg["enable_metrics"] = mode, bool(values.get("enable_metrics"))
        except UsageError as e:
            if mode == "sglang":
                e.prog = "launch_server.py"
            usage_exit(e)
        except StartupError as e:
            die_startup(e)

        log(f"vLLM API server version {VERSION}")
        log(f"Starting vLLM API server (sparkfleet stand-in) version {VERSION}, "
            f"serving model {model}")
        log(f"non-default args: {json.dumps({k: v for k, v in sorted(values.items())})}")
        log(f"argv: {' '.join(argv)}")
        try:
            t0 = time.monotonic()
            info = load_model_dir(model)
            max_pos = info["max_position_embeddings"]
            want = cfg["max_model_len_arg"]
            derived = int(max_pos) if isinstance(max_pos, int) else 2048
            if want is None or want == -1:
                max_len = derived
            elif want > derived:
                raise StartupError("ValueError", (
                    f"User-specified max_model_len ({want}) is greater than the derived "
                    f"max_model_len (max_position_embeddings={derived} or "
                    f"model_max_length=None in model's config.json). To allow overriding "
                    f"this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."))
            else:
                max_len = want
            if max_len < 1:
                raise StartupError("ValueError", f"max_model_len ({max_len}) must be positive")
            cfg["max_model_len"] = max_len
            config = info["config"]
            if cfg["num_speculative_tokens"] and not (config.get("text_config") or config).get(
                    "mtp_num_hidden_layers"):
                raise StartupError("ValueError", "speculative method 'mtp' needs the model's MTP layers, "
                                                 "and config.json has no mtp_num_hidden_layers")
            cfg["pooling"] = pooling_task(cfg["runner_values"], config)
            cfg["tool_format"], cfg["parser_mismatch"] = tool_format(
                config, " ".join([model, *cfg["served_model_names"]]), cfg["tool_call_parser"])
            if cfg["parser_mismatch"] and cfg["enable_auto_tool_choice"]:
                log(f"--tool-call-parser {cfg['tool_call_parser']} does not read this model's tool calls "
                    f"({cfg['tool_format']} format): they reach the client as text", "WARNING")
            cfg["hidden_size"] = (config.get("text_config") or config).get("hidden_size", 1024)
            cfg["kv_cache_blocks"] = kv_cache_blocks(cfg, config, info["weights_bytes"])
            log(f"GPU KV cache size: {cfg['kv_cache_blocks'] * cfg['block_size']:,} tokens "
                f"({cfg['kv_cache_blocks']:,} blocks of {cfg['block_size']}; prefill "
                f"{cfg['prefill_tokens_per_s']:g} tokens/s)")
            if cfg["pooling"]:
                log(f"Pooling model: task {cfg['pooling']}, {cfg['hidden_size']} dimensions")
            log(f"Using max model len {max_len}")
            start = knobs()
            cluster = None if cfg["ray_size"] is None else join_ray(cfg["ray_size"], start)
            try:
                delay = float(start["load_delay_s"])
            except (TypeError, ValueError) as e:
                raise StartupError("ValueError", f"bad load_delay_s knob: {e}")
            # vLLM's start, line for line where the journal shows it (the controller's progress reads them):
            # the shards over most of the delay, then the CUDA graphs (none with --enforce-eager)
            log(f"Starting to load model {model}...")
            log(f"{len(info['shards'])} safetensors shards, {info['tensors']} tensors")
            eager = bool(values.get("enforce_eager"))
            load_s = max(delay, 0) * (1 if eager else 0.8)
            progress_bar("Loading safetensors checkpoint shards", max(len(info["shards"]), 1), load_s, True)
            if start["crash_on_start"]:
                raise StartupError("RuntimeError", "CUDA error: an illegal memory access was "
                                                   "encountered (sim knob crash_on_start)")
            log(f"Loading weights took {time.monotonic() - t0:.2f} seconds")
            if not eager:
                t1 = time.monotonic()
                progress_bar("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)", 67, max(delay, 0) * 0.15,
                             False)
                progress_bar("Capturing CUDA graphs (decode, FULL)", 35, max(delay, 0) * 0.05, False)
                log(f"Graph capturing finished in {time.monotonic() - t1:.0f} secs, took 0.00 GiB")
        except StartupError as e:
            log(f"EngineCore failed to start: {e.args[1]}", "ERROR")
            die_startup(e)

        engine = Engine(cfg)
        if cluster:
            cluster.watch(engine.die)
        handler = type("BoundHandler", (Handler,), {"engine": engine})
        try:
            server = Server((cfg["host"], cfg["port"]), handler)
        except OSError as e:
            print(f"OSError: [Errno {e.errno}] error while attempting to bind on address "
                  f"({cfg['host']!r}, {cfg['port']}): {e.strerror}", file=sys.stderr, flush=True)
            return 1
        shown = "0.0.0.0" if cfg["host"] in ("", "0.0.0.0") else cfg["host"]
        log(f"Starting vLLM API server 0 on http://{shown}:{server.server_address[1]}")
        log(f"Starting vLLM server on http://{shown}:{server.server_address[1]}")
        log("Available routes are:")
        served = POOLING_ROUTES[cfg["pooling"]] if cfg["pooling"] else ("/v1/chat/completions",)
        for route, methods in (("/health", "GET"), ("/metrics", "GET"), ("/version", "GET"),
                               ("/v1/models", "GET"), *((r, "POST") for r in served)):
            log(f"Route: {route}, Methods: {methods}")
        print("INFO:     Started server process [%d]" % os.getpid(), flush=True)
        print("INFO:     Waiting for application startup.", flush=True)
        print("INFO:     Application startup complete.", flush=True)
        if mode == "sglang":
            print("The server is fired up and ready to roll!", flush=True)
        try:
            server.serve_forever(poll_interval=0.2)
        finally:
            print("INFO:     Shutting down", flush=True)
            server.server_close()
            print(f"INFO:     Finished server process [{os.getpid()}]", flush=True)
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
