"""`sparkfleet users`: the secrets file the inventory names, edited atomically (0600, other keys kept);
a key printed once; names only in a list; one line and exit 2 for every bad input."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from sparkfleet import cli
from sparkfleet.contract.settings import parse_settings
from sparkfleet.fleet import users
from sparkfleet.controller.inventory import load_hosts

from .helpers import host_data

API_KEY = "engines-key-0123456789abcdef"


@pytest.fixture
def office(tmp_path):
    """An inventory as `sparkfleet init` writes it (SPARKFLEET_SECRETS, keys read from it) and its secrets."""
    secrets = tmp_path / "keys" / "office.json"
    users.write_secrets(secrets, {"api_key": API_KEY, "users": {"bob": "b" * 20}, "hub_token": "hf_kept"})
    inventory = tmp_path / "office" / "inventory.py"
    inventory.parent.mkdir()
    inventory.write_text(
        "from sparkfleet.fleet.users import read_secrets as _read_secrets\n"
        f"SPARKFLEET_SECRETS = {str(secrets)!r}\n"
        "_secrets = _read_secrets(SPARKFLEET_SECRETS)\n"
        "sparks = [('spark-a', {'ssh_hostname': '10.0.0.1', 'api_host': '0.0.0.0', 'api_key': _secrets['api_key'],"
        " 'front_door_users': _secrets['users']})]\n")
    return str(inventory), secrets


def test_add_prints_the_key_once_and_the_inventory_reads_it(office, capsys):
    inventory, secrets = office
    assert cli.main(["users", "add", inventory, "alice"]) == 0
    out, err = capsys.readouterr()
    key = out.strip()
    doc = json.loads(secrets.read_text())
    assert doc["users"] == {"bob": "b" * 20, "alice": key} and doc["hub_token"] == "hf_kept"
    assert (out + err).count(key) == 1 and "next converge" in err
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o600
    # no partial file left behind; the edits' lock file stays (test_users_race.py)
    assert sorted(p.name for p in secrets.parent.iterdir()) == [".office.json.lock", "office.json"]
    [(name, data)] = load_hosts(inventory)
    assert parse_settings(name, data).front_door_keys["alice"] == key  # a key the settings accept


def test_list_prints_names_never_keys(office, capsys):
    inventory, _ = office
    assert cli.main(["users", "add", inventory, "alice"]) == 0
    key = capsys.readouterr().out.strip()
    assert cli.main(["users", "list", inventory]) == 0
    out, err = capsys.readouterr()
    assert out == "alice\nbob\n" and key not in out + err and "b" * 20 not in out + err
    assert cli.main(["users", "list", inventory, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"users": ["alice", "bob"]}


def test_rotate_replaces_the_key_and_remove_takes_it_away(office, capsys):
    inventory, secrets = office
    assert cli.main(["users", "rotate", inventory, "bob", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["user"] == "bob" and answer["key"] != "b" * 20
    assert json.loads(secrets.read_text())["users"] == {"bob": answer["key"]}
    assert cli.main(["users", "remove", inventory, "bob"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and "401 after the next converge" in err
    assert json.loads(secrets.read_text()) == {"api_key": API_KEY, "users": {}, "hub_token": "hf_kept"}


@pytest.mark.parametrize("action,name,needle", [
    ("add", "bob", "user 'bob' exists"),
    ("add", "bad name", "user name 'bad name' is invalid"),
    ("add", "al\nice", "user name 'al\\nice' is invalid"),
    ("rotate", "carol", "no user 'carol' (users: bob)"),
    ("remove", "carol", "no user 'carol'"),
])
def test_bad_name_or_unknown_user_is_one_line_and_changes_nothing(office, capsys, action, name, needle):
    inventory, secrets = office
    before = secrets.read_text()
    assert cli.main(["users", action, inventory, name]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and secrets.read_text() == before


def test_missing_secrets_file_is_one_line_for_users_and_for_plan(office, capsys):
    inventory, secrets = office
    secrets.unlink()
    assert cli.main(["users", "list", inventory]) == 2
    err = capsys.readouterr().err
    assert f"no secrets file at {secrets}" in err and err.count("\n") == 1
    assert cli.main(["plan", inventory, "--offline"]) == 2
    err = capsys.readouterr().err
    assert f"no secrets file at {secrets}" in err and "Traceback" not in err


def test_an_inventory_that_names_no_secrets_file(tmp_path, capsys):
    inventory = tmp_path / "inv.py"
    inventory.write_text("sparks = [('spark-a', {})]\n")
    assert cli.main(["users", "list", str(inventory)]) == 2
    assert "names no secrets file: add SPARKFLEET_SECRETS" in capsys.readouterr().err


def test_the_secrets_file_is_found_without_running_the_inventory(tmp_path):
    inventory = tmp_path / "inv.py"
    inventory.write_text("import sys\nSPARKFLEET_SECRETS = '~/keys.json'\nsys.exit('never run')\n")
    assert users.secrets_path_of(inventory) == Path.home() / "keys.json"


@pytest.mark.parametrize("text,mode,needle", [
    ('{"api_key": "k", "users": {}}', 0o644, "open to other users (mode 0644): chmod 600"),
    ("{not json", 0o600, "is not JSON"),
    ('["api_key"]', 0o600, "must be a JSON object"),
    ('{"api_key": "k", "users": {"a": 1}}', 0o600, '"users" must be an object of name -> key strings'),
    ('{"users": {}}', 0o600, '"api_key" must be a non-empty string'),
])
def test_read_secrets_refuses_a_file_it_cannot_trust(tmp_path, text, mode, needle):
    path = tmp_path / "s.json"
    path.write_text(text)
    path.chmod(mode)
    with pytest.raises(users.SecretsError) as exc:
        users.read_secrets(path)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_new_keys_are_fresh_and_fit_the_settings():
    doc = {"api_key": API_KEY, "users": {}}
    for name in ("alice", "bob", "carol"):
        doc, _ = users.add(doc, name)
    keys = list(doc["users"].values())
    assert len(set(keys)) == 3 and API_KEY not in keys and all(len(k) >= 40 for k in keys)
    s = parse_settings("spark-a", host_data(api_host="0.0.0.0", api_key=API_KEY, front_door_users=doc["users"]))
    assert s.front_door_keys == doc["users"]
    rotated, key = users.rotate(doc, "bob")
    assert key != doc["users"]["bob"] and doc["users"]["bob"] == keys[1]  # the input is left as it was
