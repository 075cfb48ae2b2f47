"""Read what `nvidia-smi` says about the GPU, as a GB10 prints it."""

from __future__ import annotations

import re
from dataclasses import dataclass

_HEADER = re.compile(r"Driver Version:\s*(?P<driver>\S+)\s+CUDA Version:\s*(?P<cuda>\S+)")
_GPU_ROW = re.compile(r"^\|\s*\d+\s+(?P<name>\S[^|]*?)\s+(?:On|Off)\s*\|", re.MULTILINE)
_VERSION = re.compile(r"\d+(?:\.\d+)*")


@dataclass(frozen=True)
class GpuReport:
    name: str | None
    driver: str | None
    cuda: str | None
    error: str | None = None  # one line: what nvidia-smi printed that is not a working GPU


def parse_nvidia_smi(text: str) -> GpuReport:
    """Parse the default `nvidia-smi` table (memory may read `Not Supported` on GB10).

    A driver, CUDA version or GPU name that reads `N/A` (a driver half loaded)
    is an error, never a version to compare.
    """
    header = _HEADER.search(text)
    if not header:
        first = text.strip().splitlines()[0] if text.strip() else "no output"
        return GpuReport(None, None, None, error=f"nvidia-smi printed no driver line ({first[:120]})")
    driver, cuda = header["driver"], header["cuda"]
    for what, value in (("Driver Version", driver), ("CUDA Version", cuda)):
        if not _VERSION.fullmatch(value):
            return GpuReport(None, None, None, error=f"nvidia-smi reads {what}: {value[:40]}, not a version")
    row = _GPU_ROW.search(text)
    name = row["name"].strip() if row else None
    if not name or not name[0].isalpha() or name.upper() == "N/A":
        return GpuReport(None, driver, cuda, error=f"nvidia-smi lists no GPU name (reads {name or 'nothing'})")
    return GpuReport(name, driver, cuda)


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def at_least(found: str | None, minimum: str) -> bool:
    return found is not None and version_tuple(found) >= version_tuple(minimum)
