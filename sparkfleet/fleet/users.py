"""The office's secrets file (the engines' api_key and each user's front door key) and `sparkfleet users`.

A user's value is their key, or {"key": ..., "requests_per_minute": N, "max_concurrent": M} once `users limit`
gave them limits of their own (contract/settings.py FrontDoorUser; the settings take either form).

The file lives outside the project (sparkfleet init puts it in ~/.config/sparkfleet/), 0600; the inventory
names it in a module-level string, SPARKFLEET_SECRETS, which pyinfra's loader ignores (only lists and tuples
are groups) and which `users` reads from the inventory's source without running it, so a missing file is
still one clear line. Each edit replaces the whole file atomically and keeps every other key as it was, under
an exclusive lock beside the file (`edit`) from its read to its replace: two commands at once never lose one's edit.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import json
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from pydantic import TypeAdapter, ValidationError
from pyinfra.api.exceptions import PyinfraError

from sparkfleet.contract import private_files
from sparkfleet.contract.settings import FrontDoorUser, Name, UserKey
from sparkfleet.refused import Refusal

SECRETS_VARIABLE = "SPARKFLEET_SECRETS"
KEY_BYTES = 32  # secrets.token_urlsafe: 43 characters, within UserKey's grammar
# Set by `sparkfleet restore INVENTORY controller` only (in its own process): the inventory loads while the secrets
# file it names is still missing, its keys read as this placeholder (no host is converged with it: the restore
# touches none); any other command still refuses a missing file.
RESTORING_ENV = "SPARKFLEET_RESTORING"
RESTORING_PLACEHOLDER = "restoring-no-secrets-yet"


class SecretsError(PyinfraError, Refusal):
    """The secrets file is missing, unreadable or malformed, or a user command cannot apply: one line (a refusal,
    exit 2).

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
        problem = private_files.open_to_others(path, "the secrets file")
        text = path.read_text()
    except FileNotFoundError:
        if os.environ.get(RESTORING_ENV) == "1":  # `sparkfleet restore INVENTORY controller` is putting it back
            return {"api_key": RESTORING_PLACEHOLDER, "users": {}}
        raise SecretsError(f"no secrets file at {path}: it holds the api_key and users' keys; "
                           "`sparkfleet init` writes one, or fix the path the inventory names") from None
    except OSError as exc:
        raise SecretsError(f"cannot read the secrets file {path} ({exc.strerror}): make it readable by you") from None
    if problem:
        raise SecretsError(problem)
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
    if not isinstance(users, dict) or not all(isinstance(k, str) and (isinstance(v, str) or _is_entry(v))
                                              for k, v in users.items()):
        return ('"users" must be an object of name -> key strings (or {"key": ..., "requests_per_minute": N, '
                '"max_concurrent": M})')
    return None


def _is_entry(value) -> bool:
    """A user's value in the object form: a key string and, optionally, the two limits as integers."""
    return (isinstance(value, dict) and isinstance(value.get("key"), str)
            and set(value) <= {"key", *LIMITS}
            and all(value.get(k) is None or (isinstance(value[k], int) and not isinstance(value[k], bool))
                    for k in LIMITS))


LIMITS = ("requests_per_minute", "max_concurrent")


def key_of(value) -> str:
    """A user's key, whichever form their value has."""
    return value if isinstance(value, str) else value["key"]


def write_secrets(path: str | os.PathLike, doc: dict) -> None:
    """Replace the file atomically with a 0600 one (its directory made 0700 when missing)."""
    private_files.write_private(Path(path).expanduser(), (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode())


T = TypeVar("T")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive flock on .<name>.lock beside the secrets file (0600; kept, so every editor locks one inode)."""
    try:
        fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except FileNotFoundError:
        read_secrets(path)  # no directory: the missing file's own line
        raise
    except OSError as exc:
        raise SecretsError(f"cannot lock the secrets file {path} ({exc.strerror}): make its directory "
                           "writable by you") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def edit(path: str | os.PathLike, change: Callable[[dict], tuple[dict, T]]) -> T:
    """Read the secrets file, apply `change` (doc -> (new doc, result)) and replace the file, all under the lock:
    without it, a `users remove` racing a `users add` wrote the user back, and a racing rotate kept the old key."""
    path = Path(path).expanduser()
    with _locked(path):
        new, result = change(read_secrets(path))
        write_secrets(path, new)
    return result


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
    taken = {doc["api_key"], *map(key_of, doc["users"].values())}
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
    """A new key for `name`; their limits are kept."""
    _known(doc, check_name(name))
    key, old = _fresh_key(doc), doc["users"][name]
    return {**doc, "users": {**doc["users"], name: key if isinstance(old, str) else {**old, "key": key}}}, key


def limit(doc: dict, name: str, requests_per_minute: int | None, max_concurrent: int | None) -> dict:
    """`name`'s own limits (None: the fleet-wide default, front_door_requests_per_minute / _max_concurrent),
    checked as the settings check them; the key is kept, and a user with no own limits is a key string again."""
    _known(doc, check_name(name))
    key = key_of(doc["users"][name])
    try:
        entry = FrontDoorUser(key=key, requests_per_minute=requests_per_minute, max_concurrent=max_concurrent)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise SecretsError(f"user {name!r}: {'.'.join(map(str, err['loc']))}: "
                           f"{err['msg'].removeprefix('Value error, ')}") from None
    value = entry.model_dump(exclude_none=True)
    return {**doc, "users": {**doc["users"], name: key if value.keys() == {"key"} else value}}


def limits_of(doc: dict) -> dict[str, dict]:
    """{name: {requests_per_minute, max_concurrent}} as the file sets them (None: the fleet-wide default)."""
    return {name: {k: (None if isinstance(v, str) else v.get(k)) for k in LIMITS}
            for name, v in sorted(doc["users"].items())}


def remove(doc: dict, name: str) -> dict:
    _known(doc, check_name(name))
    return {**doc, "users": {k: v for k, v in doc["users"].items() if k != name}}


def _known(doc: dict, name: str) -> None:
    if name not in doc["users"]:
        known = ", ".join(names(doc)) or "none yet"
        raise SecretsError(f"no user {name!r} (users: {known}): `sparkfleet users add` makes one")
