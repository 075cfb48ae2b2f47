"""Host data as pyinfra would merge it: group_data/all.py plus overrides."""

import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = {k: v for k, v in runpy.run_path(str(ROOT / "group_data/all.py")).items() if not k.startswith("_")}


def host_data(**overrides):
    return {**DEFAULTS, "ssh_hostname": "10.0.0.9", "ssh_user": "root", **overrides}
