"""The short soak (`python -m tools.soak --short`, issue 35) on the shared converged fleet with its front door: steady
traffic from three users while an engine is frozen, another frozen seconds after its restart, one killed and the
door's network to a host cut; every goal must be met, and the fleet is left as found (every fault put back, every
engine serving, the door on the fixture's users). About 4 minutes of load, plus the soak's setup and its converge
afterwards."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sparkfleet.roles.front_door.plan import CHECK
from tests.waiting import wait_until

from .conftest import HOSTS, ROOT, fleet_out_of_step
from .test_front_door import backend_states, door  # noqa: F401  (the fixture: the fleet converged with its door)

pytestmark = pytest.mark.e2e


def test_the_short_soak_meets_every_goal_and_leaves_the_fleet_as_it_found_it(door, sim_fleet, tmp_path):  # noqa: F811
    inventory, _ = door
    report_path, plot_path = tmp_path / "soak.json", tmp_path / "soak.png"
    proc = subprocess.run([sys.executable, "-m", "tools.soak", inventory, "--short", "--json", str(report_path),
                           "--plot", str(plot_path)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    print(proc.stdout[-6000:])
    assert report_path.exists(), f"the soak wrote no report (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    report = json.loads(report_path.read_text())
    failing = {g["name"]: g["detail"] for g in report["goals"] if not g["ok"]}
    assert proc.returncode == 0 and failing == {}, (failing, proc.stderr[-3000:])
    assert sorted(f["fault"] for f in report["faults"]) == sorted(["engine-frozen", "frozen-after-restart",
                                                                    "engine-killed", "door-network-cut"])
    assert all(f["serving_again_s"] is not None for f in report["faults"]), report["faults"]
    # a frozen or killed engine is routed around within twice the door's own bound: it marks it down after `fall`
    # checks in a row each timed out (the guard's answer waits for /metrics: issue 54), the first within `inter`, the
    # next `fastinter` apart; 7.5 s today, 15 s with the slack a loaded 2-core CI run needs (10.5 s seen). The goals
    # above hold the office's side: no non-streaming request fails, none waits past the stall bound (10 s)
    seconds = {k: float(CHECK[k].removesuffix("ms")) / 1000 if CHECK[k].endswith("ms") else float(CHECK[k][:-1])
               for k in ("inter", "fastinter", "timeout")}
    bound = 2 * (seconds["inter"] + CHECK["fall"] * seconds["timeout"] + (CHECK["fall"] - 1) * seconds["fastinter"])
    for fault in (f for f in report["faults"] if f["fault"] in ("engine-frozen", "engine-killed")):
        assert fault["noticed_by"] == "front door" and fault["noticed_s"] - fault["injected_s"] <= bound, fault
    # issue 54: no non-streaming request started after a freeze waits past the stall bound (the door ends what the
    # frozen engine held at its mark-down and sends it elsewhere)
    stall = next(g for g in report["goals"] if g["name"] == "no stall")
    assert stall["ok"], stall
    assert report["run"]["requests"] >= 100, report["run"]
    assert plot_path.read_bytes().startswith(b"\x89PNG")
    # left as found: every host on its release and serving, every backend in, the door's users the fixture's
    assert fleet_out_of_step(sim_fleet) == {}
    wait_until(lambda: backend_states(inventory) == {h: "in" for h in HOSTS}, 60, "every backend back in")
