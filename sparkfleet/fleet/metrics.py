"""The one reader of a server's Prometheus text (`/metrics`), for status and bench."""

from __future__ import annotations

import re

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(\S+)")


def read_metrics(text: str) -> dict[str, float]:
    """Each series' value summed over its labels (vLLM labels by model name and engine); comments skipped."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match:
            continue
        try:
            value = float(match[2])
        except ValueError:
            continue
        sums[match[1]] = sums.get(match[1], 0.0) + value
    return sums
