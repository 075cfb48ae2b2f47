"""The env files sparkfleet writes (engine.env, hub.env): the one owner of their format.

Rendered by the controller (contract/formats.py), read by the helpers (the API key, as the serving file names its
variable), and edited on the host by a rollback (`env-keep`, `env-restore`: files in, files out, no secret on a
command line; the package's cli.py).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SPLITS_A_LINE = re.compile(r"[\x00-\x1f\x7f]")  # a control character: a value holding one is not one line

# engine.env holds the API key under the variable its engine reads (the controller's engine descriptors,
# sparkfleet/contract/engines.py), or none where the engine reads none. The helpers learn that variable from the
# serving file (`api_key_var`, null: none), the rollback's edit too (the serving file's path is its argument);
# a serving file written before that field (an older converge) had the key under one of these, which is all this
# module names.
LEGACY_KEY_VARS = ("VLLM_API_KEY", "LLAMA_API_KEY")


def serving_key_vars(serving: dict) -> tuple:
    """The engine.env variables that hold the engine's API key, as the serving file names them: its `api_key_var`
    (null or not a variable name: none), or LEGACY_KEY_VARS for a serving file written before that field."""
    if "api_key_var" not in serving:
        return LEGACY_KEY_VARS
    var = serving["api_key_var"]
    return (var,) if isinstance(var, str) and _ENV_NAME.fullmatch(var) else ()


def serving_file_key_vars(path) -> tuple:
    """serving_key_vars of the serving file at `path`; LEGACY_KEY_VARS when it is absent or unreadable (names only:
    what a rollback's edit treats as the key, never a value)."""
    try:
        value = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return LEGACY_KEY_VARS
    return serving_key_vars(value) if isinstance(value, dict) else LEGACY_KEY_VARS


def engine_api_key(env: dict, key_vars=LEGACY_KEY_VARS):
    """The API key of an engine.env under the first of `key_vars` (serving_key_vars) set; None when there is none."""
    return next((env[var] for var in key_vars if env.get(var)), None)


KEPT_NAME = "#key "  # a kept env's line naming an engine_env variable whose value a rollback takes from today's file


def render_env(header: str, values: dict) -> str:
    """An env file as `docker run --env-file` reads it: a comment, then one NAME=value a line, values verbatim.
    A name outside [A-Za-z0-9_] or a value with a control character would split or hide a line: refused (the
    error names the variable, never its value)."""
    lines = [f"# {header}"]
    for name, value in values.items():
        if not _ENV_NAME.fullmatch(name) or _SPLITS_A_LINE.search(str(value)):
            raise ValueError(f"env file variable {name!r}: needs a name of [A-Za-z0-9_] and a one-line value")
        lines.append(f"{name}={value}")
    return "\n".join(lines) + "\n"


def _env_entry(line: str):
    """(name, value) of a NAME=value line; None for a comment, a blank line or a line without '='."""
    name, eq, value = line.partition("=")
    if not eq or line.lstrip().startswith("#"):
        return None
    return name.strip(), value


def parse_env(text: str) -> dict:
    """NAME=value lines, values verbatim as `docker run --env-file` reads them; comments skipped."""
    return dict(entry for entry in map(_env_entry, text.splitlines()) if entry)


def read_env_file(path) -> dict:
    """parse_env of an env file sparkfleet wrote; {} when the file is absent or unreadable."""
    try:
        return parse_env(Path(path).read_text())
    except OSError:
        return {}


def env_kept(live: str, fabric, key_vars=LEGACY_KEY_VARS) -> str:
    """What a rollback keeps of the running release's engine env: its fabric lines (a group member's, derived from
    the release) and, as KEPT_NAME lines, the names of its other variables, never their values nor the API key
    (`key_vars`: serving_file_key_vars)."""
    kept = []
    for line in live.splitlines():
        entry = _env_entry(line)
        if entry and entry[0] in fabric:
            kept.append(line)
        elif entry and entry[0] not in key_vars:
            kept.append(KEPT_NAME + entry[0])
    return "".join(f"{line}\n" for line in kept)


def env_restored(kept: str, live: str, fabric, key_vars=LEGACY_KEY_VARS) -> str:
    """The engine env of a rolled-back release: today's comments, API key and today's values of the kept names
    (a name the kept release lacked is left out, so is one today's file dropped), then the kept fabric lines.
    A kept file of an older rule holds NAME=value lines: only their names are read."""
    names, fabric_lines = set(), []
    for line in kept.splitlines():
        entry = None if line.startswith(KEPT_NAME) else _env_entry(line)
        if line.startswith(KEPT_NAME):
            names.add(line[len(KEPT_NAME):].strip())
        elif entry and entry[0] in fabric:
            fabric_lines.append(line)
        elif entry:
            names.add(entry[0])
    restored = []
    for line in live.splitlines():
        entry = _env_entry(line)
        if entry is None or (entry[0] not in fabric and (entry[0] in key_vars or entry[0] in names)):
            restored.append(line)
    return "".join(f"{line}\n" for line in restored + fabric_lines)


def write_private(path, text: str) -> None:
    """Replace a file atomically with a root-only (0600) one: never readable by others, never half-written."""
    staged = Path(f"{path}.sparkfleet-new")
    staged.unlink(missing_ok=True)
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(staged, path)


def keep_env(live, kept, fabric, key_vars=LEGACY_KEY_VARS) -> None:
    """Before a new release replaces the running one: its engine env set aside (env_kept)."""
    write_private(kept, env_kept(Path(live).read_text(), fabric, key_vars))


def restore_env(live, kept, fabric, key_vars=LEGACY_KEY_VARS) -> None:
    """A rollback's env swap: the kept release's env written from today's (env_restored), and the running one's
    kept in turn, so a second rollback returns."""
    live_text, kept_text = Path(live).read_text(), Path(kept).read_text()
    write_private(live, env_restored(kept_text, live_text, fabric, key_vars))
    write_private(kept, env_kept(live_text, fabric, key_vars))
