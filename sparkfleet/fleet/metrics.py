"""The one reader of a server's Prometheus text (`/metrics`), for status and bench; and the one size-capped GET
of a host's answer (status's alerts, usage)."""

from __future__ import annotations

import re

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _samples(text: str):
    """(name, labels, value) per sample line; comments and unparsable values skipped."""
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match:
            continue
        try:
            value = float(match[3])
        except ValueError:
            continue
        yield match[1], dict(_LABEL.findall(match[2] or "")), value


def read_metrics(text: str) -> dict[str, float]:
    """Each series' value summed over its labels (vLLM labels by model name and engine); comments skipped."""
    sums: dict[str, float] = {}
    for name, _, value in _samples(text):
        sums[name] = sums.get(name, 0.0) + value
    return sums


def read_by_label(text: str, name: str, label: str) -> dict[str, float]:
    """One series' values keyed by one label (summed over the others), e.g. per draft `position`."""
    out: dict[str, float] = {}
    for sample, labels, value in _samples(text):
        if sample == name and label in labels:
            out[labels[label]] = out.get(labels[label], 0.0) + value
    return out


class CappedGetError(RuntimeError):
    """A capped GET got no answer, another status than 200, or more than its cap: one line saying which."""


def capped_get(url: str, max_bytes: int, timeout_s: float, **kwargs) -> bytes:
    """The body of a GET of `url` (a host's answer, so untrusted: never more than `max_bytes` read); `kwargs`
    are requests.get's (headers, verify)."""
    import requests

    try:
        with requests.get(url, timeout=timeout_s, stream=True, **kwargs) as answer:
            if answer.status_code != 200:
                raise CappedGetError(f"answered HTTP {answer.status_code}")
            body = answer.raw.read(max_bytes + 1, decode_content=True)
    except requests.RequestException as exc:
        raise CappedGetError(f"did not answer ({type(exc).__name__})") from None
    if len(body) > max_bytes:
        raise CappedGetError(f"answered more than {max_bytes} bytes")
    return body
