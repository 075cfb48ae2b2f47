"""Stage 6b (every Spark, when the inventory has a monitoring host; after the watchdog, whose state it reports):
Debian's node exporter on loopback, and a timer writing the GB10's and the watchdog's state for its textfile
collector (sparkfleet/roles/monitoring.py). Debian's own unit, which listens on every address, is masked before the
install (it never starts) and kept off; the LAN reaches the exporter only through the guard's /node/metrics, with the
backend key. A changed unit is a restart.
"""

from pyinfra.api import deploy

from sparkfleet import FILES_DIR
from sparkfleet.contract import monitoring as m
from sparkfleet.contract import paths
from sparkfleet.roles.monitoring import node_exporter_unit, textfile_units
from sparkfleet.host.managed import managed_directory, managed_file, managed_packages, managed_unit
from sparkfleet.roles import pki
from sparkfleet.release.plan import HostPlan
from sparkfleet.tasks.tls import host_tls


@deploy("Node metrics")
def node_metrics(plan: HostPlan):
    managed_packages(name="Node exporter installed (Debian's unit masked first: it never starts)",
                     packages=[m.NODE_EXPORTER_PACKAGE], masked=[paths.MONITORING_PACKAGES[m.NODE_EXPORTER_PACKAGE]],
                     extra_install_args="--no-install-recommends")
    managed_unit(name="Debian's prometheus-node-exporter.service off (it listens on every address)",
                 service=paths.MONITORING_PACKAGES[m.NODE_EXPORTER_PACKAGE], running=False, enabled=False)
    managed_directory(name="Textfile collector directory", path=m.TEXTFILE_DIR, mode="0755")
    tls = host_tls(plan)
    if tls.cert:  # when its fleet certificate ends: the alert TlsCertificateExpiring (roles/monitoring.py)
        managed_file(name="This host's certificate expiry (textfile)", content=pki.expiry_metric(tls.cert),
                     dest=paths.TLS_EXPIRY_TEXTFILE, mode="0644")
    script = managed_file(name="Helper sparkfleet-textfile", src=str(FILES_DIR / "sparkfleet-textfile"),
                          dest=m.TEXTFILE, mode="0755")
    service, timer_text = textfile_units()
    reader = managed_file(name="Textfile unit", content=service, dest=paths.unit_path(m.TEXTFILE_UNIT), mode="0644")
    timer = managed_file(name="Textfile timer", content=timer_text, dest=paths.unit_path(m.TEXTFILE_TIMER),
                         mode="0644")
    managed_unit(name="Textfile timer on", service=m.TEXTFILE_TIMER, running=True, enabled=True,
                 restarted=timer.will_change or reader.will_change or script.will_change,
                 daemon_reload=timer.will_change or reader.will_change)
    unit = managed_file(name="Node exporter unit", content=node_exporter_unit(), dest=m.NODE_EXPORTER_UNIT_PATH,
                        mode="0644")
    managed_unit(name="Node exporter on 127.0.0.1", service=m.NODE_EXPORTER_UNIT_NAME, running=True, enabled=True,
                 restarted=unit.will_change, daemon_reload=unit.will_change)
