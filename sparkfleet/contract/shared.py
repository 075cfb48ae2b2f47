"""The host module (files/sparkfleet_host.py), loaded on the controller from the very file the hosts run.

One owner for what hosts and controller must agree on: import it from here
(`from sparkfleet.contract.shared import host_module`), never copy its rules.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from sparkfleet import FILES_DIR

MODULE_NAME = "sparkfleet_host"
MODULE_FILE = FILES_DIR / f"{MODULE_NAME}.py"


def _load() -> ModuleType:
    if MODULE_NAME in sys.modules:
        return sys.modules[MODULE_NAME]
    spec = importlib.util.spec_from_file_location(MODULE_NAME, MODULE_FILE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE_NAME] = module
    spec.loader.exec_module(module)
    return module


host_module = _load()
