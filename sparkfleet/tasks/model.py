"""Stage 3: the model's files, from the nearest source, verified against the hub's manifest."""

from pyinfra.api import deploy

from sparkfleet import FILES_DIR
from sparkfleet.controller.copy import controller_copy
from sparkfleet.controller.fleet_token import fleet_token
from sparkfleet.controller.prepare import Prepared
from sparkfleet.contract import paths
from sparkfleet.host.managed import (
    managed_absent,
    managed_directory,
    managed_file,
    managed_files,
    managed_permissions,
    managed_unit,
    managed_user,
)
from sparkfleet.host.model_files import model_verified, runtime_bundle, runtime_path
from sparkfleet.host.operations import secret_file
from sparkfleet.host.preflight import HostFacts
from sparkfleet.contract.serving import serving_file
from sparkfleet.host.run import ModelResult
from sparkfleet.contract.shared import PACKAGE_DIR, PACKAGE_NAME, package_files
from sparkfleet.release.plan import HostPlan

HOST_SCRIPTS = ("sparkfleet-fetch", "sparkfleet-health", "sparkfleet-memcheck", "sparkfleet-on-demand",
                "sparkfleet-share")


@deploy("Model")
def model(plan: HostPlan, facts: HostFacts, prepared: Prepared) -> ModelResult:
    """Returns the runtime path the later stages run the clients from, the model operation, and each
    service's model operation by service name."""
    helpers()
    # the helpers read it on every run: a change needs no restart
    managed_file(name="Serving file (the probes, the watchdog's settings)",
                 content=serving_file(plan.settings, plan.watched_services), dest=paths.SERVING_FILE, mode="0644")
    return model_files(plan, facts, prepared)


def helpers() -> None:
    """The host helpers (fetch, health, memcheck, on-demand, share) and the package they share, one managed file
    each: one operation, as they are shipped and changed together. The one-file module of releases before the
    package goes (the package would shadow it; nothing imports it)."""
    managed_files(name=f"Helpers {', '.join(HOST_SCRIPTS)} and their package {PACKAGE_NAME}", files=helper_files())
    managed_absent(name=f"Helpers' module before the package ({paths.HOST_MODULE_BEFORE}) absent",
                   path=paths.HOST_MODULE_BEFORE)


def helper_files() -> list[tuple[str, str, str]]:
    """(local file, host path, mode) of each helper script and each module of their package."""
    return [*((str(FILES_DIR / script), f"{paths.BIN_DIR}/{script}", "0755") for script in HOST_SCRIPTS),
            *((str(PACKAGE_DIR / name), f"{paths.HOST_MODULE}/{name}", "0644") for name in package_files())]


def model_files(plan: HostPlan, facts: HostFacts, prepared: Prepared) -> ModelResult:
    """The clients, the hub token, the share (peer mode) and every model's files in their release's directory,
    verified. No running engine reads any of it (a model directory is its manifest's own), so a rollout
    stages it while the host serves (`sparkfleet.tasks.stage`)."""
    s = plan.settings
    tarball = str(prepared.bundle.path)
    runtime_bundle(name="Hub and openai clients (runtime bundle, sha256 checked)", tarball=tarball,
                   sha256=prepared.bundle.sha256)
    runtime = runtime_path(tarball)
    secret_file(name="Hub token (root-only)", dest=paths.HUB_ENV, content=plan.render_hub_env())

    managed_directory(name="Model root", path=s.model_root, mode="0755")
    if s.model_source == "peer":
        managed_user(name="Share user (unprivileged, no login)", user=paths.SHARE_USER, home="/nonexistent",
                     shell="/usr/sbin/nologin")
        token = secret_file(name="Fleet token (0600)", dest=paths.FLEET_TOKEN, content=fleet_token() + "\n")
        managed_permissions(name="Fleet token readable by the share user alone", path=paths.FLEET_TOKEN,
                            user=paths.SHARE_USER, group=paths.SHARE_USER, mode="0600")
        share = managed_file(name="Model share unit", content=plan.render_share_unit(),
                             dest=paths.SHARE_UNIT_PATH, mode="0644")
        managed_unit(name="Model share running (verified files, read-only, fleet only)",
                     service=paths.SHARE_UNIT_NAME, running=True, enabled=True,
                     restarted=share.will_change or token.will_change, daemon_reload=share.will_change)

    common = dict(manifest=plan.manifest, model_dir=plan.model_dir, endpoint=s.hub_endpoint, runtime=runtime,
                  full_verify=s.full_verify, model_files=facts.model_files)
    # Two call sites on purpose: pyinfra runs the first (the hub) on every host before the
    # second starts, so peers fetch from a seed that already holds verified files.
    if plan.model_role == "hub":
        fetched = model_verified(name=f"Model {s.model_repo} from the hub, verified", **common)
    elif plan.model_role == "controller":
        fetched = model_verified(name=f"Model {s.model_repo} pushed from the controller, verified",
                                 pushed_from=str(prepared.model_copy), **common)
    else:
        fetched = model_verified(name=f"Model {s.model_repo} from peers on the LAN, verified",
                                 peers=plan.peer_urls, **common)
    return ModelResult(runtime=runtime, fetched=fetched, services_fetched=service_models(plan, runtime))


def service_models(plan: HostPlan, runtime: str) -> dict:
    """Each RAG service's model in its own directory, verified against its own manifest: pushed from the
    controller's verified copy in controller mode (hosts without the hub), else from the hub (small models:
    the LAN share serves the chat model's directory only)."""
    s = plan.settings
    fetched = {}
    for svc in plan.services:
        pushed = str(controller_copy(svc.manifest, s.controller_model_dir, s.controller_endpoint,
                                     token=s.hub_token)) \
            if s.model_source == "controller" else None
        source = "pushed from the controller" if pushed else "from the hub"
        fetched[svc.name] = model_verified(
            name=f"Service {svc.name}: model {svc.service.model_repo} {source}, verified",
            manifest=svc.manifest, model_dir=svc.model_dir, endpoint=s.hub_endpoint, runtime=runtime,
            full_verify=s.full_verify, pushed_from=pushed)
    return fetched
