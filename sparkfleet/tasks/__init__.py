"""The stages, one `@deploy` each, and `converge`: the whole sequence, the deploy's table of contents.

Every host's settings are validated (and the model manifest resolved from the hub) before anything runs; a host
that fails preflight is left untouched, and so is every member of a tensor-parallel group when any member, or the
fabric between them, fails it. A group's members each run a Ray node; its head runs the engine (`service`).
Engines listen on loopback; each host's guard is what the LAN reaches. With a `monitoring` group, every Spark runs
a node exporter on loopback (behind its guard) and the monitoring hosts run Prometheus, after the front door.

`stage()` is a rollout's first phase: run on every host that will change before any is drained.

A deploy file calls `converge()` (pyinfra runs deploy code once per host); plain pyinfra runs it as
`pyinfra INVENTORY sparkfleet.tasks.converge`, a project's own deploy.py after its own operations. Here a
stage's name is its function, not its module (`from sparkfleet.tasks.model import ...` still reaches the module).
"""

from pyinfra import host, state

from sparkfleet.contract.monitoring import GROUP as MONITORING, SERVICE_ROLE
from sparkfleet.controller.prepare import prepare
from sparkfleet.contract.monitoring import FRONT_DOOR_GROUP as FRONT_DOOR
from sparkfleet.controller.inventory import chat_ui_of, plan_for, plans
from sparkfleet.host.operations import fleet_point
from sparkfleet.release.plan import HostPlan
from sparkfleet.tasks.backup import backup_of, backup_source, backup_target, no_backup, no_backup_target
from sparkfleet.tasks.chat_ui import chat_ui, no_chat_ui
from sparkfleet.tasks.container_toolkit import container_toolkit
from sparkfleet.tasks.front_door import front_door, no_front_door
from sparkfleet.tasks.guard import guard
from sparkfleet.tasks.health import health
from sparkfleet.tasks.model import model
from sparkfleet.tasks.monitoring import monitoring
from sparkfleet.tasks.node_metrics import node_metrics
from sparkfleet.tasks.platform import platform
from sparkfleet.tasks.preflight import preflight, service_preflight
from sparkfleet.tasks.service import service
from sparkfleet.tasks.staging import staging
from sparkfleet.tasks.watchdog import watchdog


def converge(plan: HostPlan | None = None) -> None:
    """Converge the current host to its release (the inventory's plan for it unless `plan` is given); a service
    host (front door, monitoring: no GPU) to its roles, once every Spark's stages have run (its front door then
    finds the Sparks' guards up)."""
    plan = plan_for(state, host) if plan is None else plan
    if plan.role != SERVICE_ROLE:
        spark(plan)
    fleet_point(name="The Sparks' stages done (the service hosts' follow)", what="service hosts after the Sparks")
    if plan.role == SERVICE_ROLE:
        service_host(plan)


def spark(plan: HostPlan) -> None:
    """A Spark: preflight, the GPU and engine stages, the health gate, the watchdog, and a front door if it has one."""
    facts = preflight(plan)
    if not facts:
        return
    prepared = prepare(plan, facts)
    platform(plan)
    container_toolkit(plan, arch=facts.arch)
    model_result = model(plan, facts, prepared)
    service_result = service(plan, facts, model_result=model_result)
    monitored = monitored_groups(state)
    guard(plan)
    health(plan, model_result=model_result, service_result=service_result)
    watchdog(plan, model_result=model_result, service_result=service_result)
    if monitored:
        node_metrics(plan)
    if FRONT_DOOR in host.groups:
        front_door(plan, plans(state))
    else:
        no_front_door()
    if MONITORING in host.groups:
        monitoring(plan, plans(state), monitored)
    ui, pin = chat_ui_of(state)
    if ui is not None and ui.host == plan.name:
        doors = [p for name, p in plans(state).items() if FRONT_DOOR in state.inventory.get_host(name).groups]
        chat_ui(plan, doors, ui, pin)
    else:
        no_chat_ui()
    backups(plan)


def backups(plan: HostPlan) -> None:
    """The host's part in the backups (after its data's own stage): a source's timer, the backup target's SFTP
    user, or neither (what it held before removed; its data and the repositories stay)."""
    planned = backup_of(state)
    if plan.name in planned.sources:
        backup_source(planned.sources[plan.name], service_host=plan.is_service)
    else:
        no_backup()
    if planned.target == plan.name:
        backup_target(planned.public_keys)
    else:
        no_backup_target()


def monitored_groups(state) -> dict[str, set[str]]:
    """Each host's groups when the inventory has a monitoring host (Prometheus reads them), else none."""
    groups = {h.name: set(h.groups) for h in state.inventory}
    return groups if any(MONITORING in g for g in groups.values()) else {}


def service_host(plan: HostPlan) -> None:
    """A service host: its own preflight, then only its roles' stages; no GPU stage, no Docker, no model. HAProxy
    comes with the guard stage, which on a host without an engine installs it and keeps every guard off."""
    if not service_preflight(plan):
        return
    guard(plan)
    if FRONT_DOOR in host.groups:
        front_door(plan, plans(state))
    else:
        no_front_door()
    if MONITORING in host.groups:
        monitoring(plan, plans(state), monitored_groups(state))
    backups(plan)


def stage(plan: HostPlan | None = None) -> None:
    """Prepare the current host's release beside the running one, which keeps serving: preflight (memory, and free
    disk for the files still to fetch, the running release's staying where they are), prepare, then the model files
    fetched and verified into the release's own directory and its engine image pulled or loaded and checked. Nothing
    the running release uses changes and nothing restarts; a second run fetches nothing, and neither does the
    converge of the host's batch after it.

    `sparkfleet rollout` runs it from `stage.py` (`fleet/converge.py` `deploy_path`): a project's own when it holds
    one, else the packaged one, also for a project with its own deploy.py, whose operations run in the batch's
    converge, drained; a project with more to prepare while serving writes its own stage.py.
    """
    plan = plan_for(state, host) if plan is None else plan
    if plan.role == SERVICE_ROLE:
        return  # nothing of a release to prepare
    facts = preflight(plan)
    if facts:
        staging(plan, facts, prepare(plan, facts))
