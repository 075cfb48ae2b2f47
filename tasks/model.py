"""Stage 3: the model's files, fetched with the hub's client and verified against its manifest."""

import io

from pyinfra.api import deploy
from pyinfra.operations import files

from sparkfleet import PROJECT_ROOT, paths
from sparkfleet.operations import model_verified, runtime_bundle, runtime_path
from sparkfleet.plan import HostPlan
from sparkfleet.runtime import build_bundle

HOST_SCRIPTS = ("sparkfleet-fetch", "sparkfleet-health", "sparkfleet-memcheck")


@deploy("Model")
def model(plan: HostPlan, arch: str, python: str) -> str:
    """Returns the runtime path the later stages run the clients from."""
    s = plan.settings
    for script in HOST_SCRIPTS:
        files.put(name=f"Helper {script}", src=str(PROJECT_ROOT / "files" / script),
                  dest=f"{paths.BIN_DIR}/{script}", mode="0755")
    tarball = str(build_bundle(arch, python))
    runtime_bundle(name="Hub and openai clients (runtime bundle)", tarball=tarball)
    runtime = runtime_path(tarball)
    files.put(name="Hub token (root-only)", src=io.StringIO(plan.render_hub_env()), dest=paths.HUB_ENV, mode="0600")
    model_verified(
        name=f"Model {s.model_repo} verified",
        manifest=plan.manifest, model_dir=plan.model_dir, endpoint=s.hub_endpoint, runtime=runtime,
        full_verify=s.full_verify,
    )
    return runtime
