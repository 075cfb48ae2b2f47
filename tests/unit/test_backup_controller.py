"""The controller's side of the backups (fleet/backup.py), its plain logic without restic or a host: where the
repositories are and how restic reaches them (no secret on its command line), which snapshot a restore picks, what a
data host's record says, the inventory's view, the office's password file, `init`'s password and `status`'s rows."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from sparkfleet import cli
from sparkfleet.contract import backup as contract
from sparkfleet.contract.settings import GROUPS_KEY, SettingsError, parse_settings
from sparkfleet.controller.inventory import load_hosts
from sparkfleet.fleet import backup
from sparkfleet.fleet.backup import BackupError, Target


PASSWORD = "an-office-password-for-the-tests"
FLEET = backup.fleet_tag(PASSWORD)


def test_sftp_command_names_files_never_their_secrets_and_checks_the_host_key_strictly():
    target = Target("spark-3", "127.0.0.1", 32022, "/home/o/office/known_hosts")
    command = backup.sftp_command(target, "/tmp/sparkfleet-restic-x/id_ed25519")
    assert command.split() == ["ssh", "-i", "/tmp/sparkfleet-restic-x/id_ed25519", "-p", "32022",
                               "-o", "UserKnownHostsFile=/home/o/office/known_hosts", *backup.SSH_OPTIONS,
                               "sparkfleet-backup@127.0.0.1", "-s", "sftp"]
    assert "StrictHostKeyChecking=yes" in command and "BatchMode=yes" in command
    key, _ = contract.ssh_key(PASSWORD, "controller")
    assert key.splitlines()[1] not in command and PASSWORD not in command


def test_a_path_restic_would_split_is_refused_in_one_line():
    with pytest.raises(BackupError, match="holds a blank or a quote") as found:
        backup.sftp_command(Target("b", "10.0.0.3", None, "/home/o/my office/known_hosts"), "/tmp/k")
    assert "\n" not in str(found.value)


def test_each_source_has_its_own_repository_on_the_target_or_under_the_offices_own():
    target = Target("spark-3", "10.0.0.3")
    assert backup.repository_of("chat-ui", target, None) == "sftp:sparkfleet-backup@10.0.0.3:/repos/chat-ui"
    assert backup.repository_of("controller", target, "s3:s3.example/bucket/") == "s3:s3.example/bucket/controller"
    with pytest.raises(BackupError, match="add a group `backup`"):
        backup.repository_of("controller", None, None)


def test_restic_runs_with_the_repository_and_the_passwords_file_in_its_environment(tmp_path, monkeypatch):
    """RESTIC_* of the caller's environment never reach restic (a stray RESTIC_PASSWORD would open another
    repository); the password itself is in no argument and no variable, only in its 0600 file."""
    monkeypatch.setenv("RESTIC_PASSWORD", "stray")
    calls = []

    def runner(argv, **kwargs):
        calls.append((argv, kwargs["env"]))
        password_file = Path(kwargs["env"]["RESTIC_PASSWORD_FILE"])
        assert stat.S_IMODE(password_file.stat().st_mode) == 0o600
        assert stat.S_IMODE(password_file.parent.stat().st_mode) == 0o700
        assert password_file.read_text() == contract.repository_password(PASSWORD, "chat-ui")
        return __import__("subprocess").CompletedProcess(argv, 0, b"", b"")

    with backup.restic_for("sftp:sparkfleet-backup@10.0.0.3:/repos/chat-ui", PASSWORD, "chat-ui",
                           Target("b", "10.0.0.3"), runner) as r:
        r.run("cat", "config")
        private = r.private
    assert not private.exists()  # removed after the run
    [(argv, env)] = calls
    assert argv[:2] == ["restic", "--no-cache"] and argv[-2:] == ["cat", "config"]
    assert "RESTIC_PASSWORD" not in env and env["RESTIC_REPOSITORY"].endswith("/repos/chat-ui")
    secret = contract.repository_password(PASSWORD, "chat-ui")
    assert all(secret not in a and PASSWORD not in a for a in argv)
    assert all(secret not in v and PASSWORD not in v for v in env.values())


def test_the_private_directory_goes_even_when_the_run_fails():
    with pytest.raises(RuntimeError):
        with backup.restic_for("/nowhere", PASSWORD, "controller") as r:
            private = r.private
            raise RuntimeError("halfway")
    assert not private.exists()


def snap(short: str, day: int, fleet: str = FLEET) -> dict:
    return {"id": short + "0" * 56, "short_id": short, "time": f"2026-01-0{day}T00:00:00Z",
            "tags": ["sparkfleet", fleet]}


SNAPS = [snap("aaaa1111", 1), snap("bbbb2222", 2), snap("cccc3333", 3, "fleet=0123456789ab")]


def test_latest_is_this_fleets_latest_and_an_id_may_be_short():
    assert backup.pick_snapshot(SNAPS, "latest", "chat-ui", FLEET)["short_id"] == "bbbb2222"
    assert backup.pick_snapshot(SNAPS, "aaaa1111", "chat-ui", FLEET)["short_id"] == "aaaa1111"
    assert backup.pick_snapshot(SNAPS, SNAPS[0]["id"], "chat-ui", FLEET)["short_id"] == "aaaa1111"


@pytest.mark.parametrize("wanted,needle", [
    ("deadbeef", "no snapshot 'deadbeef' of chat-ui (its latest: aaaa1111, bbbb2222)"),
    ("aa", "no snapshot 'aa'"),  # too short to name one
    ("cccc3333", "written by another fleet"),
])
def test_a_snapshot_that_is_not_this_fleets_is_one_line(wanted, needle):
    with pytest.raises(BackupError) as found:
        backup.pick_snapshot(SNAPS, wanted, "chat-ui", FLEET)
    assert needle in str(found.value) and "\n" not in str(found.value)


def test_a_repository_of_only_another_fleets_snapshots_has_no_latest():
    with pytest.raises(BackupError, match="written by another fleet"):
        backup.pick_snapshot(SNAPS[2:], "latest", "chat-ui", FLEET)
    with pytest.raises(BackupError, match="no snapshot of chat-ui yet"):
        backup.pick_snapshot([], "latest", "chat-ui", FLEET)


def record(**kw) -> str:
    base = {"source": "chat-ui", "ok": True, "finished": 1000, "last_success": 1000, "snapshot": "abcd1234",
            "error": None, "bytes_added": 4096, "duration_s": 2.5}
    return json.dumps({**base, **kw})


def test_a_data_hosts_run_is_read_from_its_record():
    done = backup.triggered("chat-ui", "spark-1", f"990 0\n{record()}\n")
    assert (done.ok, done.snapshot, done.bytes_added, done.seconds, done.error) == (True, "abcd1234", 4096, 2.5, None)


@pytest.mark.parametrize("output,needle", [
    (None, "spark-1 did not answer over SSH"),
    ("990 5\n", "did not run on spark-1 (exit 5): converge it"),  # no unit: no record
    (f"2000 0\n{record()}\n", "did not run"),  # a record older than this run
    (f"990 1\n{record(ok=False, error='the target did not answer')}\n", "the target did not answer"),
    (f"990 0\n{record(source='usage-door-1')}\n", "backs up 'usage-door-1', not chat-ui"),
    ("990 0\nnot json\n", "did not run"),
])
def test_a_data_host_that_did_not_back_up_says_why_in_one_line(output, needle):
    done = backup.triggered("chat-ui", "spark-1", output)
    assert not done.ok and needle in done.error and "\n" not in done.error


def test_a_failed_run_with_a_zero_exit_is_still_a_failure():
    """The unit's exit and the record must both say ok: a record from a run that failed is not a snapshot."""
    assert not backup.triggered("chat-ui", "spark-1", f"990 0\n{record(ok=False, error='x')}\n").ok
    assert not backup.triggered("chat-ui", "spark-1", f"990 3\n{record()}\n").ok


@pytest.mark.parametrize("rec,state", [
    ({"ok": True, "last_success": 10_000, "snapshot": "s"}, "ok"),
    ({"ok": True, "last_success": 10_000 - 2 * 3600 - 1, "snapshot": "s"}, "overdue"),
    ({"ok": False, "last_success": 9_000, "error": "disk full"}, "failed"),
    (None, "none"),
])
def test_status_says_each_sources_last_backup(rec, state):
    row = backup.backup_state("chat-ui", "spark-1", rec, 3600, now=10_000)
    assert row["state"] == state
    if rec and rec.get("last_success"):
        assert row["age_s"] == 10_000 - rec["last_success"]
    if state == "failed":
        assert row["error"] == "disk full" and row["last_success"] == 9_000  # the last good one is still known


def hosts_of(groups: dict[str, list[str]], **extra) -> list[tuple[str, dict]]:
    names = sorted({n for members in groups.values() for n in members})
    return [(n, {"ssh_hostname": "127.0.0.1", "ssh_port": 2200 + i, "ssh_known_hosts_file": "/o/known_hosts",
                 GROUPS_KEY: [g for g, members in groups.items() if n in members], **extra})
            for i, n in enumerate(names)]


def test_the_inventory_view_names_the_target_the_sources_and_the_controllers_files(tmp_path):
    hosts = hosts_of({"sparks": ["spark-1", "spark-2", "spark-3"], "chat_ui": ["spark-1"], "backup": ["spark-3"],
                      "front_door": ["door-1", "spark-2"]},
                     fleet_ca_cert="/k/office.ca.crt", fleet_ca_key="/k/office.ca.key",
                     front_door_tls_cert="/k/office.crt", front_door_tls_key="/k/office.key",
                     controller_backup_password_file="/k/office.backup-password", backup_keep_hourly=5)
    settings = {n: parse_settings(n, d) for n, d in hosts}
    office = backup.office_from(hosts, settings, Path("/k/office.json"), tmp_path / "sparkfleet.lock")
    assert office.target == Target("spark-3", "127.0.0.1", 2203, "/o/known_hosts")
    assert office.sources == (("chat-ui", "spark-1"), ("usage-door-1", "door-1"), ("usage-spark-2", "spark-2"))
    assert office.keep == (5, 7, 4) and office.password_file == Path("/k/office.backup-password")
    assert office.repository_for("controller") == "sftp:sparkfleet-backup@127.0.0.1:/repos/controller"
    assert set(office.files) == set(contract.CONTROLLER_FILES)
    assert office.files["fleet-ca.generations.json"] == Path("/k/office.ca.generations.json")
    assert office.files["secrets.json"] == Path("/k/office.json")
    assert office.files["sparkfleet.lock"] == tmp_path / "sparkfleet.lock"


def test_a_chat_ui_on_a_door_is_refused_only_where_the_inventory_has_backups(tmp_path):
    """As the deploy refuses it (controller/backup_plan.py): an inventory without backups loads for status as before."""
    groups = {"sparks": ["a", "b"], "chat_ui": ["a"], "front_door": ["a"]}
    hosts = hosts_of(groups)
    office = backup.office_from(hosts, {n: parse_settings(n, d) for n, d in hosts}, None, tmp_path / "lock")
    assert not office.configured and office.sources == ()
    hosts = hosts_of({**groups, "backup": ["b"]})
    with pytest.raises(SettingsError, match="the chat UI's host is a front door too"):
        backup.office_from(hosts, {n: parse_settings(n, d) for n, d in hosts}, None, tmp_path / "lock")


def test_two_backup_hosts_are_refused_and_none_is_no_target(tmp_path):
    hosts = hosts_of({"sparks": ["a", "b"], "backup": ["a", "b"]})
    settings = {n: parse_settings(n, d) for n, d in hosts}
    with pytest.raises(BackupError, match="the group backup has 2 hosts"):
        backup.office_from(hosts, settings, None, tmp_path / "lock")
    hosts = hosts_of({"sparks": ["a"]})
    office = backup.office_from(hosts, {n: parse_settings(n, d) for n, d in hosts}, None, tmp_path / "lock")
    assert not office.configured and office.files["secrets.json"] is None
    with pytest.raises(BackupError, match="sets no controller_backup_password_file"):
        office.password()


def test_the_password_file_must_be_private_and_one_line(tmp_path):
    path = tmp_path / "office.backup-password"
    with pytest.raises(BackupError, match="no backup password at"):
        backup.read_password(path)
    assert backup.new_password_file(path) is not None
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    password = backup.read_password(path)
    assert len(password) == 32 and backup.new_password_file(path) is None  # kept: never a second one
    assert backup.read_password(path) == password
    path.chmod(0o644)
    with pytest.raises(BackupError, match="open to other users .*chmod 600"):
        backup.read_password(path)
    path.chmod(0o600)
    path.write_text("one\ntwo\n")
    with pytest.raises(BackupError, match="on one line"):
        backup.read_password(path)


def test_the_restore_plan_says_what_it_would_overwrite(tmp_path):
    (tmp_path / "office.json").write_text("{}")
    files = {name: None for name in contract.CONTROLLER_FILES}
    files.update({"secrets.json": tmp_path / "office.json", "fleet-ca.key": tmp_path / "office.ca.key"})
    plan = backup.restore_plan(files, {"secrets.json", "fleet-ca.key", "front-door.crt"})
    assert plan == [
        {"file": "secrets.json", "path": str(tmp_path / "office.json"), "exists": True, "mode": "0600"},
        {"file": "front-door.crt", "path": None, "exists": False, "mode": "0644"},
        {"file": "fleet-ca.key", "path": str(tmp_path / "office.ca.key"), "exists": False, "mode": "0600"}]


def test_a_missing_secrets_file_reads_as_a_placeholder_only_while_restoring(tmp_path, monkeypatch):
    from sparkfleet.commands import restore
    from sparkfleet.fleet.users import RESTORING_ENV, SecretsError, read_secrets

    assert restore.RESTORING == RESTORING_ENV
    monkeypatch.delenv(RESTORING_ENV, raising=False)
    with pytest.raises(SecretsError, match="no secrets file"):
        read_secrets(tmp_path / "gone.json")
    monkeypatch.setenv(RESTORING_ENV, "1")
    assert read_secrets(tmp_path / "gone.json")["users"] == {}
    (tmp_path / "open.json").write_text('{"api_key": "k", "users": {}}')
    (tmp_path / "open.json").chmod(0o644)
    with pytest.raises(SecretsError, match="open to other users"):  # only a missing file is let through
        read_secrets(tmp_path / "open.json")


def test_restore_refuses_an_option_of_the_other_kind_before_anything(capsys):
    assert cli.main(["restore", "inventory/office.py", "controller", "--host", "spark-1"]) == 2
    assert "--host is for `restore ... chat-ui`" in capsys.readouterr().err
    assert cli.main(["restore", "inventory/office.py", "chat-ui", "--password-file", "/x"]) == 2
    assert "--password-file is for `restore ... controller`" in capsys.readouterr().err


def test_a_chat_ui_restore_goes_only_to_the_chat_ui_host():
    assert backup.chat_ui_host(("spark-2",), None) == "spark-2"
    assert backup.chat_ui_host(("spark-2",), "spark-2") == "spark-2"
    with pytest.raises(BackupError, match="spark-1 is not in the group chat_ui \\(spark-2\\)"):
        backup.chat_ui_host(("spark-2",), "spark-1")
    with pytest.raises(BackupError, match="no chat UI"):
        backup.chat_ui_host((), None)


def test_the_hosts_restore_is_one_quoted_command_and_its_json_line_is_read():
    assert backup.restore_chat_ui_command("abcd1234", True) == (
        "python3 /opt/sparkfleet/bin/sparkfleet_host backup restore-chat-ui --snapshot abcd1234 --dry-run")
    assert backup.parse_restore('log line\n{"ok": true, "snapshot": "x"}\n', "h") == {"ok": True, "snapshot": "x"}
    assert "printed no result" in backup.parse_restore("Traceback ...\n", "h")["error"]
    assert "did not answer" in backup.parse_restore(None, "h")["error"]


def test_fatal_line_keeps_restics_fatal_line_short_and_printable():
    assert backup.fatal_line("noise\nFatal: unable to open repository\x1b[31m\nmore\n") == (
        "Fatal: unable to open repository[31m")
    assert backup.fatal_line("") == "no output"


# --- init's password, and the backup after a change ---------------------------------------------------------------


@pytest.fixture
def no_keyscan(tmp_path, monkeypatch):
    """init with no Spark answering its key scan (a stand-in ssh-keyscan that fails), keys under tmp's home."""
    import shutil

    if not shutil.which("ssh-keygen"):
        pytest.skip("init's host key check needs OpenSSH's ssh-keygen")
    from tests.unit.helpers import no_keyscan as stand_in_keyscan

    return stand_in_keyscan(tmp_path, monkeypatch) / ".config/sparkfleet/office.backup-password"


def test_init_shows_the_backup_password_once_and_keeps_it_0600(tmp_path, no_keyscan, capsys):
    office = tmp_path / "office"
    assert cli.main(["init", str(office), "--host", "a=10.0.0.1"]) == 0
    out = capsys.readouterr().out
    password = backup.read_password(no_keyscan)
    assert stat.S_IMODE(no_keyscan.stat().st_mode) == 0o600 and len(password) == 32
    assert out.count(password) == 1 and f"backup password: {password}\n" in out
    assert "write it down: a restore on a new controller needs it" in out
    inventory = (office / "inventory.py").read_text()
    assert password not in inventory and f'"controller_backup_password_file": "{no_keyscan}"' in inventory
    assert "# backup = [sparks[0]]" in inventory  # the group, to set by hand (off the chat UI's box)
    [(name, data)] = load_hosts(str(office / "inventory.py"))
    assert parse_settings(name, data).controller_backup_password_file == str(no_keyscan)

    assert cli.main(["init", str(office), "--host", "a=10.0.0.1", "--force"]) == 0
    out = capsys.readouterr().out
    assert password not in out and f"backup password: {no_keyscan} (kept as it was)" in out
    assert backup.read_password(no_keyscan) == password  # never a second password


def test_init_json_names_the_passwords_file_never_the_password(tmp_path, no_keyscan, capsys):
    assert cli.main(["init", str(tmp_path / "office"), "--host", "a=10.0.0.1", "--json"]) == 0
    out = capsys.readouterr().out
    found = json.loads(out)
    assert found["backup_password_file"] == str(no_keyscan) and found["backup_password_new"] is True
    assert backup.read_password(no_keyscan) not in out


def test_force_on_a_project_from_before_backups_adds_a_password(tmp_path, no_keyscan, capsys):
    office = tmp_path / "office"
    assert cli.main(["init", str(office), "--host", "a=10.0.0.1"]) == 0
    no_keyscan.unlink()  # a project made before backups had none
    capsys.readouterr()
    assert cli.main(["init", str(office), "--host", "a=10.0.0.1", "--force"]) == 0
    assert backup.read_password(no_keyscan) in capsys.readouterr().out


@pytest.fixture
def users_office(tmp_path, monkeypatch):
    """An inventory of `init`'s shape and its secrets; `backup.office_of` answering as the test says."""
    from sparkfleet.fleet import users

    secrets = tmp_path / "keys" / "office.json"
    users.write_secrets(secrets, {"api_key": "engines-key-0123456789abcdef", "users": {}})
    inventory = tmp_path / "office" / "inventory.py"
    inventory.parent.mkdir()
    inventory.write_text(f"SPARKFLEET_SECRETS = {str(secrets)!r}\nsparks = ['spark-a']\n")
    password_file = tmp_path / "keys" / "office.backup-password"
    password_file.write_text(PASSWORD + "\n")
    password_file.chmod(0o600)
    office = backup.Office(password_file, Target("spark-b", "10.0.0.2"), None, (24, 7, 4), 3600, (), (),
                           {name: None for name in contract.CONTROLLER_FILES})
    asked = []
    monkeypatch.setattr(backup, "office_of", lambda path: asked.append(path) or office)
    return str(inventory), asked


def test_a_users_change_is_backed_up_and_a_failed_backup_is_one_line_not_a_failure(users_office, monkeypatch,
                                                                                   capsys):
    inventory, asked = users_office
    monkeypatch.setattr(backup, "back_up_controller", lambda office: backup.Result(
        "controller", "controller", error="the target did not answer"))
    assert cli.main(["users", "add", inventory, "alice"]) == 0
    out, err = capsys.readouterr()
    assert asked == [inventory] and len(out.strip()) >= 32  # the key is shown: the change stands
    assert err.splitlines()[-1] == (f"the controller's state was not backed up: the target did not answer (the change "
                                    f"itself is saved; `sparkfleet backup {inventory}` tries again)")


def test_a_users_command_that_changed_nothing_asks_no_backup(users_office, capsys):
    inventory, asked = users_office
    assert cli.main(["users", "list", inventory]) == 0
    assert cli.main(["users", "remove", inventory, "nobody"]) == 2  # refused: nothing changed
    assert asked == []


def test_status_reads_each_data_hosts_record_over_ssh_and_the_controllers_beside_its_password(tmp_path, monkeypatch):
    password_file = tmp_path / "office.backup-password"
    office = backup.Office(password_file, Target("spark-3", "10.0.0.3"), None, (24, 7, 4), 3600,
                           (("chat-ui", "spark-1"), ("usage-door", "door")), ("spark-1",),
                           {name: None for name in contract.CONTROLLER_FILES})
    monkeypatch.setattr(backup, "office_of", lambda inventory: office)
    backup.write_record(backup.controller_record(password_file),
                        backup.Result("controller", "controller", error="the target did not answer"), now=500)
    sent = []

    def on_hosts(inventory, hosts, command, timeout_s):
        sent.append((hosts, command))
        return {"spark-1": record(finished=9_000, last_success=9_000), "door": None}

    monkeypatch.setattr(backup, "on_hosts", on_hosts)
    rows = backup.backup_status("office.py", now=10_000)
    assert sent == [(["spark-1", "door"], f"cat {contract.RECORD} 2>/dev/null || true")]  # read only: no backup
    assert [(r["source"], r["state"], r["age_s"]) for r in rows] == [
        ("controller", "failed", None), ("chat-ui", "ok", 1000.0), ("usage-door", "unknown", None)]
    assert rows[0]["error"] == "the target did not answer" and rows[2]["error"] == "door did not answer over SSH"


def test_status_has_no_backups_section_without_a_target(monkeypatch):
    office = backup.Office(None, None, None, (24, 7, 4), 3600, (("chat-ui", "spark-1"),), ("spark-1",), {})
    monkeypatch.setattr(backup, "office_of", lambda inventory: office)
    monkeypatch.setattr(backup, "on_hosts", lambda *a: pytest.fail("a host was asked"))
    assert backup.backup_status("office.py") is None


@pytest.mark.parametrize("written", [True, False])
def test_update_backs_the_lock_up_only_when_it_wrote_it(written, tmp_path, monkeypatch, capsys):
    from sparkfleet.fleet import update

    monkeypatch.setattr(update, "update", lambda inventory, limit: update.UpdateReport(
        tmp_path / "sparkfleet.lock", [], {}, written, ["model x"] if written else []))
    asked = []
    monkeypatch.setattr(backup, "after_change", lambda inventory, log: asked.append(inventory))
    assert cli.main(["update", "office.py"]) == 0
    assert asked == (["office.py"] if written else [])


def test_restore_controller_reads_the_inventory_as_restoring_and_only_while_it_loads(monkeypatch, capsys):
    """The placeholder is the restore's alone: set while its inventory loads, gone after (a later command in the
    same process, a test's, refuses a missing secrets file again)."""
    import os

    from sparkfleet.fleet.users import RESTORING_ENV

    monkeypatch.delenv(RESTORING_ENV, raising=False)
    seen = []
    office = backup.Office(None, None, None, (24, 7, 4), 3600, (), (), {})
    monkeypatch.setattr(backup, "office_of", lambda inventory: seen.append(os.environ.get(RESTORING_ENV)) or office)
    assert cli.main(["restore", "office.py", "controller", "--yes"]) == 2
    assert seen == ["1"] and RESTORING_ENV not in os.environ
    assert "names no backup target" in capsys.readouterr().err
