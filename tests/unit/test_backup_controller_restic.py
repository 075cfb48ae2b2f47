"""The controller's backups with the real restic (Debian's 0.14) against a local repository in tmp_path: the
controller's files back byte for byte with their modes, a failed backup that forgets nothing, the retention after a
good one, and each refusal in one line (a wrong password, another fleet's repository or snapshot, a snapshot that
does not exist); `sparkfleet backup` and `sparkfleet restore` without --yes change nothing."""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path

import pytest

from sparkfleet import cli
from sparkfleet.contract import backup as contract
from sparkfleet.fleet import backup
from sparkfleet.fleet.backup import BackupError, Office

pytestmark = pytest.mark.restic

PASSWORD = "this-office-s-password-0123456789"
OTHER = "another-office-s-password-9876543"
KEEP = (24, 7, 4)
CONTENTS = {"secrets.json": b'{"api_key": "k", "users": {"alice": "alice-key-0123456789"}}\n',
            "front-door.crt": b"-----BEGIN CERTIFICATE-----\nfront\n", "front-door.key": b"\x00front key\xff\n",
            "fleet-ca.crt": b"-----BEGIN CERTIFICATE-----\nca\n", "fleet-ca.key": b"ca key\n",
            "fleet-ca.generations.json": b'{"spark-1": 2}\n', "sparkfleet.lock": b"[models]\n"}


@pytest.fixture
def office_files(tmp_path) -> dict[str, Path]:
    """The controller's files where an inventory of `init` names them (keys beside the secrets, the lock in the
    project), each with contents of its own."""
    keys, project = tmp_path / "config", tmp_path / "office"
    keys.mkdir(mode=0o700)
    project.mkdir()
    where = {"secrets.json": keys / "office.json", "front-door.crt": keys / "office.crt",
             "front-door.key": keys / "office.key", "fleet-ca.crt": keys / "office.ca.crt",
             "fleet-ca.key": keys / "office.ca.key", "fleet-ca.generations.json": keys / "office.ca.generations.json",
             "sparkfleet.lock": project / "sparkfleet.lock"}
    for name, path in where.items():
        path.write_bytes(CONTENTS[name])
        path.chmod(0o600)
    return where


def test_the_controllers_state_comes_back_byte_for_byte_with_its_modes(tmp_path, office_files):
    repo, record = str(tmp_path / "repos" / "controller"), tmp_path / "config" / "office.backup-password.last.json"
    done = backup.backup_controller(repo, PASSWORD, dict(office_files), KEEP, record=record)
    assert done.ok and done.error is None and done.files == list(contract.CONTROLLER_FILES), done
    assert done.snapshot and done.total_bytes == sum(map(len, CONTENTS.values()))
    kept = json.loads(record.read_text())
    assert kept["ok"] and kept["snapshot"] == done.snapshot and kept["source"] == "controller"
    assert stat.S_IMODE(record.stat().st_mode) == 0o600

    for path in office_files.values():  # the controller lost
        path.unlink()
    snapshot, plan = backup.restore_controller(repo, PASSWORD, dict(office_files))  # without --yes
    assert snapshot["short_id"] == done.snapshot and not any(p.exists() for p in office_files.values())
    assert [(row["file"], row["exists"]) for row in plan] == [(n, False) for n in contract.CONTROLLER_FILES]

    backup.restore_controller(repo, PASSWORD, dict(office_files), yes=True)
    for name, path in office_files.items():
        assert path.read_bytes() == CONTENTS[name], name
        assert stat.S_IMODE(path.stat().st_mode) == backup.PUBLIC_FILES.get(name, 0o600), name


def test_a_file_the_inventory_names_no_place_for_is_left_out(tmp_path, office_files):
    repo = str(tmp_path / "repos" / "controller")
    assert backup.backup_controller(repo, PASSWORD, dict(office_files), KEEP).ok
    office_files["secrets.json"].unlink()
    places: dict[str, Path | None] = {**office_files, "secrets.json": None}
    _, plan = backup.restore_controller(repo, PASSWORD, places, yes=True)
    assert [r for r in plan if r["file"] == "secrets.json"] == [
        {"file": "secrets.json", "path": None, "exists": False, "mode": "0600"}]
    assert not office_files["secrets.json"].exists()


def test_a_wrong_password_is_one_line_and_the_repository_is_never_made_again(tmp_path, office_files):
    repo = str(tmp_path / "repos" / "controller")
    first = backup.backup_controller(repo, PASSWORD, dict(office_files), KEEP)
    with pytest.raises(BackupError) as found:
        backup.restore_controller(repo, "a-wrong-password-000000000000", dict(office_files))
    line = str(found.value)
    assert "does not open with this office's password: another fleet's repository, or a wrong backup password" in line
    assert "\n" not in line and "a-wrong-password" not in line
    failed = backup.backup_controller(repo, "a-wrong-password-000000000000", dict(office_files), KEEP)
    assert not failed.ok and "does not open with this office's password" in failed.error
    snapshot, _ = backup.restore_controller(repo, PASSWORD, dict(office_files))  # still this office's, untouched
    assert snapshot["short_id"] == first.snapshot


def test_a_snapshot_that_does_not_exist_is_one_line(tmp_path, office_files):
    repo = str(tmp_path / "repos" / "controller")
    made = backup.backup_controller(repo, PASSWORD, dict(office_files), KEEP)
    with pytest.raises(BackupError) as found:
        backup.restore_controller(repo, PASSWORD, dict(office_files), wanted="deadbeef", yes=True)
    assert str(found.value).startswith(f"no snapshot 'deadbeef' of controller (its latest: {made.snapshot})")
    assert all(p.read_bytes() == CONTENTS[n] for n, p in office_files.items())  # nothing written


def test_nothing_backed_up_yet_is_one_line(tmp_path, office_files):
    with pytest.raises(BackupError, match="no repository at .*nothing of controller was backed up there yet"):
        backup.restore_controller(str(tmp_path / "none"), PASSWORD, dict(office_files))


def test_another_fleets_repository_is_refused_and_kept(tmp_path, office_files):
    repo = str(tmp_path / "repos" / "controller")
    theirs = backup.backup_controller(repo, OTHER, dict(office_files), KEEP)
    assert theirs.ok
    ours = backup.backup_controller(repo, PASSWORD, dict(office_files), KEEP)
    assert not ours.ok and "another fleet's repository" in ours.error
    snapshot, _ = backup.restore_controller(repo, OTHER, dict(office_files))
    assert snapshot["short_id"] == theirs.snapshot  # theirs untouched: no `restic init` over it


def test_a_snapshot_another_fleet_tagged_is_refused(tmp_path, office_files):
    """A repository that opens (same derived password) but whose snapshot carries another fleet's tag."""
    repo = str(tmp_path / "repos" / "controller")
    staged = tmp_path / "stray"
    staged.mkdir()
    (staged / "secrets.json").write_text("{}")
    with backup.restic_for(repo, PASSWORD, "controller") as r:
        backup.open_repository(r, create=True)
        done = r.run("backup", "--json", "--host", "controller", "--tag", "sparkfleet", "--tag", "fleet=0123456789ab",
                     str(staged))
        assert done.returncode == 0
        stray = backup.summary(done.stdout)["snapshot_id"]
    with pytest.raises(BackupError, match=f"snapshot {stray} of controller was written by another fleet"):
        backup.restore_controller(repo, PASSWORD, dict(office_files), wanted=stray, yes=True)
    with pytest.raises(BackupError, match="written by another fleet"):
        backup.restore_controller(repo, PASSWORD, dict(office_files))


def snapshot_ids(repo: str, password: str = PASSWORD) -> list[str]:
    with backup.restic_for(repo, password, "controller") as r:
        return [s["short_id"] for s in backup.snapshots(r)]


def test_a_failed_backup_forgets_nothing_and_keeps_the_last_good_time(tmp_path, office_files):
    repo, record = str(tmp_path / "repos" / "controller"), tmp_path / "record.json"
    good = backup.backup_controller(repo, PASSWORD, dict(office_files), (1, 0, 0), record=record)
    before = json.loads(record.read_text())
    gone = {name: tmp_path / "gone" / name for name in office_files}
    failed = backup.backup_controller(repo, PASSWORD, gone, (1, 0, 0), record=record)
    assert not failed.ok and "nothing to back up" in failed.error
    after = json.loads(record.read_text())
    assert after["ok"] is False and after["last_success"] == before["last_success"]
    assert after["snapshot"] == good.snapshot and after["error"] == failed.error
    assert snapshot_ids(repo) == [good.snapshot]


def test_the_retention_prunes_after_a_good_backup(tmp_path, office_files):
    """keep-hourly 1: three backups within the hour leave the last one only."""
    repo = str(tmp_path / "repos" / "controller")
    made = [backup.backup_controller(repo, PASSWORD, dict(office_files), (1, 0, 0)) for _ in range(3)]
    assert all(m.ok for m in made)
    assert snapshot_ids(repo) == [made[-1].snapshot]
    kept = [backup.backup_controller(repo, PASSWORD, dict(office_files), (0, 0, 0)) for _ in range(2)]
    assert snapshot_ids(repo) == [made[-1].snapshot, *(k.snapshot for k in kept)]  # no policy: all kept


# --- the commands, on an Office whose repository is a local folder -----------------------------------------------


@pytest.fixture
def office(tmp_path, office_files, monkeypatch) -> Office:
    password_file = tmp_path / "config" / "office.backup-password"
    password_file.write_text(PASSWORD + "\n")
    password_file.chmod(0o600)
    found = Office(password_file, None, str(tmp_path / "repos"), KEEP, 3600, (), ("spark-1",), dict(office_files))
    monkeypatch.setattr(backup, "office_of", lambda inventory: found)
    (tmp_path / "office" / "inventory.py").write_text("sparks = ['spark-1']\n")
    return found


def test_backup_then_restore_of_the_controller_through_the_commands(tmp_path, office, office_files, capsys):
    inventory = str(tmp_path / "office" / "inventory.py")
    assert cli.main(["backup", inventory, "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["backups"]
    assert row["source"] == "controller" and row["ok"] and row["snapshot"]
    assert json.loads(backup.controller_record(office.password_file).read_text())["snapshot"] == row["snapshot"]

    for path in office_files.values():
        path.unlink()
    office.password_file.unlink()
    given = tmp_path / "written-down"
    given.write_text(PASSWORD + "\n")
    given.chmod(0o600)
    assert cli.main(["restore", inventory, "controller", "--password-file", str(given)]) == 0
    out = capsys.readouterr().out
    assert "nothing was changed: --yes writes them" in out and "would write it (missing)" in out
    assert not any(p.exists() for p in office_files.values()) and not office.password_file.exists()

    assert cli.main(["restore", inventory, "controller", "--password-file", str(given), "--yes"]) == 0
    assert all(p.read_bytes() == CONTENTS[n] for n, p in office_files.items())
    assert backup.read_password(office.password_file) == PASSWORD  # the next backup works on this controller
    assert PASSWORD not in capsys.readouterr().out


def test_restore_with_a_wrong_password_file_is_one_line_and_writes_nothing(tmp_path, office, office_files, capsys):
    inventory = str(tmp_path / "office" / "inventory.py")
    assert cli.main(["backup", inventory]) == 0
    office_files["fleet-ca.key"].unlink()
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-office-password-00000000\n")
    wrong.chmod(0o600)
    capsys.readouterr()
    assert cli.main(["restore", inventory, "controller", "--password-file", str(wrong), "--yes"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not open with this office's password" in err
    assert not office_files["fleet-ca.key"].exists()


def test_a_failed_backup_exits_1_with_one_line_naming_it(tmp_path, office, office_files, capsys):
    for path in office_files.values():
        path.unlink()
    assert cli.main(["backup", str(tmp_path / "office" / "inventory.py")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("controller (controller): none of the controller's files the inventory names exists")


def chat_ui_snapshot(tmp_path, fleet: str) -> str:
    data = tmp_path / "webui"
    data.mkdir(exist_ok=True)
    (data / "webui.db").write_bytes(b"SQLite format 3\x00")
    with backup.restic_for(str(tmp_path / "repos" / "chat-ui"), PASSWORD, "chat-ui") as r:
        backup.open_repository(r, create=True)
        done = r.run("backup", "--json", "--host", "chat-ui", "--tag", "sparkfleet", "--tag", fleet, str(data))
        return backup.summary(done.stdout)["snapshot_id"]


def test_a_chat_ui_restore_is_checked_on_the_controller_before_its_host_is_touched(tmp_path, office, monkeypatch,
                                                                                    capsys):
    ours = chat_ui_snapshot(tmp_path, backup.fleet_tag(PASSWORD))
    theirs = chat_ui_snapshot(tmp_path, "fleet=0123456789ab")
    sent = []

    def on_hosts(inventory, hosts, command, timeout_s):
        sent.append((hosts, command))
        return {hosts[0]: json.dumps({"ok": True, "snapshot": "x", "version": "3781e22d8b01", "data": "/d",
                                      "replaces": ["webui.db"], "dry_run": "--dry-run" in command})}

    monkeypatch.setattr(backup, "on_hosts", on_hosts)
    inventory = str(tmp_path / "office" / "inventory.py")
    for argv, needle in ((["--snapshot", "deadbeef"], "no snapshot 'deadbeef' of chat-ui"),
                         (["--snapshot", theirs], "written by another fleet"),
                         (["--host", "spark-2"], "spark-2 is not in the group chat_ui")):
        assert cli.main(["restore", inventory, "chat-ui", *argv, "--yes"]) == 2
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1
    assert sent == []  # refused before any host was asked

    assert cli.main(["restore", inventory, "chat-ui"]) == 0
    [(hosts, command)] = sent
    full = re.search(r"--snapshot ([0-9a-f]{64}) --dry-run$", command)  # the full id: no prefix left to guess
    assert hosts == ["spark-1"] and full and full[1].startswith(ours)
    out = capsys.readouterr().out
    assert f"would restore the chat UI's snapshot {ours}" in out and "nothing was changed: --yes restores it" in out

