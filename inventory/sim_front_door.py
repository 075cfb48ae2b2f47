"""The simulated fleet (inventory/sim.py) with a front door (HAProxy) and Prometheus on spark-1, as `make demo` runs it.

    pyinfra inventory/sim_front_door.py deploy.py --limit front_door
    python -m tools.bench_front_door inventory/sim_front_door.py --chat

The sim publishes each host's port 8080 on a free 127.0.0.1 port; `docker port` says which.
"""

import runpy as _runpy
import subprocess as _subprocess
from pathlib import Path as _Path

_here = _Path(__file__).resolve().parent
_sim = _runpy.run_path(str(_here / "sim.py"))
_state = _sim["_state"]  # the selected fleet's state.json (SPARKFLEET_SIM_FLEET)
_published = _subprocess.run(["docker", "port", _state["hosts"][0]["container"], "8080/tcp"],
                             capture_output=True, text=True, check=False).stdout.split()
if not _published:
    raise RuntimeError("spark-1 publishes no port 8080: recreate the simulated fleet (`python -m sim down; "
                       "python -m sim up`)")

_door = {
    "front_door_users": {"demo": "demo-user-key-0123456789", "guest": "guest-user-key-0123456789"},
    "controller_front_door_url": f"http://{_published[0]}",
    "drain_timeout_s": 30,
    "front_door_allow_http": True,  # the sim's LAN is this machine's Docker network
}
sparks = [(name, {**data, **_door}) for name, data in _sim["sparks"]]
front_door = sparks[:1]
monitoring = front_door  # Prometheus beside the front door (another host once the sim has a non-Spark one)
