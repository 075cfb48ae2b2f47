"""The simulated fleet with two front doors sharing one address: door-1 and door-2 (service hosts) in the group
front_door, keepalived moving the floating address between them, HAProxy's peers keeping the users' limits the
same on both, and TLS with the fleet CA's certificates on every hop to a guard. `make demo` ends with it.

    python -m sim up --service-hosts 2
    pyinfra inventory/sim_two_doors.py deploy.py

The floating address is on the sim's LAN (its Docker network), which this machine reaches over the bridge: clients
use http://<floating address>:8080, whichever door holds it; `status` and `usage` ask each door at its own port.
Prometheus stays on door-1 (inventory/sim_front_door.py).
"""

import runpy as _runpy
from pathlib import Path as _Path

_one = _runpy.run_path(str(_Path(__file__).resolve().parent / "sim_front_door.py"))
_state = _one["_state"]
_doors = _state.get("service_hosts") or []
if len(_doors) < 2 or "lan" not in _state:
    raise RuntimeError("the simulated fleet has one service host: bring up two (`python -m sim up --service-hosts 2`)")
_tls = {"backend_key_in_clear": False}  # every hop to a guard TLS, the key never in clear (inventory/sim.py's CA)
_door_data = {**_one["front_door"][0][1], **_tls, "front_door_address": _state["lan"]["floating_address"]}
_published = _one["_published"]  # each door's own port 8080 (`status` and `usage` ask each door)


sparks = [(_name, {**_data, **_tls}) for _name, _data in _one["sparks"]]
front_door = [(_h["name"], {**_door_data, "ssh_port": _h["ssh_port"], "lan_address": _h["container"],
                            "controller_front_door_url": _published(_h["container"])}) for _h in _doors[:2]]
monitoring = _one["monitoring"]
