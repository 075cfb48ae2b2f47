"""The office's secrets file (the engines' api_key and each user's front door key) and `sparkfleet users`.

The file lives outside the project (sparkfleet init puts it in ~/.config/sparkfleet/), 0600; the inventory
names it in a module-level string, SPARKFLEET_SECRETS, which pyinfra's loader ignores (only lists and tuples
are groups) and which `users` reads from the inventory's source without running it, so a missing file is
still one clear line. Each edit replaces the whole file atomically and keeps every other key as it was.
"""

from __future__ import annotations

import ast
import json
import os
import secrets
import stat
import tempfile
from pathlib import Path

from pydantic import TypeAdapter, ValidationError
from pyinfra.api.exceptions import PyinfraError

from sparkfleet.contract.settings import Name, UserKey

SECRETS_VARIABLE = "SPARKFLEET_SECRETS"
KEY_BYTES = 32  # secrets.token_urlsafe: 43 characters, within UserKey's grammar


class SecretsError(PyinfraError):
    """The secrets file is missing, unreadable or malformed, or a user command cannot apply: one line.

    A PyinfraError, so that raised while pyinfra loads the inventory it prints the line, not a traceback."""


def new_key() -> str:
    return secrets.token_urlsafe(KEY_BYTES)


def new_secrets() -> dict:
    """A fresh project's secrets: the engines' key (only the front doors and this controller hold it), no users."""
    return {"api_key": new_key(), "users": {}}


def read_secrets(path: str | os.PathLike) -> dict:
    """The secrets file as a dict ({"api_key": ..., "users": {name: key}}), checked; what an inventory calls."""
    path = Path(path).expanduser()
    try:
        mode = path.stat().st_mode
        text = path.read_text()
    except FileNotFoundError:
        raise SecretsError(f"no secrets file at {path}: it holds the api_key and users' keys; "
                           "`sparkfleet init` writes one, or fix the path the inventory names") from None
    except OSError as exc:
        raise SecretsError(f"cannot read the secrets file {path} ({exc.strerror}): make it readable by you") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SecretsError(f"the secrets file {path} is open to other users (mode {stat.S_IMODE(mode):04o}): "
                           f"chmod 600 {path}")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise SecretsError(f"the secrets file {path} is not JSON ({exc.msg}, line {exc.lineno}): fix it") from None
    problem = _shape_problem(doc)
    if problem:
        raise SecretsError(f"the secrets file {path}: {problem}")
    return doc


def _shape_problem(doc) -> str | None:
    if not isinstance(doc, dict):
        return 'must be a JSON object {"api_key": "...", "users": {}}'
    if not isinstance(doc.get("api_key"), str) or not doc["api_key"]:
        return '"api_key" must be a non-empty string'
    users = doc.get("users")
    if not isinstance(users, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in users.items()):
        return '"users" must be an object of name -> key strings'
    return None


def write_secrets(path: str | os.PathLike, doc: dict) -> None:
    """Replace the file atomically with a 0600 one (its directory made 0700 when missing)."""
    path = Path(path).expanduser()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mkstemp makes it 0600
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


def secrets_path_of(inventory: str | os.PathLike) -> Path:
    """The secrets file an inventory names (SPARKFLEET_SECRETS = "..."), read from its source, not run."""
    inventory = Path(inventory)
    try:
        tree = ast.parse(inventory.read_text(), filename=str(inventory))
    except FileNotFoundError:
        raise SecretsError(f"no inventory file at {inventory}") from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise SecretsError(f"cannot read the inventory {inventory}: {exc}") from None
    for node in tree.body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == SECRETS_VARIABLE
                                                 for t in node.targets)
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            return Path(node.value.value).expanduser()
    raise SecretsError(f"{inventory} names no secrets file: add {SECRETS_VARIABLE} = \"/path/to/secrets.json\" "
                       "(a plain string; `sparkfleet init` writes it) and read the keys from it")


def check_name(name: str) -> str:
    """A user name as the settings take it (front_door_users' keys): it lands in HAProxy's users map."""
    try:
        return TypeAdapter(Name).validate_python(name)
    except ValidationError as exc:
        raise SecretsError(f"user name {name!r} is invalid: {exc.errors()[0]['msg'].removeprefix('Value error, ')}"
                           ) from None


def names(doc: dict) -> list[str]:
    return sorted(doc["users"])


def _fresh_key(doc: dict) -> str:
    """A key no user holds and that is not the engines' key (a collision is all but impossible; still checked)."""
    taken = {doc["api_key"], *doc["users"].values()}
    while (key := TypeAdapter(UserKey).validate_python(new_key())) in taken:
        pass
    return key


def add(doc: dict, name: str) -> tuple[dict, str]:
    """(the new document, the user's new key); the input is left as it was."""
    name = check_name(name)
    if name in doc["users"]:
        raise SecretsError(f"user {name!r} exists: `sparkfleet users rotate` gives them a new key")
    key = _fresh_key(doc)
    return {**doc, "users": {**doc["users"], name: key}}, key


def rotate(doc: dict, name: str) -> tuple[dict, str]:
    _known(doc, check_name(name))
    key = _fresh_key(doc)
    return {**doc, "users": {**doc["users"], name: key}}, key


def remove(doc: dict, name: str) -> dict:
    _known(doc, check_name(name))
    return {**doc, "users": {k: v for k, v in doc["users"].items() if k != name}}


def _known(doc: dict, name: str) -> None:
    if name not in doc["users"]:
        known = ", ".join(names(doc)) or "none yet"
        raise SecretsError(f"no user {name!r} (users: {known}): `sparkfleet users add` makes one")
