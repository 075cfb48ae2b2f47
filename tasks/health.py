"""Stage 5: after a change, the service must answer before the host counts as converged;
only then are model directories beyond keep_releases removed."""

from pyinfra.api import deploy

from sparkfleet.host.operations import health_gate, old_models_removed
from sparkfleet.release.plan import HostPlan


@deploy("Health gate")
def health(plan: HostPlan, runtime: str, started, keep: list[str]):
    s = plan.settings
    health_gate(
        name=f"{s.served_model_name} answers on port {s.api_port}",
        served_name=s.served_model_name, api_host=s.api_host, port=s.api_port,
        tools=s.enable_auto_tool_choice, timeout_s=s.health_timeout_s, runtime=runtime,
        _if=started.did_change,
    )
    old_models_removed(name=f"Model directories beyond the last {s.keep_releases} releases removed",
                       model_root=s.model_root, keep=keep)
