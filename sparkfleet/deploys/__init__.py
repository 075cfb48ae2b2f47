"""The pyinfra deploy files sparkfleet ships: `deploy.py` (converge) and `rollback.py` (back to the previous release).

They are files pyinfra runs once per host (the fleet commands load them by path, `fleet/converge.py`
`deploy_path`), not modules to import: each calls its stage function. A project's own `deploy.py` or
`rollback.py` in the directory a command runs in takes their place, as with `pyinfra INVENTORY deploy.py`.
"""
