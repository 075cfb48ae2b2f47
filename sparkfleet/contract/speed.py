"""The speed record a host keeps (contract/paths.py SPEED_FILE): each release's measured figures, by release id.

    {"releases": {"<release id>": {"decode_tokens_per_s": 49.8, "ttft_ms": 104.2, "measured_at": "...Z"}}}

Written by the controller (a rollout's speed gate, fleet/speed.py) after a measurement, read back as the next
rollout's baseline. Read back from a host it is untrusted: an entry of the wrong shape counts for nothing.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass

KEEP = 8  # releases a record remembers (the newest); a rollback's target is among them
RELEASE_ID = re.compile(r"[0-9a-f]{6,64}")  # release/plan.py's ids (sha256 prefixes)


@dataclass(frozen=True)
class Figures:
    """What one measurement keeps: single-stream decode tokens/s (median) and TTFT (median, ms) at concurrency 1."""

    decode_tokens_per_s: float
    ttft_ms: float
    measured_at: str = ""


def _figure(value) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    return float(value) if ok else None


def parse_record(record) -> dict[str, Figures]:
    """{release id: Figures} from a record read back from a host; what does not fit the format is left out."""
    releases = record.get("releases") if isinstance(record, dict) else None
    found = {}
    for release, entry in (releases.items() if isinstance(releases, dict) else ()):
        if not (isinstance(release, str) and RELEASE_ID.fullmatch(release) and isinstance(entry, dict)):
            continue
        decode, ttft = _figure(entry.get("decode_tokens_per_s")), _figure(entry.get("ttft_ms"))
        at = entry.get("measured_at")
        if decode is not None and ttft is not None:
            found[release] = Figures(decode, ttft, at if isinstance(at, str) and at.isprintable() else "")
    return found


def render_record(kept: dict[str, Figures], new: dict[str, Figures], keep: int = KEEP) -> str:
    """The record's text: `kept` with `new`'s releases (re)placed last, only the `keep` newest releases kept."""
    bad = [release for release in new if not RELEASE_ID.fullmatch(release)]
    if bad:
        raise ValueError(f"not a release id: {bad[0]!r}")
    releases = {r: f for r, f in kept.items() if r not in new} | new
    newest = list(releases.items())[-keep:]
    return json.dumps({"releases": {r: asdict(f) for r, f in newest}}, indent=2) + "\n"
