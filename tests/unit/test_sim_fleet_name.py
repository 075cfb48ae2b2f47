"""A fleet name (SPARKFLEET_SIM_FLEET, `python -m sim --fleet NAME`) gives a second simulated fleet names of its
own, and leaves the default fleet's exactly as they were; no Docker needed (the names are fixed at import)."""

from __future__ import annotations

import ipaddress
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from sim import select_fleet

ROOT = Path(__file__).resolve().parents[2]
NAMES = ("import json; from sim.fleet import fleet as f; print(json.dumps({'container': f.container_name('spark-1'), "
         "'services': f.SERVICES, 'network': f.NETWORK, 'fabric': f.FABRIC_NETWORK, 'subnet': str(f.FABRIC_SUBNET), "
         "'address': f.fabric_address('spark-2'), 'state': str(f.STATE_FILE), 'key': str(f.SSH_KEY), "
         "'label': f.LABEL}))")


def names(fleet: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "SPARKFLEET_SIM_FLEET"}
    if fleet is not None:
        env["SPARKFLEET_SIM_FLEET"] = fleet
    out = subprocess.run([sys.executable, "-c", NAMES], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True, timeout=60).stdout
    return json.loads(out)


def test_the_default_fleet_keeps_its_names_and_two_named_fleets_share_none():
    default = {"container": "sparkfleet-spark-1", "services": "sparkfleet-services", "network": "sparkfleet-sim",
               "fabric": "sparkfleet-sim-fabric", "subnet": "10.200.77.0/24", "address": "10.200.77.12",
               "state": str(ROOT / ".sim" / "state.json"), "key": str(ROOT / ".sim" / "id_ed25519"),
               "label": "sparkfleet.sim"}
    assert names(None) == names("") == names("default") == default
    a, b = names("h6a"), names("h6b")
    assert a["container"] == "sparkfleet-h6a-spark-1" and a["state"] == str(ROOT / ".sim/fleets/h6a/state.json")
    for key in default:
        assert len({default[key], a[key], b[key]}) == 3, key
    for fleet in (a, b):
        subnet = ipaddress.ip_network(fleet["subnet"])
        assert subnet.prefixlen == 24 and subnet.subnet_of(ipaddress.ip_network("10.200.0.0/16"))
        assert ipaddress.ip_address(fleet["address"]) in subnet
        # the default fleet's label is no prefix of a named fleet's: its `down` (a label filter) spares them
        assert fleet["label"].startswith("sparkfleet.sim.") and not fleet["label"].endswith(".role")


def test_a_bad_fleet_name_is_one_line_and_exit_2():
    proc = subprocess.run([sys.executable, "-m", "sim", "--fleet", "Bad_Name", "status"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "error: fleet name 'Bad_Name': use 1-12 lowercase letters and digits starting with a letter "
        "(SPARKFLEET_SIM_FLEET or --fleet)"]


def test_select_fleet_takes_the_option_out_of_the_arguments(monkeypatch):
    monkeypatch.delenv("SPARKFLEET_SIM_FLEET", raising=False)
    assert select_fleet(["up", "--hosts", "3"]) == ["up", "--hosts", "3"]
    assert "SPARKFLEET_SIM_FLEET" not in os.environ
    assert select_fleet(["--fleet", "b", "up", "--hosts", "3"]) == ["up", "--hosts", "3"]
    assert os.environ["SPARKFLEET_SIM_FLEET"] == "b"
    assert select_fleet(["status", "--fleet=c", "--json"]) == ["status", "--json"]
    assert os.environ["SPARKFLEET_SIM_FLEET"] == "c"


def test_the_inventory_reads_the_selected_fleets_state(monkeypatch):
    monkeypatch.setenv("SPARKFLEET_SIM_FLEET", "nosuchfleet")
    with pytest.raises(RuntimeError) as err:
        runpy.run_path(str(ROOT / "inventory" / "sim.py"))
    assert "python -m sim --fleet nosuchfleet up" in str(err.value)
    assert str(ROOT / ".sim" / "fleets" / "nosuchfleet" / "state.json") in str(err.value)
