"""Stage 6: keep the host serving. A watchdog timer probes the engine and restarts it (rate-limited);
every converge probes it too and heals a host that does not answer, even when nothing changed. That
check is the host's health gate when nothing changed: a rollout judges it like the gate after a change.
The watchdog's settings and probes are the serving file, written with the other helpers (stage 3).

A worker of a tensor-parallel group runs no engine: its timer is off (one left from when it served alone
would restart a unit that is gone). Its Ray unit restarts itself (Restart=always), the head's watchdog
restarts the group's engine, and the health stage's Ray gate checks the worker on every converge."""

from pyinfra import host, state
from pyinfra.api import deploy

from sparkfleet import FILES_DIR, TEMPLATES_DIR
from sparkfleet.contract import paths
from sparkfleet.host.managed import managed_file, managed_template, managed_unit
from sparkfleet.host.operations import record_health_gate
from sparkfleet.host.run import ModelResult, ServiceResult
from sparkfleet.contract.paths import WATCHDOG, WATCHDOG_TIMER, WATCHDOG_UNIT
from sparkfleet.host.serving import serving
from sparkfleet.release.plan import HostPlan


@deploy("Watchdog")
def watchdog(plan: HostPlan, *, model_result: ModelResult, service_result: ServiceResult):
    s = plan.settings
    if not plan.runs_engine:
        managed_unit(name=f"Watchdog timer off (a worker of {plan.group.name} runs no engine)",
                     service=WATCHDOG_TIMER, running=False, enabled=False)
        return
    managed_file(name="Helper sparkfleet-watchdog", src=str(FILES_DIR / "sparkfleet-watchdog"), dest=WATCHDOG,
                 mode="0755")
    unit = managed_template(name="Watchdog unit", src=str(TEMPLATES_DIR / "sparkfleet-watchdog.service.j2"),
                            dest=paths.unit_path(WATCHDOG_UNIT), unit=paths.UNIT_NAME, watchdog=WATCHDOG,
                            config=paths.SERVING_FILE)
    timer = managed_template(name="Watchdog timer", src=str(TEMPLATES_DIR / "sparkfleet-watchdog.timer.j2"),
                             dest=paths.unit_path(WATCHDOG_TIMER), interval_s=s.watchdog_interval_s)
    managed_unit(name=f"Watchdog timer {'on' if s.watchdog else 'off'}", service=WATCHDOG_TIMER,
                 running=s.watchdog, enabled=s.watchdog, restarted=s.watchdog and timer.will_change,
                 daemon_reload=unit.will_change or timer.will_change)
    if service_result.started.will_change:  # started or restarted: the health stage's gate asked it
        return
    check = serving(name=f"{s.served_model_name} is serving (else restarted and gated)",
                    served_name=s.served_model_name, port=s.api_port,
                    tools=s.enable_auto_tool_choice, timeout_s=s.health_timeout_s, runtime=model_result.runtime,
                    container=s.container_name)
    record_health_gate(state, host.name, check)
