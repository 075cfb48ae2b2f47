#!/usr/bin/env python3
"""Stand-in for `vllm serve` (vLLM 0.33.0) in the simulated fleet.

Standard library only: it runs in a minimal image that has nothing but
python3. It accepts exactly the flags in vLLM's flag table (a JSON file made
from vLLM's own parser), loads the model directory the way vLLM would before
serving (config.json, every safetensors shard's header and size), then serves
the OpenAI-compatible endpoints vLLM serves, generating deterministic tokens
at a set rate.

    python3 standin_vllm.py [--flags-file PATH] MODEL_DIR [vllm serve flags...]

Environment:
    SIM_LOAD_DELAY_S          seconds "loading" before the port is bound (2)
    SIM_TOKENS_PER_S          decode rate (50)
    SIM_FIRST_TOKEN_DELAY_MS  extra delay before the first token (0)
    SIM_FAIL_HEALTH=1         /health answers 503
    SIM_CRASH_ON_START=1      exit 1 after "loading" (a crash on every start)
    SIM_KNOB_FILE             fault knob file (/etc/sparkfleet-sim/engine.json)
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
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

VERSION = "0.33.0"
DEFAULT_MAX_TOKENS = 64
BLOCK_TOKENS = 16
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


DEFAULT_KNOB_FILE = "/etc/sparkfleet-sim/engine.json"
FAULTS = ("hang", "generation-hang")


def knobs() -> dict:
    """The fault knobs now: SIM_* variables, overridden by the knob file (read every call)."""
    values = {"crash_on_start": os.environ.get("SIM_CRASH_ON_START") == "1",
              "load_delay_s": os.environ.get("SIM_LOAD_DELAY_S", "2"), "fault": None}
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

    def __init__(self, message: str, prog: str = "vllm serve"):
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
    """Returns {"max_position_embeddings": int|None, "shards": [...], "tensors": n}."""
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
            "config": config}


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


class Engine:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.lock = threading.Lock()
        self.slots = threading.Semaphore(cfg["max_num_seqs"])
        self.running = 0
        self.waiting = 0
        self.live_tokens: dict[str, int] = {}
        self.prefix_blocks: set[str] = set()
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success: dict[str, int] = {"stop": 0, "length": 0, "abort": 0}
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.kv_capacity = max(1, cfg["max_num_seqs"] * cfg["max_model_len"] // 4)

    def account_prompt(self, tokens: list[str]) -> None:
        with self.lock:
            self.prompt_tokens += len(tokens)
            if not self.cfg["enable_prefix_caching"]:
                return
            self.prefix_queries += len(tokens)
            h = hashlib.sha256()
            hit = True
            for start in range(0, len(tokens) - len(tokens) % BLOCK_TOKENS, BLOCK_TOKENS):
                h.update("\x00".join(tokens[start:start + BLOCK_TOKENS]).encode() + b"\x01")
                key = h.hexdigest()
                if hit and key in self.prefix_blocks:
                    self.prefix_hits += BLOCK_TOKENS
                else:
                    hit = False
                    self.prefix_blocks.add(key)

    def kv_usage(self) -> float:
        with self.lock:
            return min(1.0, sum(self.live_tokens.values()) / self.kv_capacity)

    def metrics_text(self) -> str:
        name = self.cfg["served_model_names"][0].replace("\\", "\\\\").replace('"', '\\"')
        lbl = f'engine="0",model_name="{name}"'
        out: list[str] = []

        def metric(mname, mtype, help_, value, extra=""):
            out.append(f"# HELP {mname} {help_}")
            out.append(f"# TYPE {mname} {mtype}")
            out.append(f"{mname}{{{lbl}{extra}}} {value}")

        def hist(mname, help_, h: Histogram):
            out.append(f"# HELP {mname} {help_}")
            out.append(f"# TYPE {mname} histogram")
            for b, c in zip(h.buckets, h.counts):
                out.append(f'{mname}_bucket{{{lbl},le="{float(b)}"}} {float(c)}')
            out.append(f'{mname}_bucket{{{lbl},le="+Inf"}} {float(h.count)}')
            out.append(f"{mname}_count{{{lbl}}} {float(h.count)}")
            out.append(f"{mname}_sum{{{lbl}}} {h.sum}")

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
            hist("vllm:time_to_first_token_seconds",
                 "Histogram of time to first token in seconds.", self.ttft)
            hist("vllm:inter_token_latency_seconds",
                 "Histogram of inter-token latency in seconds.", self.itl)
            hist("vllm:e2e_request_latency_seconds",
                 "Histogram of e2e request latency in seconds.", self.e2e)
        return "\n".join(out) + "\n"


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


def fill_arguments(tool: dict) -> dict:
    params = ((tool.get("function") or {}).get("parameters") or {})
    props = params.get("properties") or {}
    args = {}
    defaults = {"string": "sim", "integer": 0, "number": 0, "boolean": False,
                "array": [], "object": {}}
    for name in params.get("required") or []:
        t = (props.get(name) or {}).get("type", "string")
        if isinstance(t, list):
            t = next((x for x in t if x != "null"), "string")
        args[name] = defaults.get(t, "sim")
    return args


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
        if tools and tool_choice not in (None, "none"):
            parser_ready = cfg["tool_call_parser"] is not None
            if tool_choice == "auto":
                if not (cfg["enable_auto_tool_choice"] and parser_ready):
                    raise HTTPError(400, error_body(
                        '"auto" tool choice requires --enable-auto-tool-choice and '
                        "--tool-call-parser to be set"))
                self.tool = tools[0]
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
        """Yield (kind, text) per generated token; then the finish reason."""
        budget = self.max_tokens
        for w in self.reasoning_words[:budget]:
            yield "reasoning", w
        budget -= min(budget, len(self.reasoning_words))
        if self.tool is not None:
            if budget <= 0:
                return "length"
            args = json.dumps(fill_arguments(self.tool))
            yield "tool", args
            return "tool_calls"
        for n in range(budget):
            yield "content", WORDS[n % len(WORDS)]
        return "length"


def tool_call_obj(tool: dict, args: str) -> dict:
    return {"id": "chatcmpl-tool-" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": (tool.get("function") or {}).get("name", "tool"),
                         "arguments": args}}


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
        if not keys or not self.path.startswith("/v1"):
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
            status = 503 if os.environ.get("SIM_FAIL_HEALTH") == "1" else 200
            return self._send(status, b"", "application/json")
        if path == "/metrics":
            return self._send(200, self.engine.metrics_text(),
                              "text/plain; version=0.0.4; charset=utf-8")
        if path == "/version":
            return self._send(200, {"version": VERSION})
        if path == "/v1/models":
            data = [{"id": n, "object": "model", "created": cfg["started"], "owned_by": "vllm",
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
        if path != "/v1/chat/completions":
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
        eng.account_prompt(plan.prompt)
        if cfg["enable_log_requests"]:
            log(f"Received request {plan.id}: max_tokens={plan.max_tokens}, "
                f"prompt_tokens={len(plan.prompt)}, stream={plan.stream}")
        generated = 0
        finish = "abort"
        reasoning, content, tool_args = [], [], None
        try:
            if plan.stream:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream; charset=utf-8")
                self.send_header("cache-control", "no-cache")
                self.send_header("connection", "close")
                self.end_headers()
                self.close_connection = True
                self._chunk(plan, {"role": "assistant", "content": ""}, None)
            first_at = t_arrive + cfg["first_token_delay_s"]
            last_emit = None
            gen = plan.pieces()
            while True:
                try:
                    kind, text = next(gen)
                except StopIteration as stop:
                    finish = stop.value or "length"
                    break
                due = first_at + generated / cfg["tokens_per_s"]
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
                with eng.lock:
                    eng.generation_tokens += n_tokens
                    eng.live_tokens[plan.id] += n_tokens
                if kind == "reasoning":
                    reasoning.append(text)
                    delta = {"reasoning": (" " if len(reasoning) > 1 else "") + text}
                elif kind == "content":
                    delta = {"content": (" " if content else "") + text}
                    content.append(text)
                else:
                    tool_args = text
                    call = tool_call_obj(plan.tool, text)
                    delta = {"tool_calls": [dict(call, index=0)]}
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
                message = {"role": "assistant", "content": " ".join(content) or None,
                           "refusal": None, "annotations": None, "audio": None,
                           "function_call": None, "reasoning": None}
                if reasoning:
                    message["reasoning"] = " ".join(reasoning)
                if tool_args is not None:
                    message["tool_calls"] = [tool_call_obj(plan.tool, tool_args)]
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
        "started": int(time.time()),
    }


def _on_sigterm(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    flags_file = None
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
            model, values = parse_serve_args(argv, table)
            if values.get("model") and model is None:
                model = values["model"]
            if model is None:
                raise StartupError("ValueError", "model must be given as the first "
                                                 "positional argument")
            cfg = build_config(model, values, table)
        except UsageError as e:
            usage_exit(e)
        except StartupError as e:
            die_startup(e)

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
            log(f"Using max model len {max_len}")
            start = knobs()
            try:
                delay = float(start["load_delay_s"])
            except (TypeError, ValueError) as e:
                raise StartupError("ValueError", f"bad load_delay_s knob: {e}")
            log(f"Loading safetensors checkpoint shards: {len(info['shards'])} files, "
                f"{info['tensors']} tensors")
            if delay > 0:
                time.sleep(delay)
            if start["crash_on_start"]:
                raise StartupError("RuntimeError", "CUDA error: an illegal memory access was "
                                                   "encountered (sim knob crash_on_start)")
            log(f"Loading weights took {time.monotonic() - t0:.2f} seconds")
        except StartupError as e:
            log(f"EngineCore failed to start: {e.args[1]}", "ERROR")
            die_startup(e)

        engine = Engine(cfg)
        handler = type("BoundHandler", (Handler,), {"engine": engine})
        try:
            server = Server((cfg["host"], cfg["port"]), handler)
        except OSError as e:
            print(f"OSError: [Errno {e.errno}] error while attempting to bind on address "
                  f"({cfg['host']!r}, {cfg['port']}): {e.strerror}", file=sys.stderr, flush=True)
            return 1
        shown = "0.0.0.0" if cfg["host"] in ("", "0.0.0.0") else cfg["host"]
        log(f"Starting vLLM server on http://{shown}:{server.server_address[1]}")
        log("Available routes are:")
        for route, methods in (("/health", "GET"), ("/metrics", "GET"), ("/version", "GET"),
                               ("/v1/models", "GET"), ("/v1/chat/completions", "POST")):
            log(f"Route: {route}, Methods: {methods}")
        print("INFO:     Started server process [%d]" % os.getpid(), flush=True)
        print("INFO:     Waiting for application startup.", flush=True)
        print("INFO:     Application startup complete.", flush=True)
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
