"""The pyinfra deploy files sparkfleet ships: `deploy.py` (converge), `rollback.py` (back to the previous release),
`upgrade.py` (`sparkfleet upgrade`'s per-host step: apt upgrade within the pins, a reboot where needed)
and `stage.py` (a rollout's first phase: the new release made ready while the host serves).

They are files pyinfra runs once per host (the fleet commands load them by path, `fleet/converge.py`
`deploy_path`), not modules to import: each calls its stage function. A project's own `deploy.py`,
`rollback.py` or `stage.py` in the directory a command runs in takes their place, as with `pyinfra INVENTORY deploy.py`.
"""
