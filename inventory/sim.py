"""The simulated fleet (sim/): Spark containers reached over SSH on 127.0.0.1.

Bring it up first:  python -m sim up [--hosts N]
then:               pyinfra inventory/sim.py deploy.py

Reads .sim/state.json (written by `sim up`); with SPARKFLEET_SIM_FLEET=NAME, the named
fleet's .sim/fleets/NAME/state.json (`python -m sim --fleet NAME up`). Every module-level
list is a pyinfra group; names starting with "_" are not.
"""

import json as _json
import os as _os
from pathlib import Path as _Path

from sparkfleet.roles.pki import write_ca as _write_ca

_SIM = _Path(__file__).resolve().parents[1] / ".sim"
_FLEET = _os.environ.get("SPARKFLEET_SIM_FLEET", "").strip()
_STATE_FILE = (_SIM / "fleets" / _FLEET if _FLEET not in ("", "default") else _SIM) / "state.json"

try:
    _state = _json.loads(_STATE_FILE.read_text())
except FileNotFoundError:
    raise RuntimeError(
        f"the simulated fleet is not up: run `python -m sim{' --fleet ' + _FLEET if _FLEET else ''} up` first "
        f"(no {_STATE_FILE})"
    ) from None

# The release lock of this fleet (sparkfleet.lock), beside its state: `sim down` and a new engine image remove it.
_os.environ.setdefault("SPARKFLEET_LOCK", str(_STATE_FILE.parent / "sparkfleet.lock"))

# The fleet CA, made once per fleet and kept (its hosts' certificates chain to it), outside this checkout as
# `sparkfleet init` makes an office's beside its secrets (a CA key inside a git work tree is refused: roles/pki.py).
# The sim's own inventories keep the backend hops in plain http
# (`backend_key_in_clear`: the sim's LAN is this machine's Docker network), so a door's converge and a Spark's agree
# whichever of them a test runs; inventory/sim_two_doors.py (`make demo`'s last step) turns it off: TLS on every hop.
_ca_dir = _Path.home() / ".config" / "sparkfleet"
_ca_cert, _ca_key = (str(_ca_dir / f"sim-{_FLEET or 'default'}.ca.{ext}") for ext in ("crt", "key"))
_write_ca(_Path(_ca_cert), _Path(_ca_key))

# The fleet's backup password (docs/backups.md), made once per fleet and kept beside its CA, as `sparkfleet init` makes
# an office's: a 0600 file, written only when missing (every source's repository password and key derive from it).
_backup_password = _ca_dir / f"sim-{_FLEET or 'default'}.backup-password"
if not _backup_password.exists():
    from sparkfleet.contract.backup import new_password as _new_password

    try:
        _fd = _os.open(_backup_password, _os.O_WRONLY | _os.O_CREAT | _os.O_EXCL, 0o600)
    except FileExistsError:  # another run of this inventory made it just now
        pass
    else:
        with _os.fdopen(_fd, "w") as _out:
            _out.write(_new_password() + "\n")

_common = {
    "ssh_hostname": "127.0.0.1",
    "fleet_ca_cert": _ca_cert,
    "fleet_ca_key": _ca_key,
    "controller_backup_password_file": str(_backup_password),  # used where the inventory has a `backup` group
    "backend_key_in_clear": True,
    "ssh_user": _state["ssh_user"],
    "ssh_key": _state["ssh_key"],
    "ssh_strict_host_key_checking": "yes",
    "ssh_known_hosts_file": str(_STATE_FILE.parent / "known_hosts"),  # the hosts' keys, written by `sim up`
    # the sim's settings (everything else comes from group_data/all.py)
    "expected_arch": "x86_64",  # the sim runs on x86_64; a real Spark is aarch64
    "min_memory_gib": 4,  # the sim hosts share this machine's memory (24 GiB)
    "hub_endpoint": _state["hub"]["host_url"],
    "controller_hub_endpoint": _state["hub"]["controller_url"],
    "model_repo": _state["hub"]["repo"],
    "toolkit_repo_url": _state["apt"]["repo_url"],
    "toolkit_key_url": _state["apt"]["key_url"],
    "toolkit_key_fingerprint": _state["apt"]["key_fingerprint"],
    "toolkit_version": "1.18.1-1",
    "engine_image": _state["image"],
    "controller_registry_url": f"http://{_state['registry']['controller']}",  # the registry's published port
    "api_host": "0.0.0.0",  # the host's port 8000 is published on the controller's 127.0.0.1
    "api_key": "sim-key",
    "gpu_memory_utilization": 0.3,  # the sim hosts share 24 GiB
    # the vLLM stand-in's pace (sim/engine): the reference decode rate, a 100 ms first token; SIM_* knobs pass
    # engine_env's allow-list only where sim_engine_knobs is set (docs/settings.md, "Engine environment by allow-list")
    "sim_engine_knobs": True,
    "engine_env": {"SIM_TOKENS_PER_S": "50", "SIM_FIRST_TOKEN_DELAY_MS": "100"},
    # Ray on a tensor_parallel_hosts member: one CPU and a 100 MB object store (the sim hosts share 2 cores)
    "ray_start_args": ["--num-cpus", "1", "--object-store-memory", "100000000"],
}

sparks = [
    (
        _h["name"],
        {
            **_common,
            "ssh_port": _h["ssh_port"],
            "lan_address": _h["container"],  # how the other sim hosts reach it (peer model shares)
            # its address on the sim's fabric network (enp1s0f0np0); used only by a tensor_parallel_hosts member
            "fabric_address": _h.get("fabric_address"),  # absent in a state.json from before the fabric
            # where the controller reaches this host's API (127.0.0.1:<published port>)
            "controller_api_url": f"http://127.0.0.1:{_h['api_port']}",
        },
    )
    for _h in _state["hosts"]
]
