"""The sim's stand-in NVIDIA driver package (sim/fleet/driver.py), built and read back without Docker: what it
installs, its postinst (the version left pending, the reboot asked for), the boot script applying it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sim.fleet import driver
from sim.fleet._util import SimError


def test_versions_are_the_packages():
    assert driver.full_version("580.95.99") == "580.95.99-1"
    assert driver.full_version("580.95.99-0ubuntu1") == "580.95.99-0ubuntu1"
    with pytest.raises(SimError, match="give one like 580.95.99"):
        driver.full_version("580.95.99; rm -rf /")


def test_the_package_leaves_its_version_pending_and_asks_for_a_reboot(tmp_path):
    deb = driver.build_deb("580.95.99-1", tmp_path, "amd64", "sim <sim@sparkfleet-sim.invalid>")
    assert driver.versions(tmp_path) == ["580.95.99-1"]
    control = subprocess.run(["dpkg-deb", "-f", str(deb)], capture_output=True, text=True, check=True).stdout
    assert "Package: nvidia-driver-580-open\nVersion: 580.95.99-1\n" in control
    files = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True).stdout
    assert "./usr/lib/sparkfleet-sim/driver-load" in files and "sparkfleet-sim-driver.service" in files
    subprocess.run(["dpkg-deb", "-e", str(deb), str(tmp_path / "control")], check=True)
    postinst = (tmp_path / "control" / "postinst").read_text()
    assert 'echo "580.95.99" > /etc/sparkfleet-sim/driver.pending' in postinst
    assert "touch /var/run/reboot-required" in postinst


def test_the_boot_script_applies_the_pending_driver_once(tmp_path):
    script = (driver.DRIVER_SRC / "driver-load").read_text()
    pending, knobs = tmp_path / "driver.pending", tmp_path / "gpu.json"
    script = script.replace(driver.PENDING, str(pending)).replace("/etc/sparkfleet-sim/gpu.json", str(knobs))
    knobs.write_text(json.dumps({"driver": "580.95.05", "name": "NVIDIA GB10"}))
    pending.write_text("580.95.99\n")
    subprocess.run([sys.executable, "-c", script], check=True)
    assert json.loads(knobs.read_text()) == {"driver": "580.95.99", "name": "NVIDIA GB10"}
    assert not pending.exists()
    subprocess.run([sys.executable, "-c", script], check=True)  # nothing pending: nothing changes
    assert json.loads(knobs.read_text())["driver"] == "580.95.99"
