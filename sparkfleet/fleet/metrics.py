"""The one reader of a server's Prometheus text (`/metrics`), for status and bench."""

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
