"""`plan --host`/`--limit`: the hosts left out are planned for the checks across hosts as the selected ones are
(resolved from the lock, offline only with --offline). Planned offline, a host whose recipe brings the model's
facts was fitted against the recipe's checkpoint instead of what its hub serves, and `plan --host` refused the
whole simulated fleet (tests/e2e/test_speculative.py)."""

from __future__ import annotations

from types import SimpleNamespace

from sparkfleet.commands import plan as plan_command
from sparkfleet.controller import checks, inventory


def test_the_hosts_left_out_are_planned_as_the_selected_ones(monkeypatch):
    everyone = [("spark-1", {}), ("spark-2", {})]
    calls = []
    monkeypatch.setattr(inventory, "load_hosts", lambda path, limit=None: everyone)
    monkeypatch.setattr(inventory, "locked_plans", lambda hosts: calls.append(("locked", hosts)) or [])
    monkeypatch.setattr("sparkfleet.release.plan.plan_hosts", lambda hosts: calls.append(("offline", hosts)) or [])
    monkeypatch.setattr(checks, "check_inventory", lambda hosts, plans: (hosts, plans))
    for offline, how in ((False, "locked"), (True, "offline")):
        calls.clear()
        args = SimpleNamespace(inventory="inv.py", limit=["spark-1"], data=[], offline=offline)
        checked, _ = plan_command.inventory_checks(args, everyone[:1], [])
        assert [name for name, _ in checked] == ["spark-1", "spark-2"]
        assert [(way, [name for name, _ in hosts]) for way, hosts in calls] == [(how, ["spark-1", "spark-2"])]
