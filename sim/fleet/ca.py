"""The simulated fleet's CA (TLS on every backend hop, sparkfleet/fleet/pki.py): made once under the fleet's state
directory (.sim/, or .sim/fleets/NAME/), as `sparkfleet init` makes a real office's beside its secrets; `sim down`
removes it with the rest of the state. The inventories (inventory/sim.py) load this file by path and call
`fleet_ca`; it needs only the controller's sparkfleet, never a container."""

from __future__ import annotations

from pathlib import Path


def fleet_ca(state_dir: str | Path) -> tuple[str, str]:
    """(certificate, key) paths of the fleet's CA in `state_dir`, made there on the first call and kept after."""
    from sparkfleet.fleet.pki import write_ca

    crt, key = Path(state_dir) / "fleet-ca.crt", Path(state_dir) / "fleet-ca.key"
    write_ca(crt, key)
    return str(crt), str(key)
