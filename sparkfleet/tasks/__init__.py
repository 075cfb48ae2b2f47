"""The stages, one `@deploy` each, and `converge`: the whole sequence, the deploy's table of contents.

Every host's settings are validated (and the model manifest resolved from the hub) before anything runs; a host
that fails preflight is left untouched, and so is every member of a tensor-parallel group when any member, or the
fabric between them, fails it. A group's members each run a Ray node; its head runs the engine (`service`).
Engines listen on loopback; each host's guard is what the LAN reaches.

A deploy file calls `converge()` (pyinfra runs deploy code once per host); plain pyinfra runs it as
`pyinfra INVENTORY sparkfleet.tasks.converge`, a project's own deploy.py after its own operations. Here a
stage's name is its function, not its module (`from sparkfleet.tasks.model import ...` still reaches the module).
"""

from pyinfra import host, state

from sparkfleet.controller.prepare import prepare
from sparkfleet.fleet.front_door import GROUP as FRONT_DOOR
from sparkfleet.fleet.inventory import plan_for, plans
from sparkfleet.release.plan import HostPlan
from sparkfleet.tasks.container_toolkit import container_toolkit
from sparkfleet.tasks.front_door import front_door
from sparkfleet.tasks.guard import guard
from sparkfleet.tasks.health import health
from sparkfleet.tasks.model import model
from sparkfleet.tasks.platform import platform
from sparkfleet.tasks.preflight import preflight
from sparkfleet.tasks.service import service
from sparkfleet.tasks.watchdog import watchdog


def converge(plan: HostPlan | None = None) -> None:
    """Converge the current host to its release (the inventory's plan for it unless `plan` is given)."""
    plan = plan_for(state, host) if plan is None else plan
    facts = preflight(plan)
    if not facts:
        return
    prepared = prepare(plan, facts)
    platform(plan)
    container_toolkit(plan, arch=facts.arch)
    model_result = model(plan, facts, prepared)
    service_result = service(plan, facts, model_result=model_result)
    guard(plan)
    health(plan, model_result=model_result, service_result=service_result)
    watchdog(plan, model_result=model_result, service_result=service_result)
    if FRONT_DOOR in host.groups:
        front_door(plan, plans(state))
