"""Preflight: is this host fit for the release? One line per problem, each with a fix."""

from __future__ import annotations

from dataclasses import dataclass

from sparkfleet.host.facts import JsonObject, Unreadable, history_problem
from sparkfleet.host.nvidia_smi import GpuReport, at_least
from sparkfleet.release.settings import Settings

GIB = 1024**3


@dataclass(frozen=True)
class HostFacts:
    arch: str
    gpu: GpuReport
    meminfo: dict | Unreadable  # kB, from /proc/meminfo
    free_bytes: int | Unreadable  # at the model root
    needed_bytes: int  # model bytes not yet verified on this host
    docker: dict  # {"installed": bool, "active": bool}
    python: str | None | Unreadable
    model_files: dict | Unreadable  # the ModelFiles fact: read once here, passed on to the model stage
    release: JsonObject  # the installed release record: the service and cleanup stages build on it


def unreadable_facts(name: str, f: HostFacts) -> list[str]:
    """Host output no parser understood: the host stops here, nothing is guessed or deleted."""
    found = [v for v in (f.meminfo, f.free_bytes, f.python, f.model_files, f.release.unreadable,
                         history_problem(f.release)) if isinstance(v, Unreadable)]
    return [u.line(name) for u in found]


def preflight_problems(name: str, s: Settings, f: HostFacts) -> list[str]:
    problems = unreadable_facts(name, f)
    if problems:
        return problems

    def refuse(what, found, required, fix):
        problems.append(f"{name}: {what}: found {found}, required {required}: {fix}")

    if f.arch != s.expected_arch:
        refuse("CPU architecture", f.arch, s.expected_arch,
               "run on a DGX Spark (or set expected_arch for this host)")
    if f.gpu.error or not f.gpu.driver:
        refuse("GPU driver", f.gpu.error or "no driver version", f"driver >= {s.min_driver_version}",
               "install the NVIDIA driver (DGX OS ships it) and reboot")
    else:
        if f.gpu.name != s.expected_gpu_name:
            refuse("GPU", f.gpu.name, s.expected_gpu_name, "check the host, or set expected_gpu_name")
        if not at_least(f.gpu.driver, s.min_driver_version):
            refuse("NVIDIA driver", f.gpu.driver, f">= {s.min_driver_version}",
                   "upgrade the driver (apt upgrade on DGX OS) and reboot")
        if not at_least(f.gpu.cuda, s.min_cuda_version):
            refuse("CUDA version", f.gpu.cuda, f">= {s.min_cuda_version}", "upgrade the NVIDIA driver")
    total_gib = f.meminfo.get("MemTotal", 0) / 1024**2
    if total_gib < s.min_memory_gib:
        refuse("memory (MemTotal)", f"{total_gib:.1f} GiB", f">= {s.min_memory_gib:g} GiB",
               "use a host with more memory, or lower min_memory_gib")
    if f.free_bytes < f.needed_bytes:
        refuse(f"free disk at {s.model_root}", f"{f.free_bytes / GIB:.1f} GiB",
               f"{f.needed_bytes / GIB:.1f} GiB for the model files still to fetch",
               "free space there (old models under model_root), or set model_root to a larger disk")
    if not f.docker["installed"]:
        refuse("Docker", "not installed", "Docker Engine", "install Docker (DGX OS ships it)")
    elif not f.docker["active"]:
        refuse("Docker", "docker.service not active", "running", "systemctl enable --now docker")
    if not f.python:
        refuse("python3", "not installed", "python3 >= 3.10", "apt-get install python3 (DGX OS ships it)")
    return problems
