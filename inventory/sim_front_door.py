"""The simulated fleet (inventory/sim.py) with a front door (HAProxy) on door-1, a service host: a plain Debian
box beside the Sparks (no GPU, no Docker), in the groups front_door and monitoring. `make demo` runs it.

    pyinfra inventory/sim_front_door.py deploy.py
    python -m tools.bench_front_door inventory/sim_front_door.py --chat

The Sparks are its backends. The sim publishes door-1's port 8080 on a free 127.0.0.1 port; `docker port` says which.
"""

import runpy as _runpy
import subprocess as _subprocess
from pathlib import Path as _Path

_here = _Path(__file__).resolve().parent
_sim = _runpy.run_path(str(_here / "sim.py"))
_state = _sim["_state"]  # the selected fleet's state.json (SPARKFLEET_SIM_FLEET)
_doors = _state.get("service_hosts") or []
if not _doors:
    raise RuntimeError("the simulated fleet has no service host door-1: recreate it (`python -m sim down; "
                       "python -m sim up`)")
_door_host = _doors[0]
_POWERED_OFF = "http://127.0.0.1:1"  # where nothing listens: the controller's requests fail as to a host that is off


def _published(container: str) -> str:
    """Where this machine reaches a door's own port 8080: the sim publishes it on a free 127.0.0.1 port at each
    start (`docker port` says which). A stopped door (a powered-off host) publishes none: the inventory still loads
    (status, usage and the soak read it while a door is lost), and what asks that door fails to connect."""
    found = _subprocess.run(["docker", "port", container, "8080/tcp"], capture_output=True, text=True,
                            check=False).stdout.split()
    if found:
        return f"http://{found[0]}"
    running = _subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", container], capture_output=True,
                              text=True, check=False).stdout.strip()
    if running == "false":
        return _POWERED_OFF
    raise RuntimeError(f"{container} publishes no port 8080: recreate the simulated fleet "
                       "(`python -m sim down; python -m sim up`)")


_door = {
    "front_door_users": {"demo": "demo-user-key-0123456789", "guest": "guest-user-key-0123456789"},
    "controller_front_door_url": _published(_door_host["container"]),
    "drain_timeout_s": 30,
    "front_door_allow_http": True,  # the sim's LAN is this machine's Docker network
}
sparks = _sim["sparks"]
front_door = [(_door_host["name"], {**_sim["_common"], "ssh_port": _door_host["ssh_port"],
                                    "lan_address": _door_host["container"], **_door})]
monitoring = [_door_host["name"]]  # Prometheus's host (the monitoring stage)
