"""How a probe of contract/serving.py is asked and its answer judged, read from the serving file the converge
writes (`read_serving`, checked, never a fallback). The health gate, the watchdog, the on-demand proxy's wait and
the pre-start check ask through `ask`; the controller's `status` judges with `answer_problem` and `probe_body`.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path


class ServingFileError(ValueError):
    """The serving file is missing or malformed: the message names it and the fix, in one line."""


def _probe_problem(name, probe) -> str | None:
    if not isinstance(probe, dict) or not isinstance(probe.get("what"), str):
        return f"probe {name!r} is not an object naming `what` it asks"
    if probe.get("method") not in ("GET", "POST") or not str(probe.get("path", "")).startswith("/"):
        return f"probe {name!r} has no GET or POST method and /path"
    if probe.get("answer") not in ANSWERS:
        return f"probe {name!r} names no known answer rule ({', '.join(ANSWERS)})"
    if any(type(probe.get(k)) not in (int, float) or probe[k] <= 0 for k in ("timeout_s", "gate_timeout_s")):
        return f"probe {name!r} lacks a positive timeout_s and gate_timeout_s"
    if probe["method"] == "POST" and not isinstance(probe.get("body"), dict):
        return f"probe {name!r} is a POST without a body object"
    return None


def read_serving(path, keys=(), probes=("health",)) -> dict:
    """The serving file the converge wrote (contract/serving.py), checked: `keys` and `probes` present, every
    probe well formed; else ServingFileError. Never a fallback: a helper without it copies no default, it stops."""
    fix = "run a converge, which writes it"
    try:
        value = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ServingFileError(f"serving file {path}: cannot read it ({exc.strerror or exc}): {fix}") from None
    except ValueError as exc:
        raise ServingFileError(f"serving file {path} is not JSON ({exc}): {fix}") from None
    if not isinstance(value, dict) or not isinstance(value.get("probes"), dict):
        raise ServingFileError(f"serving file {path} holds no \"probes\" object: {fix}")
    missing = [k for k in keys if k not in value] + [f"probes.{p}" for p in probes if p not in value["probes"]]
    if missing:
        raise ServingFileError(f"serving file {path} lacks {', '.join(missing)}: {fix}")
    for name, probe in value["probes"].items():
        problem = _probe_problem(name, probe)
        if problem:
            raise ServingFileError(f"serving file {path}: {problem}: {fix}")
    return value


def http_json(url, timeout, body=None, key=None):
    """(status, parsed JSON or None), or (None, why) when nothing answered in time. A body makes it a POST."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=timeout) as r:
            raw = r.read(1 << 20)
            status = r.status
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (OSError, ValueError) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    try:
        return status, json.loads(raw) if raw.strip() else None
    except ValueError:
        return status, None


def _completion(reply, probe, served_name):
    usage = reply.get("usage") or {}
    if not reply.get("choices") or not isinstance(usage.get("completion_tokens"), int) \
            or usage["completion_tokens"] < 1:
        return f"no choice or no completion tokens: {str(reply)[:200]}"
    return None


def _embeddings(reply, probe, served_name):
    data = reply.get("data") if isinstance(reply.get("data"), list) else []
    sizes = {len(item.get("embedding") or ()) for item in data if isinstance(item, dict)}
    if len(data) != len(probe["body"]["input"]) or len(sizes) != 1 or 0 in sizes \
            or not (reply.get("usage") or {}).get("prompt_tokens"):
        return f"{len(data)} vectors of sizes {sorted(sizes)} for {len(probe['body']['input'])} texts"
    return None


def _rerank(reply, probe, served_name):
    results = reply.get("results") if isinstance(reply.get("results"), list) else []
    indexes = sorted(r.get("index", -1) for r in results if isinstance(r, dict))
    if indexes != list(range(len(probe["body"]["documents"]))) or not all(
            type(r.get("relevance_score")) in (int, float) for r in results):
        return f"no score per document: {str(reply)[:200]}"
    return None


def _models(reply, probe, served_name):
    listed = [m.get("id") for m in reply.get("data") or () if isinstance(m, dict)]
    return None if served_name in listed else f"lists {listed}, not {served_name!r}"


def _tool_call(reply, probe, served_name):
    calls = (((reply.get("choices") or [{}])[0] or {}).get("message") or {}).get("tool_calls") or []
    name = ((calls[0] or {}).get("function") or {}).get("name") if calls else None
    return None if name == probe["tool"] else f"no parsed call of {probe['tool']}: {str(reply)[:200]}"


# What counts as an answer, by the rule a probe names (beyond HTTP 200): reply -> None, or why not.
ANSWERS = {"status": None, "models": _models, "completion": _completion, "embeddings": _embeddings,
           "rerank": _rerank, "tool_call": _tool_call}


def answer_problem(probe: dict, status, reply, served_name: str = "") -> str | None:
    """Why an answer to `probe` does not count (None when it does): not HTTP 200, or its rule's reason.
    `status` None means nothing answered and `reply` says why."""
    if status is None:
        return str(reply)
    if status != 200:
        return f"HTTP {status}"
    rule = ANSWERS[probe["answer"]]
    if rule is None:
        return None
    if not isinstance(reply, dict):
        return "the answer is not a JSON object"
    return rule(reply, probe, served_name)


def probe_body(probe: dict, served_name: str) -> dict | None:
    """What a probe sends: its body naming the served model (None for a GET)."""
    return {"model": served_name, **probe["body"]} if probe["method"] == "POST" else None


def timed_out(why) -> bool:
    """Whether `ask`'s why says the engine took the request but did not answer in time (urllib's timeout, on
    connecting or reading): the watchdog then asks whether a busy engine's work moves (issue 54)."""
    return isinstance(why, str) and (why.startswith("TimeoutError:") or why == "URLError: <urlopen error timed out>")


def ask(base: str, probe: dict, served_name: str = "", key=None, gate: bool = False) -> tuple[str | None, object]:
    """Ask `probe` of the engine at `base` (http://host:port) with urllib: (None, reply) when the answer counts,
    else (why, reply). `gate`: the longer timeout of an engine's first answers after a start."""
    timeout = probe["gate_timeout_s" if gate else "timeout_s"]
    status, reply = http_json(base + probe["path"], timeout, probe_body(probe, served_name), key)
    return answer_problem(probe, status, reply, served_name), reply
