"""Stage 8 (hosts of the group `monitoring`, after the front door): Prometheus from Debian's package, its own
unit on 127.0.0.1 (Debian's prometheus.service masked before the install, so it never starts), scraping what
the inventory serves with the backend key (sparkfleet/roles/monitoring.py), and Alertmanager when
`alertmanager_webhook_url` is set. A changed config or rule file is checked with promtool and reloaded; a changed
unit is a restart; it must be ready before the host counts as converged.
"""

from pyinfra.api import deploy
from pyinfra.operations import server

from sparkfleet.contract import monitoring as m
from sparkfleet.contract import paths
from sparkfleet.controller.inventory import DeployRefused
from sparkfleet.roles.monitoring import monitoring_plan
from sparkfleet.roles import pki
from sparkfleet.roles.status_page import console_files
from sparkfleet.roles.pki import ca_of
from sparkfleet.host.managed import managed_directory, managed_file, managed_packages, managed_permissions, managed_unit
from sparkfleet.host.operations import secret_file
from sparkfleet.release.plan import HostPlan
from sparkfleet.contract.settings import SettingsError


def _ready(name: str, port: int, timeout_s: int) -> str:
    return (f"for i in $(seq {timeout_s}); do curl -fsS --max-time 2 -o /dev/null "
            f"http://127.0.0.1:{port}{m.PROMETHEUS_READY_PATH} && exit 0; sleep 1; done; "
            f"echo '{name} is not ready after {timeout_s}s' >&2; exit 1")


@deploy("Monitoring")
def monitoring(plan: HostPlan, plans: dict[str, HostPlan], groups: dict[str, set[str]]):
    try:
        wanted = monitoring_plan(plan.name, plans, groups)
    except SettingsError as exc:
        raise DeployRefused(f"invalid monitoring settings; no host was changed:\n{exc}") from None
    s, user = wanted.settings, m.PROMETHEUS_USER
    managed_packages(name="Prometheus installed (Debian's unit masked first: it never starts)",
                     packages=[m.PROMETHEUS_PACKAGE], masked=[paths.MONITORING_PACKAGES[m.PROMETHEUS_PACKAGE]],
                     extra_install_args="--no-install-recommends")
    managed_unit(name="Debian's prometheus.service off (sparkfleet runs its own, on loopback)",
                 service=paths.MONITORING_PACKAGES[m.PROMETHEUS_PACKAGE], running=False, enabled=False)
    managed_directory(name="Prometheus config directory", path=m.PROMETHEUS_DIR, mode="0750", user="root", group=user)
    managed_directory(name="Prometheus data directory", path=m.PROMETHEUS_DATA, mode="0750", user=user, group=user)
    key = secret_file(name="Prometheus's backend key (0600)", dest=m.PROMETHEUS_KEY, content=wanted.key + "\n")
    managed_permissions(name="Prometheus's backend key readable by Prometheus alone", path=m.PROMETHEUS_KEY,
                        mode="0600", user=user, group=user)
    if wanted.backend_tls:  # this host's TLS key (tasks/tls.py), as Prometheus's own file: it runs as prometheus
        key_tls = secret_file(name="Prometheus's TLS key (0600)", dest=m.PROMETHEUS_TLS_KEY,
                              content=pki.host_key_pem(ca_of(plan.settings), plan.name))
        managed_permissions(name="Prometheus's TLS key readable by Prometheus alone", path=m.PROMETHEUS_TLS_KEY,
                            mode="0600", user=user, group=user)
    files = [managed_file(name="Prometheus alert rules", content=wanted.rules(), dest=m.PROMETHEUS_RULES, mode="0644"),
             managed_file(name="Prometheus config", content=wanted.config(), dest=m.PROMETHEUS_CONFIG, mode="0644")]
    if any(op.will_change for op in files):
        server.shell(name="Prometheus config and rules pass promtool",
                     commands=[f"promtool check config --syntax-only {m.PROMETHEUS_CONFIG} >/dev/null && "
                               f"promtool check rules {m.PROMETHEUS_RULES} >/dev/null"])
    # the office status page: Prometheus reads a console template at each request (a change needs no reload)
    managed_directory(name="Prometheus consoles (the status page)", path=m.PROMETHEUS_CONSOLES, mode="0755")
    managed_directory(name="Prometheus console libraries (none needed)", path=m.PROMETHEUS_CONSOLE_LIBRARIES,
                      mode="0755")
    for dest, content in console_files().items():
        managed_file(name="The status page (a console template)", content=content, dest=dest, mode="0644")
    if wanted.alertmanager:
        _alertmanager(wanted)
    unit = managed_file(name="Prometheus unit", content=wanted.unit(), dest=m.PROMETHEUS_UNIT_PATH, mode="0644")
    started = managed_unit(name=f"Prometheus on 127.0.0.1:{s.monitoring_port}", service=m.PROMETHEUS_UNIT_NAME,
                           running=True, enabled=True, restarted=unit.will_change,
                           reloaded=not unit.will_change and any(op.will_change for op in (*files, key)),
                           daemon_reload=unit.will_change)
    if started.will_change or unit.will_change:
        server.shell(name="Prometheus is ready",
                     commands=[_ready("Prometheus", s.monitoring_port, s.health_timeout_s)])


def _alertmanager(wanted) -> None:
    """Alertmanager (Debian's package, its own unit on loopback, no cluster port): every alert to the webhook,
    whose URL is a secret (a 0600 file owned by prometheus, never in the plan or the unit)."""
    user = m.PROMETHEUS_USER
    managed_packages(name="Alertmanager installed (Debian's unit masked first: it never starts)",
                     packages=[m.ALERTMANAGER_PACKAGE], masked=[paths.MONITORING_PACKAGES[m.ALERTMANAGER_PACKAGE]],
                     extra_install_args="--no-install-recommends")
    managed_unit(name="Debian's prometheus-alertmanager.service off (it listens on every address)",
                 service=paths.MONITORING_PACKAGES[m.ALERTMANAGER_PACKAGE], running=False, enabled=False)
    managed_directory(name="Alertmanager config directory", path=m.ALERTMANAGER_DIR, mode="0750", user="root",
                      group=user)
    managed_directory(name="Alertmanager data directory", path=m.ALERTMANAGER_DATA, mode="0750", user=user, group=user)
    config = secret_file(name="Alertmanager config (0600: its webhook)", dest=m.ALERTMANAGER_CONFIG,
                         content=wanted.alertmanager_config())
    managed_permissions(name="Alertmanager config readable by it alone", path=m.ALERTMANAGER_CONFIG, mode="0600",
                        user=user, group=user)
    unit = managed_file(name="Alertmanager unit", content=wanted.alertmanager_unit(),
                        dest=m.ALERTMANAGER_UNIT_PATH, mode="0644")
    managed_unit(name=f"Alertmanager on 127.0.0.1:{wanted.settings.alertmanager_port}",
                 service=m.ALERTMANAGER_UNIT_NAME,
                 running=True, enabled=True, restarted=unit.will_change,
                 reloaded=not unit.will_change and config.will_change, daemon_reload=unit.will_change)
