"""sparkfleet: provision DGX Sparks as verified vLLM servers with pyinfra."""

from pathlib import Path

__version__ = "0.2.0"

_PACKAGE = Path(__file__).resolve().parent


def _resource(name: str) -> Path:
    """Installed, the templates, host files and stages ship inside the package; in a checkout they sit beside it."""
    inside = _PACKAGE / name
    return inside if inside.is_dir() else _PACKAGE.parent / name


TEMPLATES_DIR = _resource("templates")
FILES_DIR = _resource("files")
DEFAULTS_FILE = _resource("group_data") / "all.py"
RECIPES_DIR = _resource("recipes")  # the recipe catalogue: one TOML file per recipe
# The project a command works in: this checkout, or (installed) the current directory.
PROJECT_ROOT = _PACKAGE.parent if (_PACKAGE.parent / "deploy.py").exists() else Path.cwd()
