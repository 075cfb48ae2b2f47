"""Converge DGX Sparks into verified vLLM servers.

    pyinfra inventory/office.py deploy.py

Every host's settings are validated (and the model manifest resolved from the
hub) before anything runs; a host that fails preflight is left untouched, and
so is every member of a tensor-parallel group when any member, or the fabric
between them, fails it. A group's members each run a Ray node; its head runs
the engine (tasks/service.py). Engines listen on loopback; each host's guard (tasks/guard.py) is what the
LAN reaches.
"""

from pyinfra import host, state

from sparkfleet.controller.prepare import prepare
from sparkfleet.fleet.inventory import plan_for, plans
from tasks.container_toolkit import container_toolkit
from tasks.front_door import front_door
from tasks.guard import guard
from tasks.health import health
from tasks.model import model
from tasks.preflight import preflight
from tasks.service import service
from tasks.watchdog import watchdog

plan = plan_for(state, host)
facts = preflight(plan)
if facts:
    prepared = prepare(plan, facts)
    container_toolkit(plan, arch=facts.arch)
    model_result = model(plan, facts, prepared)
    service_result = service(plan, facts, model_result=model_result)
    guard(plan)
    health(plan, model_result=model_result, service_result=service_result)
    watchdog(plan, model_result=model_result, service_result=service_result)
    if "front_door" in host.groups:
        front_door(plan, plans(state))
