"""Stage 5: after a change, the service must answer before the host counts as converged."""

from pyinfra.api import deploy

from sparkfleet.operations import health_gate
from sparkfleet.plan import HostPlan


@deploy("Health gate")
def health(plan: HostPlan, runtime: str, started):
    s = plan.settings
    health_gate(
        name=f"{s.served_model_name} answers on port {s.api_port}",
        served_name=s.served_model_name, api_host=s.api_host, port=s.api_port,
        tools=s.enable_auto_tool_choice, timeout_s=s.health_timeout_s, runtime=runtime,
        _if=started.did_change,
    )
