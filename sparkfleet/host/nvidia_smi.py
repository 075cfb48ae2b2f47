"""Read what `nvidia-smi` says about the GPU, as a GB10 prints it."""

from __future__ import annotations

import re
from dataclasses import dataclass

_HEADER = re.compile(r"Driver Version:\s*(?P<driver>[\d.]+)\s+CUDA Version:\s*(?P<cuda>[\d.]+)")
_GPU_ROW = re.compile(r"^\|\s*\d+\s+(?P<name>NVIDIA [^|]*?|[A-Z][^|]*?)\s+(?:On|Off)\s*\|", re.MULTILINE)


@dataclass(frozen=True)
class GpuReport:
    name: str | None
    driver: str | None
    cuda: str | None
    error: str | None = None


def parse_nvidia_smi(text: str) -> GpuReport:
    """Parse the default `nvidia-smi` table (memory may read `Not Supported` on GB10)."""
    header = _HEADER.search(text)
    if not header:
        first = text.strip().splitlines()[0] if text.strip() else "no output"
        return GpuReport(None, None, None, error=first)
    row = _GPU_ROW.search(text)
    return GpuReport(row["name"].strip() if row else None, header["driver"], header["cuda"])


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def at_least(found: str | None, minimum: str) -> bool:
    return found is not None and version_tuple(found) >= version_tuple(minimum)
