"""Stage 1: read the host, change nothing; a host that is not fit stops here, and so does every member of a
tensor-parallel group when any member, its fabric link or the pair's versions are not fit."""

import shlex

from pyinfra import host, state
from pyinfra.api import deploy
from pyinfra.api.exceptions import ConnectError
from pyinfra.facts.server import Arch, KernelVersion
from pyinfra.operations import server

from sparkfleet.host.facts import (
    DockerState,
    FabricInterface,
    FabricReach,
    FreeBytes,
    JsonFile,
    MemInfo,
    ModelFiles,
    NvidiaSmi,
    OsRelease,
    PythonVersion,
    TcpReach,
    Unreadable,
    json_object,
)
from sparkfleet.contract.monitoring import FRONT_DOOR_GROUP as FRONT_DOOR
from sparkfleet.controller.inventory import plans
from sparkfleet.host.model_files import files_needing_work, missing_bytes
from sparkfleet.host.state import read_facts
from sparkfleet.contract.paths import RELEASE_FILE, VERIFIED_RECORD
from sparkfleet.host.preflight import (
    SERVICE_DISK_PATH,
    HostFacts,
    MemberFacts,
    ServiceFacts,
    converge_reads,
    pair_problems,
    preflight_problems,
    service_preflight_problems,
    service_reads,
)
from sparkfleet.host.run import run_of
from sparkfleet.release.plan import HostPlan


def files_to_fetch(held, manifest):
    """(what the host holds in a model directory, the bytes still to download there): the free-disk check covers
    the chat model and every service's."""
    needed = [] if isinstance(held, Unreadable) else files_needing_work(manifest, held["record"], held["files"])
    return held, missing_bytes(manifest, needed)


def read_host(target, plan: HostPlan) -> tuple[HostFacts, list[str]]:
    """A host's facts and its own problems (a group member's are read by whichever member gets here first)."""

    def read():
        s = plan.settings
        models = [plan.model_dir, *(svc.model_dir for svc in plan.services)]
        got = read_facts(target, {
            "arch": (Arch, {}), "kernel": (KernelVersion, {}), "gpu": (NvidiaSmi, {}), "meminfo": (MemInfo, {}),
            "free_bytes": (FreeBytes, {"path": s.model_root}), "docker": (DockerState, {}),
            "python": (PythonVersion, {}), "release": (JsonFile, {"path": RELEASE_FILE}),
            **{f"model {i}": (ModelFiles, {"model_dir": d, "record": VERIFIED_RECORD}) for i, d in enumerate(models)},
            **converge_reads(s.model_root, plan.engine_ref, front_door=FRONT_DOOR in target.groups,
                             service_refs=tuple(svc.engine_ref for svc in plan.services if svc.image)),
        })  # one round trip
        model_state, chat_bytes = files_to_fetch(got["model 0"], plan.manifest)
        service_bytes = sum(files_to_fetch(got[f"model {i}"], svc.manifest)[1]
                            for i, svc in enumerate(plan.services, start=1))
        facts = HostFacts(
            arch=got["arch"], gpu=got["gpu"], meminfo=got["meminfo"], free_bytes=got["free_bytes"],
            needed_bytes=chat_bytes + service_bytes, docker=got["docker"], python=got["python"],
            model_files=model_state, release=json_object(RELEASE_FILE, got["release"]), kernel=got["kernel"],
        )
        return facts, preflight_problems(target.name, s, facts, in_group=plan.group is not None)

    return run_of(state).once("preflight", target.name, read)


def read_member(name: str, group) -> MemberFacts | None:
    """What the pair preflight needs from one member; None when it cannot be read (not connected)."""
    member = state.inventory.get_host(name)
    if member in state.failed_hosts:
        return None
    try:
        host_facts, own = read_host(member, plans(state)[name])
        others = [address for other, address in zip(group.members, group.addresses, strict=True) if other != name]
        return MemberFacts(gpu=host_facts.gpu, fit=not own, kernel=host_facts.kernel,
                           link=member.get_fact(FabricInterface, interface=group.interface),
                           reach=member.get_fact(FabricReach, interface=group.interface, addresses=others))
    except ConnectError:
        return None


def read_group(group) -> list[str]:
    """The pair preflight of the whole group: every member's own preflight, its fabric link, what it reaches."""

    def read():
        facts = {name: read_member(name, group) for name in group.members}
        return pair_problems(group, {name: f for name, f in facts.items() if f is not None})

    return run_of(state).once("pair preflight", group.name, read)


def failing(name: str, lines: list[str]) -> None:
    """An operation that prints `lines` on stderr (what the report shows of a failed step) and fails, so nothing
    after it runs on this host."""
    server.shell(name=name, commands=["printf '%s\\n' " + " ".join(shlex.quote(p) for p in lines) + " >&2; exit 1"])


def stop(lines: list[str], what: str):
    """The host's one operation: print every problem and fail, so nothing after it runs on this host."""
    failing(f"Preflight failed: {what} is left untouched", lines)


@deploy("Preflight")
def preflight(plan: HostPlan) -> HostFacts | None:
    facts, problems = read_host(host, plan)
    group_lines = read_group(plan.group) if plan.group else []
    if problems or group_lines:
        stop(problems + group_lines, f"every member of {plan.group.name}" if plan.group else "this host")
        return None
    return facts


def spark_apis(plans: dict[str, HostPlan]) -> list[tuple[str, int]]:
    """(LAN address, API port) of every host of the inventory that serves an engine API: what a service host must
    reach (its front door's backends, its Prometheus's targets)."""
    return [(p.lan_address, p.settings.api_port) for p in plans.values() if p.runs_engine]


@deploy("Service host preflight")
def service_preflight(plan: HostPlan) -> ServiceFacts | None:
    """A service host's preflight: what its roles need (OS, memory, disk, python3, the Sparks' API ports within
    reach), none of a Spark's (GPU, Docker, model). A host that fails it is left untouched."""
    got = read_facts(host, {
        "os": (OsRelease, {}), "meminfo": (MemInfo, {}), "free_bytes": (FreeBytes, {"path": SERVICE_DISK_PATH}),
        "python": (PythonVersion, {}), "reach": (TcpReach, {"targets": spark_apis(plans(state))}),
        **service_reads(front_door=FRONT_DOOR in host.groups),
    })
    facts = ServiceFacts(os_release=got["os"], meminfo=got["meminfo"], free_bytes=got["free_bytes"],
                         python=got["python"], reach=got["reach"])
    problems = service_preflight_problems(host.name, plan.settings, facts)
    if problems:
        stop(problems, "this service host")
        return None
    return facts
