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


@deploy("Preflight")
def preflight(plan: HostPlan) -> HostFacts | None:
    s = plan.settings
    model_state = host.get_fact(ModelFiles, model_dir=plan.model_dir, record=VERIFIED_RECORD)
    needed = [] if isinstance(model_state, Unreadable) else files_needing_work(
        plan.manifest, model_state["record"], model_state["files"])
    facts = HostFacts(
        arch=host.get_fact(Arch),
        gpu=host.get_fact(NvidiaSmi),
        meminfo=host.get_fact(MemInfo),
        free_bytes=host.get_fact(FreeBytes, path=s.model_root),
        needed_bytes=missing_bytes(plan.manifest, needed),
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
