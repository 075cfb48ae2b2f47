"""Stage 1: read the host, change nothing; a host that is not fit stops here."""

import shlex

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.server import Arch
from pyinfra.operations import server

from sparkfleet.host.facts import (
    DockerState,
    FreeBytes,
    MemInfo,
    ModelFiles,
    NvidiaSmi,
    PythonVersion,
    Unreadable,
    read_json_object,
)
from sparkfleet.host.model_files import files_needing_work, missing_bytes
from sparkfleet.host.paths import RELEASE_FILE, VERIFIED_RECORD
from sparkfleet.host.preflight import HostFacts, preflight_problems
from sparkfleet.release.plan import HostPlan


def files_to_fetch(manifest, model_dir: str):
    """(what the host holds in model_dir, the bytes still to download there): the free-disk check covers the
    chat model and every service's."""
    state = host.get_fact(ModelFiles, model_dir=model_dir, record=VERIFIED_RECORD)
    needed = [] if isinstance(state, Unreadable) else files_needing_work(manifest, state["record"], state["files"])
    return state, missing_bytes(manifest, needed)


@deploy("Preflight")
def preflight(plan: HostPlan) -> HostFacts | None:
    s = plan.settings
    model_state, chat_bytes = files_to_fetch(plan.manifest, plan.model_dir)
    service_bytes = sum(files_to_fetch(svc.manifest, svc.model_dir)[1] for svc in plan.services)
    facts = HostFacts(
        arch=host.get_fact(Arch),
        gpu=host.get_fact(NvidiaSmi),
        meminfo=host.get_fact(MemInfo),
        free_bytes=host.get_fact(FreeBytes, path=s.model_root),
        needed_bytes=chat_bytes + service_bytes,
        docker=host.get_fact(DockerState),
        python=host.get_fact(PythonVersion),
        model_files=model_state,
        release=read_json_object(host, RELEASE_FILE),
    )
    problems = preflight_problems(host.name, s, facts)
    if problems:
        server.shell(
            name="Preflight failed: this host is left untouched",
            commands=["printf '%s\\n' " + " ".join(shlex.quote(p) for p in problems) + " >&2; exit 1"],
        )
        return None
    return facts
