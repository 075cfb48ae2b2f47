"""Preflight: is this host fit for the release? One line per problem, each with a fix."""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from sparkfleet.contract import paths
from sparkfleet.contract.formats import host_memory_bytes
from sparkfleet.host.facts import (
    FabricLink,
    JsonFile,
    JsonObject,
    KeyringKeys,
    ModelDirs,
    Unreadable,
    history_problem,
    image_read,
)
from sparkfleet.host.state import HostState, PathState
from sparkfleet.host.nvidia_smi import GpuReport, at_least
from sparkfleet.contract.settings import Settings

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
    kernel: str | None = None  # `uname -r`


def converge_reads(model_root: str, engine_ref: str, front_door: bool = False, service_refs: tuple = ()) -> dict:
    """What the stages read from a host that needs nothing (the batched state, daemon.json, the toolkit's keyring,
    the engine image and the services' own images, the model directories; on a front door its hold record): read
    with preflight's facts, in its one round trip, and held until an operation changes the host (state.fact)."""
    return {"model root": (PathState, {"path": model_root}),
            "daemon.json": (JsonFile, {"path": paths.DAEMON_JSON}),
            "keyring": (KeyringKeys, {"path": paths.TOOLKIT_KEYRING}),
            "engine image": image_read(engine_ref),
            **{f"service image {ref}": image_read(ref) for ref in service_refs},
            "model dirs": (ModelDirs, {"model_root": model_root}), **service_reads(front_door)}


def service_reads(front_door: bool = False) -> dict:
    """What the stages of a service host read from it (converge_reads, less a Spark's): the batched state, its TLS
    certificate (tasks/tls.py; public) and, on a front door, its hold record."""
    return {"managed": (HostState, {}), "host certificate": (JsonFile, {"path": paths.TLS_HOST_CERT}),
            **({"front door holds": (JsonFile, {"path": paths.FRONT_DOOR_HOLDS})} if front_door else {})}


def unreadable_facts(name: str, f: HostFacts) -> list[str]:
    """Host output no parser understood: the host stops here, nothing is guessed or deleted."""
    found = [v for v in (f.meminfo, f.free_bytes, f.python, f.model_files, f.release.unreadable,
                         history_problem(f.release)) if isinstance(v, Unreadable)]
    return [u.line(name) for u in found]


def disk_text(n: int) -> str:
    """GiB, as df -h and the hubs' listings say it; MiB below a tenth of one (a small model, a nearly full disk),
    where "0.0 GiB" would say nothing."""
    return f"{n / GIB:.1f} GiB" if n >= GIB / 10 else f"{n / 2**20:.1f} MiB"


def refused_by(version: str | None, refused: dict[str, str]) -> tuple[str, str] | None:
    """(the glob, why) of the first entry of a refused_* setting that `version` matches (fnmatch, case kept);
    None when it matches none, or is not known (its own check names that)."""
    if not version:
        return None
    return next(((glob, why) for glob, why in refused.items() if fnmatchcase(version, glob)), None)


def refused_lists(s: Settings, in_group: bool = False) -> dict[str, list[tuple[dict[str, str], str]]]:
    """{"kernel" | "NVIDIA driver": [(a refused_* setting's entries, its name)]} that apply to a host (a member of a
    tensor-parallel group: `in_group`): preflight checks the running versions, an upgrade the new ones."""
    kernels = [(s.refused_kernels, "refused_kernels")] + ([(s.refused_pair_kernels, "refused_pair_kernels")]
                                                         if in_group else [])
    return {"kernel": kernels, "NVIDIA driver": [(s.refused_drivers, "refused_drivers")]}


def refused_versions(name: str, s: Settings, f: HostFacts, in_group: bool = False) -> list[str]:
    """One line per platform version a refused_* setting names: the host, the version, why, and the fix."""
    running = {"kernel": f.kernel, "NVIDIA driver": f.gpu.driver}
    checks = [(what, running[what], refused, setting)
              for what, lists in refused_lists(s, in_group).items() for refused, setting in lists]
    lines = []
    for what, version, refused, setting in checks:
        found = refused_by(version, refused)
        if found:
            lines.append(f"{name}: {what} {version} is refused ({setting} {found[0]!r}): {found[1]}: move the host "
                         f"to another {what} (and reboot), or take {found[0]!r} out of {setting} once checked")
    return lines


# A host whose MemTotal is below this share of host_memory_gb is not the host the plan fitted its models in: a
# 128 GB Spark reads about 119.7 GiB (128.5 GB, above 100 %), a 64 GB one left at host_memory_gb = 128 about half.
PLANNED_MEMORY_SHARE = 0.9


def memory_floor(s: Settings) -> tuple[float, str]:
    """(the least MemTotal in GiB preflight accepts, the setting that says so): min_memory_gib where set, else
    PLANNED_MEMORY_SHARE of host_memory_gb, the memory the fit planned the host's models in."""
    if s.min_memory_gib is not None:
        return s.min_memory_gib, "min_memory_gib"
    return host_memory_bytes(s.host_memory_gb) * PLANNED_MEMORY_SHARE / GIB, "host_memory_gb"


def memory_problem(name: str, s: Settings, mem_total_kb: float) -> str | None:
    """One line when the host's MemTotal (kB, /proc/meminfo) is below memory_floor, naming the setting and the
    fix: a host planned as a 128 GB Spark that has 64 GB is told the host_memory_gb its memory reads as."""
    total_gib, (floor, setting) = mem_total_kb / 1024**2, memory_floor(s)
    if total_gib >= floor:
        return None
    if setting == "min_memory_gib":
        return (f"{name}: memory (MemTotal): found {total_gib:.1f} GiB, required >= {floor:g} GiB: use a host "
                f"with more memory, or lower min_memory_gib")
    measured_gb = int(mem_total_kb * 1024 // 10**9)
    return (f"{name}: memory (MemTotal): found {total_gib:.1f} GiB, required >= {floor:.1f} GiB ("
            f"{PLANNED_MEMORY_SHARE:.0%} of host_memory_gb = {s.host_memory_gb:g}, the memory the plan fits the "
            f"models in): set host_memory_gb = {measured_gb} for this host (a 64 GB DGX Spark: 64) and plan again, "
            f"or use a host with more memory")


def preflight_problems(name: str, s: Settings, f: HostFacts, in_group: bool = False) -> list[str]:
    """Why this host is not fit for the release, one line each (a member of a tensor-parallel group: `in_group`)."""
    problems = unreadable_facts(name, f)
    if problems:
        return problems
    problems += refused_versions(name, s, f, in_group)

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
    memory = memory_problem(name, s, f.meminfo.get("MemTotal", 0))
    if memory:
        problems.append(memory)
    if f.free_bytes < f.needed_bytes:
        refuse(f"free disk at {s.model_root}", disk_text(f.free_bytes),
               f"{disk_text(f.needed_bytes)} for the model files still to fetch",
               "free space there (old models under model_root), or set model_root to a larger disk")
    if not f.docker["installed"]:
        refuse("Docker", "not installed", "Docker Engine", "install Docker (DGX OS ships it)")
    elif not f.docker["active"]:
        refuse("Docker", "docker.service not active", "running", "systemctl enable --now docker")
    if not f.python:
        refuse("python3", "not installed", "python3 >= 3.10", "apt-get install python3 (DGX OS ships it)")
    return problems


SERVICE_OS = ("debian", "ubuntu")  # what a service host may run: the distributions whose packages the stages install
SERVICE_DISK_PATH = "/"  # a service host's free-disk check (Prometheus's history, the packages)


@dataclass(frozen=True)
class ServiceFacts:
    """What a service host's preflight reads: no GPU, no Docker, no model; the Sparks it must reach."""

    os_release: dict  # /etc/os-release's ID and ID_LIKE
    meminfo: dict | Unreadable  # kB
    free_bytes: int | Unreadable  # at SERVICE_DISK_PATH
    python: str | None | Unreadable
    reach: dict[str, str]  # "address:port" of each Spark's API -> TcpReach's verdict from this host


def service_preflight_problems(name: str, s: Settings, f: ServiceFacts) -> list[str]:
    """Why this service host is not fit for its roles (front door, monitoring), one line each with the fix."""
    found = [v for v in (f.meminfo, f.free_bytes, f.python) if isinstance(v, Unreadable)]
    if found:
        return [u.line(name) for u in found]
    problems = []
    distro = {f.os_release.get("ID", ""), *f.os_release.get("ID_LIKE", "").split()}
    if not distro & set(SERVICE_OS):
        problems.append(f"{name}: operating system: found {f.os_release.get('ID') or 'unknown'}, required Debian or "
                        f"Ubuntu: run the front door and monitoring on a Debian or Ubuntu host")
    total_gib = f.meminfo.get("MemTotal", 0) / 1024**2
    if total_gib < s.service_min_memory_gib:
        problems.append(f"{name}: memory (MemTotal): found {total_gib:.1f} GiB, required >= "
                        f"{s.service_min_memory_gib:g} GiB: use a host with more memory, or lower "
                        f"service_min_memory_gib")
    if f.free_bytes < s.service_min_disk_gib * GIB:
        problems.append(f"{name}: free disk at {SERVICE_DISK_PATH}: found {disk_text(f.free_bytes)}, required >= "
                        f"{s.service_min_disk_gib:g} GiB: free space there, or lower service_min_disk_gib")
    if not f.python:
        problems.append(f"{name}: python3: not installed, required python3 >= 3.10: apt-get install python3")
    problems += [f"{name}: cannot reach the Spark API at {target} (TCP, no answer in 3 s): check that the Spark is "
                 f"up and on this LAN, its lan_address is right, and no firewall between them drops the port"
                 for target, verdict in f.reach.items() if verdict == "unreachable"]
    return problems


@dataclass(frozen=True)
class MemberFacts:
    """What the pair preflight reads from one member of a tensor-parallel group."""

    gpu: GpuReport
    link: FabricLink | Unreadable
    reach: dict[str, bool] | Unreadable  # each other member's fabric address -> answered a ping over the link
    fit: bool = True  # passed its own (single-host) preflight
    kernel: str | None = None  # `uname -r`


def link_problems(name: str, address: str, group, link: FabricLink | Unreadable) -> tuple[list[str], bool]:
    """A member's fabric interface: its problems, and whether it can carry a ping (exists, up, has the
    member's address; a wrong MTU does not stop a small ping)."""
    iface = group.interface
    if isinstance(link, Unreadable):
        return [link.line(name)], False
    if not link.exists:
        return [(f"{name}: fabric interface {iface}: not found on the host: cable the ConnectX-7 port and set "
                 f"fabric_interface to its name (`ip link` lists them)")], False
    problems = []
    if not link.admin_up:
        problems.append(f"{name}: fabric interface {iface}: down: `ip link set {iface} up` and persist it (netplan)")
    elif not link.carrier:
        problems.append(f"{name}: fabric interface {iface}: up but no link (no carrier): check the cable and the "
                        f"peer's port")
    if address not in link.addresses:
        found = ", ".join(link.addresses) or "no IPv4 address"
        problems.append(f"{name}: fabric interface {iface}: has {found}, not its fabric_address {address}: add "
                        f"{address} to {iface} (netplan) or correct fabric_address")
    carries = not problems
    if link.mtu != group.mtu:
        problems.append(f"{name}: fabric interface {iface}: MTU {link.mtu}, required {group.mtu}: set the MTU to "
                        f"{group.mtu} on {iface} and persist it (netplan); it falls back to 1500 after some reboots")
    return problems, carries


def _same_across(group, facts: dict[str, MemberFacts], what: str, read) -> list[str]:
    """One line per member whose `what` differs from the head's (a member without a reading is skipped:
    its own preflight names that)."""
    head_value = read(facts[group.head])
    if head_value is None:
        return []
    return [f"{name}: {what} {read(facts[name])}, the head {group.head} has {head_value}: every member of "
            f"{group.name} needs the same (upgrade the older one and reboot)"
            for name in group.members[1:] if read(facts[name]) not in (None, head_value)]


def pair_problems(group, facts: dict[str, MemberFacts]) -> list[str]:
    """Why a tensor-parallel group may not be changed, one line each naming the member; [] when every member
    is fit, its fabric interface is up with the group's MTU and its own address, every member answers every
    other over that interface, and the driver, CUDA and kernel versions agree. A member whose link cannot carry a
    ping is not also reported as unreachable: the link is the one problem."""
    missing = [name for name in group.members if name not in facts]
    if missing:
        return [f"{name}: its facts could not be read (not connected?): no member of {group.name} is changed"
                for name in missing]
    problems, carries = [], {}
    for name, address in zip(group.members, group.addresses, strict=True):
        if not facts[name].fit:
            problems.append(f"{name}: failed its own preflight: no member of {group.name} is changed")
        found, carries[name] = link_problems(name, address, group, facts[name].link)
        problems += found
    for name in group.members:
        reach = facts[name].reach
        if not carries[name]:
            continue
        if isinstance(reach, Unreadable):
            problems.append(reach.line(name))
            continue
        problems += [f"{name}: cannot reach {other} at {group.address_of(other)} over {group.interface} (ping): "
                     f"check the cable, both ports' addresses and a firewall"
                     for other in group.members if other != name and carries[other]
                     and not reach.get(group.address_of(other), False)]
    problems += _same_across(group, facts, "NVIDIA driver", lambda member: member.gpu.driver)
    problems += _same_across(group, facts, "CUDA version", lambda member: member.gpu.cuda)
    problems += _same_across(group, facts, "kernel", lambda member: member.kernel)
    return problems
