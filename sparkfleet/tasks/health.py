"""Stage 5: after a change, the service must answer before the host counts as converged;
only then are model directories beyond keep_releases removed.

A tensor-parallel group's gate adds Ray: the head's cluster must see every member alive with one GPU, and each
worker must see itself in it (a worker runs no engine: that is its gate)."""

from pyinfra import host, state
from pyinfra.api import StringCommand, deploy, operation

from sparkfleet.contract import paths
from sparkfleet.host.facts import RayCheck, ray_check_args
from sparkfleet.host.operations import (
    health_gate,
    old_models_removed,
    record_health_gate,
)
from sparkfleet.host.run import ModelResult, ServiceResult
from sparkfleet.host.state import unit_state
from sparkfleet.host.services import on_demand_started, service_serving


def gate(served_name: str, port: int, tools: bool, timeout_s: int, runtime: str, container: str, **op_args):
    """The health gate, recorded on pyinfra's state: a rollout reads its result, not its name."""
    meta = health_gate(name=f"{served_name} answers on port {port}", served_name=served_name, port=port,
                       tools=tools, timeout_s=timeout_s, runtime=runtime, container=container, **op_args)
    record_health_gate(state, host.name, meta)
    return meta


@operation(is_idempotent=False)
def ray_joined(address: str, node_ip: str, members: dict, wait_s: int):
    """Ray sees every one of `members` alive with one GPU; else wait for them (a node restarting rejoins within
    seconds) and fail naming each missing member, with the Ray unit's journal."""
    check = host.get_fact(RayCheck, address=address, node_ip=node_ip, members=members)
    if check["ok"]:
        host.noop(f"Ray sees {check['detail']}")
        return
    unit = paths.RAY_UNIT_NAME
    yield StringCommand("python3", paths.RAY_CHECK, *ray_check_args(address, node_ip, members), "--wait", str(wait_s),
                        f"|| {{ echo '--- last 30 lines of {unit}:' >&2; journalctl -u {unit} -n 30 --no-pager >&2;"
                        " exit 1; }")


def ray_gate(plan):
    """The head checks every member; a worker checks itself. Recorded like the engine's gate."""
    group = plan.group
    members = dict(zip(group.members, group.addresses, strict=True)) if plan.role == "head" else {
        plan.name: group.address_of(plan.name)}
    meta = ray_joined(name=f"Ray sees {', '.join(members)} with 1 GPU each ({group.name})", address=group.ray_address,
                      node_ip=group.address_of(plan.name), members=members, wait_s=plan.settings.health_timeout_s)
    record_health_gate(state, host.name, meta)


@deploy("Health gate")
def health(plan, *, model_result: ModelResult, service_result: ServiceResult):
    s = plan.settings
    runtime, started = model_result.runtime, service_result.started
    if plan.runs_engine and started.will_change:  # else the watchdog stage's serving check asks it
        gate(s.served_model_name, s.api_port, s.enable_auto_tool_choice, s.health_timeout_s, runtime,
             s.container_name)
    if plan.group:
        ray_gate(plan)
    for svc in plan.services:
        if svc.on_demand and service_result.services_started[svc.name].will_change:
            # a changed on-demand model is started through its proxy (as its first request would) and gated; it
            # stops again after its idle time
            on_demand_started(name=f"Service {svc.name} on demand: started once through its socket to prove it serves",
                              api_port=svc.service.api_port, wait_s=s.health_timeout_s)
        elif svc.on_demand and not unit_state(host, svc.unit)["running"]:
            continue  # idle-stopped: its socket listens (the service stage), and asking it would start it
        if service_result.services_started[svc.name].will_change:
            gate(svc.service.served_model_name, svc.service.api_port, False, s.health_timeout_s, runtime,
                 svc.container, kind=svc.kind, unit=svc.unit)
            continue
        # serving means answering: every converge asks each service once, and heals one that does not answer
        check = service_serving(name=f"Service {svc.name} answers ({svc.kind}, port {svc.service.api_port})",
                                unit=svc.unit, served_name=svc.service.served_model_name, kind=svc.kind,
                                port=svc.service.api_port, timeout_s=s.health_timeout_s,
                                runtime=runtime, container=svc.container)
        record_health_gate(state, host.name, check)
    old_models_removed(name=f"Model directories beyond the last {s.keep_releases} releases removed",
                       model_root=s.model_root, keep=service_result.keep)
