"""Stage 8 (hosts of the group `monitoring`, after the front door): Prometheus from Debian's package, its own
unit on 127.0.0.1 (Debian's prometheus.service masked before the install, so it never starts), scraping what
the inventory serves with the backend key (sparkfleet/roles/monitoring.py `monitoring_state`), and Alertmanager
when `alertmanager_webhook_url` is set. A changed config or rule file is checked with promtool and reloaded; a
changed unit is a restart; it must be ready before the host counts as converged.
"""

from pyinfra.api import deploy

from sparkfleet.contract.settings import SettingsError
from sparkfleet.controller.inventory import DeployRefused
from sparkfleet.release.plan import HostPlan
from sparkfleet.roles.monitoring import monitoring_state
from sparkfleet.tasks.ensure import ensure


@deploy("Monitoring")
def monitoring(plan: HostPlan, plans: dict[str, HostPlan], groups: dict[str, set[str]]):
    try:
        wanted = monitoring_state(plan.name, plans, groups)
    except SettingsError as exc:
        raise DeployRefused(f"invalid monitoring settings; no host was changed:\n{exc}") from None  # refusal: planned
    ensure(wanted)
