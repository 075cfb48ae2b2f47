"""The host package (files/sparkfleet_host/), loaded on the controller from the very files the hosts run.

One owner for what hosts and controller must agree on: import a room from here (`from sparkfleet.contract.shared
import verify`) and call it there, never copy its rules. The package is registered as `sparkfleet_host`, the name
the helper scripts import it by, so a helper loaded in this process shares these very modules.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from sparkfleet import FILES_DIR

PACKAGE_NAME = "sparkfleet_host"
PACKAGE_DIR = FILES_DIR / PACKAGE_NAME  # `python3 PACKAGE_DIR ...` runs its cli (its __main__.py)


def package_files(directory: Path = PACKAGE_DIR) -> list[str]:
    """The package's module files, as shipped to a host (one managed file each): every *.py, no cache."""
    return sorted(p.name for p in directory.glob("*.py"))


def _load() -> ModuleType:
    if PACKAGE_NAME in sys.modules:
        return sys.modules[PACKAGE_NAME]
    spec = importlib.util.spec_from_file_location(PACKAGE_NAME, PACKAGE_DIR / "__init__.py",
                                                  submodule_search_locations=[str(PACKAGE_DIR)])
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the host package from {PACKAGE_DIR}")
    package = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE_NAME] = package
    spec.loader.exec_module(package)
    return package


def _room(name: str) -> ModuleType:
    _load()
    return importlib.import_module(f"{PACKAGE_NAME}.{name}")


verify = _room("verify")
envfiles = _room("envfiles")
memory = _room("memory")
eviction = _room("eviction")
docker = _room("docker")
sockets = _room("sockets")
probes = _room("probes")
backup = _room("backup")
