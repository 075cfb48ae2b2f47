"""Stage 5: after a change, the service must answer before the host counts as converged;
only then are model directories beyond keep_releases removed."""

from pyinfra import host, state
from pyinfra.api import deploy

from sparkfleet.host.operations import (
    health_gate,
    old_models_removed,
    record_health_gate,
)
from sparkfleet.host.services import service_serving


def gate(served_name: str, api_host: str, port: int, tools: bool, timeout_s: int, runtime: str, **op_args):
    """The health gate, recorded on pyinfra's state: a rollout reads its result, not its name."""
    meta = health_gate(name=f"{served_name} answers on port {port}", served_name=served_name, api_host=api_host,
                       port=port, tools=tools, timeout_s=timeout_s, runtime=runtime, **op_args)
    record_health_gate(state, host.name, meta)
    return meta


@deploy("Health gate")
def health(plan, runtime: str, started, keep: list[str], services_started: dict | None = None):
    s = plan.settings
    gate(s.served_model_name, s.api_host, s.api_port, s.enable_auto_tool_choice, s.health_timeout_s, runtime,
         _if=started.did_change)
    for svc in plan.services:
        svc_started = (services_started or {})[svc.name]
        gate(svc.service.served_model_name, s.api_host, svc.service.api_port, False, s.health_timeout_s, runtime,
             kind=svc.kind, unit=svc.unit, _if=svc_started.did_change)
        # serving means answering: every converge asks each service once, and heals one that does not answer
        check = service_serving(name=f"Service {svc.name} answers ({svc.kind}, port {svc.service.api_port})",
                                unit=svc.unit, served_name=svc.service.served_model_name, kind=svc.kind,
                                api_host=s.api_host, port=svc.service.api_port, timeout_s=s.health_timeout_s,
                                runtime=runtime, _if=svc_started.did_not_change)
        record_health_gate(state, host.name, check)
    old_models_removed(name=f"Model directories beyond the last {s.keep_releases} releases removed",
                       model_root=s.model_root, keep=keep)
