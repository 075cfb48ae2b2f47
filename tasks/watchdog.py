"""Stage 6: keep the host serving. A watchdog timer probes the engine and restarts it (rate-limited);
every converge probes it too and heals a host that does not answer, even when nothing changed. That
check is the host's health gate when nothing changed: a rollout judges it like the gate after a change.

A worker of a tensor-parallel group runs no engine: its timer is off (one left from when it served alone
would restart a unit that is gone). Its Ray unit restarts itself (Restart=always), the head's watchdog
restarts the group's engine, and the health stage's Ray gate checks the worker on every converge."""

import json

from pyinfra import host, state
from pyinfra.api import deploy

from sparkfleet import FILES_DIR, TEMPLATES_DIR
from sparkfleet.contract import paths
from sparkfleet.host.managed import managed_file, managed_template, managed_unit
from sparkfleet.host.operations import record_health_gate
from sparkfleet.host.serving import (
    WATCHDOG,
    WATCHDOG_CONFIG,
    WATCHDOG_STATE,
    WATCHDOG_TIMER,
    WATCHDOG_UNIT,
    serving,
    watchdog_config,
)
from sparkfleet.release.plan import HostPlan


@deploy("Watchdog")
def watchdog(plan: HostPlan, runtime: str, started):
    s = plan.settings
    if not plan.runs_engine:
        managed_unit(name=f"Watchdog timer off (a worker of {plan.group.name} runs no engine)",
                     service=WATCHDOG_TIMER, running=False, enabled=False)
        return
    managed_file(name="Helper sparkfleet-watchdog", src=str(FILES_DIR / "sparkfleet-watchdog"), dest=WATCHDOG,
                 mode="0755")
    managed_file(name="Watchdog settings", content=json.dumps(watchdog_config(s), indent=1, sort_keys=True) + "\n",
                 dest=WATCHDOG_CONFIG, mode="0644")
    unit = managed_template(name="Watchdog unit", src=str(TEMPLATES_DIR / "sparkfleet-watchdog.service.j2"),
                            dest=f"/etc/systemd/system/{WATCHDOG_UNIT}", unit=paths.UNIT_NAME, watchdog=WATCHDOG,
                            config=WATCHDOG_CONFIG, state=WATCHDOG_STATE)
    timer = managed_template(name="Watchdog timer", src=str(TEMPLATES_DIR / "sparkfleet-watchdog.timer.j2"),
                             dest=f"/etc/systemd/system/{WATCHDOG_TIMER}", interval_s=s.watchdog_interval_s)
    managed_unit(name=f"Watchdog timer {'on' if s.watchdog else 'off'}", service=WATCHDOG_TIMER,
                 running=s.watchdog, enabled=s.watchdog, restarted=s.watchdog and timer.will_change,
                 daemon_reload=unit.will_change or timer.will_change)
    check = serving(name=f"{s.served_model_name} is serving (else restarted and gated)",
                    served_name=s.served_model_name, port=s.api_port,
                    tools=s.enable_auto_tool_choice, timeout_s=s.health_timeout_s, runtime=runtime,
                    container=s.container_name, _if=started.did_not_change)
    record_health_gate(state, host.name, check)
