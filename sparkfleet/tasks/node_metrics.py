"""Stage 6b (every Spark, when the inventory has a monitoring host; after the watchdog, whose state it reports):
Debian's node exporter on loopback, and a timer writing the GB10's and the watchdog's state for its textfile
collector (sparkfleet/roles/monitoring.py `node_metrics_state`). Debian's own unit, which listens on every address,
is masked before the install (it never starts) and kept off; the LAN reaches the exporter only through the guard's
/node/metrics, with the backend key. A changed unit is a restart.
"""

from pyinfra.api import deploy

from sparkfleet.release.plan import HostPlan
from sparkfleet.roles.monitoring import node_metrics_state
from sparkfleet.tasks.ensure import ensure
from sparkfleet.tasks.tls import host_tls


@deploy("Node metrics")
def node_metrics(plan: HostPlan):
    # when its fleet certificate ends (the guard stage put it): the alert TlsCertificateExpiring
    ensure(node_metrics_state(host_tls(plan).cert))
