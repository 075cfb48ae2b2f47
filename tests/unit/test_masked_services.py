"""Debian's Prometheus, node exporter and Alertmanager start their own units (on every address) at install: each
stage masks that unit in the install's operation, before apt runs (the operation's commands:
tests/unit/operations/managed_packages/masked_*.yaml), so it never starts."""

import importlib
from types import SimpleNamespace

import pytest

from sparkfleet.contract import monitoring as m
from sparkfleet.contract import paths
monitoring = importlib.import_module("sparkfleet.tasks.monitoring")  # the package's names are the stages
node_metrics = importlib.import_module("sparkfleet.tasks.node_metrics")


class Recorder:
    """Every operation a stage calls, by name, with its keyword arguments; nothing runs."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, op):
        def call(*args, **kwargs):
            self.calls.append((op, kwargs))
            return SimpleNamespace(will_change=False, changed=False, did_change=lambda: False)
        return call


@pytest.fixture
def ops(monkeypatch):
    rec = Recorder()
    for module in (monitoring, node_metrics):
        for op in ("managed_packages", "managed_unit", "managed_directory", "managed_file", "managed_permissions",
                   "secret_file"):
            if hasattr(module, op):
                monkeypatch.setattr(module, op, getattr(rec, op))
    monkeypatch.setattr(monitoring, "server", SimpleNamespace(shell=rec.shell))
    return rec


def installs(rec):
    return {kw["packages"][0]: kw.get("masked") for op, kw in rec.calls if op == "managed_packages"}


def test_the_node_exporters_debian_unit_is_masked_by_its_install(ops):
    node_metrics.node_metrics._inner(SimpleNamespace(name="spark-1", backend_tls=False))
    assert installs(ops) == {m.NODE_EXPORTER_PACKAGE: ["prometheus-node-exporter.service"]}


def test_prometheus_and_alertmanagers_debian_units_are_masked_by_their_installs(ops, monkeypatch):
    wanted = SimpleNamespace(settings=SimpleNamespace(monitoring_port=9090, alertmanager_port=9093,
                                                      health_timeout_s=30),
                             key="k", alertmanager=True, backend_tls=False, rules=lambda: "", config=lambda: "",
                             unit=lambda: "",
                             alertmanager_config=lambda: "", alertmanager_unit=lambda: "")
    monkeypatch.setattr(monitoring, "monitoring_plan", lambda *a: wanted)
    monitoring.monitoring._inner(SimpleNamespace(name="mon-1"), {}, {})
    assert installs(ops) == {m.PROMETHEUS_PACKAGE: ["prometheus.service"],
                             m.ALERTMANAGER_PACKAGE: ["prometheus-alertmanager.service"]}
    assert set(paths.MONITORING_PACKAGES.values()) == {"prometheus.service", "prometheus-node-exporter.service",
                                                       "prometheus-alertmanager.service"}  # Debian's unit names
