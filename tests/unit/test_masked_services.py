"""Debian's Prometheus, node exporter and Alertmanager start their own units (on every address) at install: each
role's desired state masks that unit in the install's own step, before apt runs (the operation's commands:
tests/unit/operations/managed_packages/masked_*.yaml), so it never starts, and keeps it off after."""

from sparkfleet.contract import monitoring as m
from sparkfleet.contract import paths
from sparkfleet.release.plan import plan_hosts
from sparkfleet.roles.desired import Packages, Unit
from sparkfleet.roles.monitoring import monitoring_state, node_metrics_state

from .helpers import KEY, host_data


def installs(state) -> dict[str, list[str]]:
    return {package: list(step.masked) for package, step in state.packages.items()}


def kept_off(state, unit: str) -> bool:
    """The Debian unit is turned off (stopped, disabled) by a step after its package's install."""
    steps = list(state.steps)
    install = next(i for i, s in enumerate(steps) if isinstance(s, Packages) and unit in s.masked)
    off = [i for i, s in enumerate(steps) if isinstance(s, Unit) and s.service == unit]
    return off == [install + 1] and (steps[off[0]].running, steps[off[0]].enabled) == (False, False)


def test_the_node_exporters_debian_unit_is_masked_by_its_install():
    state = node_metrics_state(None)
    assert installs(state) == {m.NODE_EXPORTER_PACKAGE: ["prometheus-node-exporter.service"]}
    assert kept_off(state, "prometheus-node-exporter.service")


def test_prometheus_and_alertmanagers_debian_units_are_masked_by_their_installs():
    data = host_data(api_host="0.0.0.0", api_key=KEY, alertmanager_webhook_url="http://alerts.lan:9000/hook")
    plans = {p.name: p for p in plan_hosts([("mon-1", data)], resolve=False)}
    state = monitoring_state("mon-1", plans, {"mon-1": {"all", "monitoring"}})
    assert installs(state) == {m.PROMETHEUS_PACKAGE: ["prometheus.service"],
                               m.ALERTMANAGER_PACKAGE: ["prometheus-alertmanager.service"]}
    assert kept_off(state, "prometheus.service") and kept_off(state, "prometheus-alertmanager.service")
    assert set(paths.MONITORING_PACKAGES.values()) == {"prometheus.service", "prometheus-node-exporter.service",
                                                       "prometheus-alertmanager.service"}  # Debian's unit names
