"""Two `sparkfleet users` commands at once lose no edit (issue 36, item 3): a removal racing an add left the removed
user in the file while `remove` said it succeeded, and a racing rotate kept the old key valid. Each edit holds an
exclusive lock beside the secrets file from its read to its atomic replace."""

from __future__ import annotations

import argparse
import json
import sys
import threading

import pytest

from sparkfleet.commands import users as users_command
from sparkfleet.fleet import users

PAIRS = 20


@pytest.fixture
def office(tmp_path):
    secrets = tmp_path / "keys" / "office.json"
    old = {f"gone{i}": f"gone-key-{i:02d}-0123456789" for i in range(PAIRS)}
    old |= {f"turn{i}": f"turn-key-{i:02d}-0123456789" for i in range(PAIRS)}
    users.write_secrets(secrets, {"api_key": "engines-key-0123456789abcdef", "users": old})
    inventory = tmp_path / "inventory.py"
    inventory.write_text(f"SPARKFLEET_SECRETS = {str(secrets)!r}\n")
    return str(inventory), secrets, old


@pytest.fixture
def busy_switching():
    """Threads switch as often as they can, so that one command's read and write straddle another's."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def command(inventory: str, action: str, name: str) -> int:
    """What `sparkfleet users ACTION INVENTORY NAME` runs once its arguments are parsed."""
    return users_command.run(argparse.Namespace(action=action, inventory=inventory, name=name, json=True))


def test_racing_add_remove_and_rotate_lose_no_edit(office, busy_switching, capsys):
    inventory, secrets, old = office
    results: list[int] = []

    def pair(i: int) -> None:
        start = threading.Barrier(3)

        def one(action: str, name: str) -> None:
            start.wait()
            results.append(command(inventory, action, name))

        threads = [threading.Thread(target=one, args=args)
                   for args in (("remove", f"gone{i}"), ("add", f"new{i}"), ("rotate", f"turn{i}"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    for i in range(PAIRS):
        pair(i)
    assert results == [0] * 3 * PAIRS
    now = json.loads(secrets.read_text())["users"]
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    keys = {(p["action"], p["user"]): p.get("key") for p in printed}
    assert not [f"gone{i}" for i in range(PAIRS) if f"gone{i}" in now], "a removed user is back"
    assert [name for name in (f"new{i}" for i in range(PAIRS)) if now.get(name) != keys[("add", name)]] == []
    assert [name for name in (f"turn{i}" for i in range(PAIRS)) if now.get(name) != keys[("rotate", name)]] == []
    assert not set(now.values()) & set(old.values()), "an old key is still valid"


def test_the_lock_file_sits_beside_the_secrets_file_and_is_the_users_only(office):
    inventory, secrets, _ = office
    assert command(inventory, "add", "alice") == 0
    [lock] = [p for p in secrets.parent.iterdir() if p != secrets]
    assert lock.name == f".{secrets.name}.lock" and lock.stat().st_mode & 0o077 == 0
