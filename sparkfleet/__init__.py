"""sparkfleet: provision DGX Sparks as verified vLLM servers with pyinfra."""

from pathlib import Path

__version__ = "0.2.0"

_PACKAGE = Path(__file__).resolve().parent


def _resource(name: str) -> Path:
    """Installed, the templates, host files, defaults and recipes ship inside the package; in a checkout they sit
    beside it."""
    inside = _PACKAGE / name
    return inside if inside.is_dir() else _PACKAGE.parent / name


TEMPLATES_DIR = _resource("templates")
FILES_DIR = _resource("files")
DEFAULTS_FILE = _resource("group_data") / "all.py"
RECIPES_DIR = _resource("recipes")  # the recipe catalogue: one TOML file per recipe
DEPLOYS_DIR = _PACKAGE / "deploys"  # the deploy files the fleet commands run when the project has none of its own
# The project outside a command, as for `pyinfra`: this checkout (its deploy.py beside the package) or, installed,
# the current directory. A command given an INVENTORY works in the inventory's project instead, wherever it runs
# from (controller/inventory.py `project_of`, `project_for`): its group_data/, deploy.py, lock and .cache/.
PROJECT_ROOT = _PACKAGE.parent if (_PACKAGE.parent / "deploy.py").exists() else Path.cwd()
