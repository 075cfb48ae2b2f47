"""A data host's backup run and the chat UI's restore (files/sparkfleet_host/backup.py) against a real restic and a
local repository in tmp_path: what the unit does on a host, without one."""

from __future__ import annotations

import errno
import importlib
import json
import sqlite3
import subprocess
from pathlib import Path

import pytest

from sparkfleet.contract import backup as contract
from sparkfleet.contract import shared  # noqa: F401  (registers the host package as `sparkfleet_host`)

host_backup = importlib.import_module("sparkfleet_host.backup")


def test_the_host_agrees_with_the_contract():
    """The host's own copy of the env file's path and of the metric names is the contract's (the host package
    imports nothing of sparkfleet)."""
    assert host_backup.ENV == contract.ENV
    assert host_backup.TAG == contract.TAG
    text = host_backup.textfile({"source": "chat-ui", "ok": True, "last_success": 5}, 3600)
    for metric in (contract.METRIC_LAST_SUCCESS, contract.METRIC_INTERVAL, contract.METRIC_LAST_RUN_OK):
        assert f'{metric}{{source="chat-ui"}}' in text


def test_env_lines_are_one_word_each():
    """A value is one shell word (quoted where it holds a blank or a metacharacter); a line that is not KEY=VALUE,
    or a value of two words, is refused rather than half read."""
    assert host_backup.parse_env("# c\nA='x y; rm -rf /'\nB=plain\n\nC=\n") == {"A": "x y; rm -rf /", "B": "plain",
                                                                               "C": ""}
    for bad in ("A=x y\n", "not a line\n", "A B=x\n", "A='unbalanced\n"):
        with pytest.raises(host_backup.BackupError, match="not KEY=VALUE"):
            host_backup.parse_env(bad)


# --- against a real restic ----------------------------------------------------------------------------------------


def make_config(tmp_path: Path, source: str = "chat-ui", repository: str | None = None, **more: str):
    state = tmp_path / "state"
    password = tmp_path / "password"
    if not password.exists():
        password.write_text("derived-password\n")
        password.chmod(0o600)
    values = {
        "RESTIC_REPOSITORY": repository or str(tmp_path / "repo"),
        "RESTIC_PASSWORD_FILE": str(password),
        "SPARKFLEET_BACKUP_SOURCE": source,
        "SPARKFLEET_BACKUP_FLEET": "abcdef012345",
        "SPARKFLEET_BACKUP_STATE": str(state),
        "SPARKFLEET_BACKUP_STAGING": str(state / "staging" / source),
        "SPARKFLEET_BACKUP_RECORD": str(state / "last.json"),
        "SPARKFLEET_BACKUP_TEXTFILE": str(tmp_path / "textfile" / "backup.prom"),
        "SPARKFLEET_BACKUP_DATA": str(tmp_path / "data"),
        "SPARKFLEET_BACKUP_DATABASES": ",".join(contract.CHAT_UI_DATABASES),
        "SPARKFLEET_BACKUP_EXCLUDED": ",".join(contract.CHAT_UI_EXCLUDED),
        "SPARKFLEET_BACKUP_INTERVAL_S": "3600",
        "SPARKFLEET_BACKUP_KEEP_HOURLY": "24",
        "SPARKFLEET_BACKUP_KEEP_DAILY": "7",
        "SPARKFLEET_BACKUP_KEEP_WEEKLY": "4",
        "SPARKFLEET_CHAT_UI_UNIT": "sparkfleet-chat-ui.service",
        **more,
    }
    return host_backup.Config(values)


def wal_database(path: Path, rows: int) -> sqlite3.Connection:
    """A WAL database whose rows are still only in its -wal file (no checkpoint ran): the connection kept open."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA wal_autocheckpoint=0")
    db.execute("CREATE TABLE chat (id INTEGER PRIMARY KEY, text TEXT)")
    db.execute("CREATE TABLE alembic_version (version_num TEXT)")
    db.execute("INSERT INTO alembic_version VALUES ('rev-b')")
    db.executemany("INSERT INTO chat (text) VALUES (?)", [(f"chat {i}",) for i in range(rows)])
    db.commit()
    return db


def chat_ui_data(tmp_path: Path, rows: int = 100) -> sqlite3.Connection:
    data = tmp_path / "data"
    db = wal_database(data / "webui.db", rows)
    (data / "uploads").mkdir()
    (data / "uploads" / "doc.pdf").write_bytes(b"%PDF uploaded")
    (data / "cache").mkdir()
    (data / "cache" / "model.bin").write_bytes(b"re-downloaded on demand")
    return db


def listed(config) -> list[dict]:
    return host_backup.snapshots(config)


def restored(config, tmp_path: Path, snapshot: str = "latest") -> Path:
    target = tmp_path / f"restored-{snapshot}"
    done = subprocess.run(["restic", "restore", snapshot, "--target", str(target)], env=host_backup.restic_env(config),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return target / config.staging.relative_to("/")


@pytest.mark.restic
def test_a_backup_holds_what_the_write_ahead_log_holds(tmp_path):
    """SQLite's online backup copies the rows a `cp` of webui.db would miss (they are only in its -wal file); the
    uploads travel, Open WebUI's cache does not; the repository is made on the first run only; the record and the
    textfile say so; nothing is left in the staging directory."""
    live = chat_ui_data(tmp_path, rows=250)
    assert (tmp_path / "data" / "webui.db-wal").stat().st_size > 0
    config = make_config(tmp_path)
    record = host_backup.run(config)
    assert record["ok"], record
    assert record["error"] is None and record["last_success"] and record["snapshot"]
    copy = restored(config, tmp_path)
    assert sqlite3.connect(copy / "webui.db").execute("SELECT count(*) FROM chat").fetchone() == (250,)
    assert not (copy / "webui.db-wal").exists()
    assert (copy / "uploads" / "doc.pdf").read_bytes() == b"%PDF uploaded"
    assert not (copy / "cache").exists()
    assert not config.staging.exists()
    [snapshot] = listed(config)
    assert snapshot["hostname"] == "chat-ui" and set(snapshot["tags"]) == {"sparkfleet", "fleet=abcdef012345"}
    assert json.loads(Path(config["SPARKFLEET_BACKUP_RECORD"]).read_text())["snapshot"] == record["snapshot"]
    text = Path(config["SPARKFLEET_BACKUP_TEXTFILE"]).read_text()
    assert f'{contract.METRIC_LAST_RUN_OK}{{source="chat-ui"}} 1' in text
    assert f'{contract.METRIC_LAST_SUCCESS}{{source="chat-ui"}} {record["last_success"]}' in text
    live.execute("INSERT INTO chat (text) VALUES ('later')")
    live.commit()
    second = host_backup.run(config)  # the existing repository is used, never made again
    assert second["ok"] and second["snapshot"] != record["snapshot"]
    # one snapshot an hour is kept (restic's --keep-hourly): the newer one
    assert [s["short_id"] for s in listed(config)] == [second["snapshot"]]
    live.close()


@pytest.mark.restic
def test_a_failed_backup_keeps_the_older_snapshots_and_the_last_success(tmp_path):
    """A target that does not answer, a password another fleet's repository does not open with, a disk that fills
    while staging: each is one line in the record (ok false, the last good one's time kept), the metric says the run
    failed, and every older snapshot is still there; a wrong password never makes the repository again."""
    chat_ui_data(tmp_path).close()
    config = make_config(tmp_path)
    good = host_backup.run(config)
    assert good["ok"]
    kept = [s["id"] for s in listed(config)]

    down = make_config(tmp_path, repository="sftp:sparkfleet-backup@192.0.2.1:/repos/chat-ui",
                       SPARKFLEET_BACKUP_SFTP_COMMAND="false")
    record = host_backup.run(down)
    assert not record["ok"] and "does not answer" in record["error"] and "\n" not in record["error"]
    assert record["last_success"] == good["last_success"] and record["snapshot"] == good["snapshot"]
    metrics = Path(config["SPARKFLEET_BACKUP_TEXTFILE"]).read_text()
    assert f'{contract.METRIC_LAST_RUN_OK}{{source="chat-ui"}} 0' in metrics

    other = tmp_path / "other-password"
    other.write_text("another fleet's\n")
    wrong = host_backup.Config({**config.values, "RESTIC_PASSWORD_FILE": str(other)})
    record = host_backup.run(wrong)
    assert not record["ok"] and "another fleet's repository, or a wrong backup password" in record["error"]
    assert "another fleet's\n" not in record["error"]  # the password itself is never in an error

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", "webui.db")

    original = host_backup.shutil.copy2
    host_backup.shutil.copy2 = full
    try:
        record = host_backup.run(config)
    finally:
        host_backup.shutil.copy2 = original
    assert not record["ok"] and "No space left on device" in record["error"]
    assert not config.staging.exists()
    assert record["last_success"] == good["last_success"]
    assert [s["id"] for s in listed(config)] == kept and len(kept) == 1


@pytest.mark.restic
def test_retention_prunes_after_good_backups_only(tmp_path):
    """`forget --prune` runs after a good backup with the settings' retention (one hourly kept: three runs in an
    hour leave one); a source's retention never touches another source's series in the same repository."""
    chat_ui_data(tmp_path).close()
    other = make_config(tmp_path, source="usage-door-1", SPARKFLEET_BACKUP_DATA=str(tmp_path / "usage.snapshot"))
    (tmp_path / "usage.snapshot").write_text("alice 12\n")
    assert host_backup.run(other)["ok"]
    config = make_config(tmp_path, SPARKFLEET_BACKUP_KEEP_HOURLY="1", SPARKFLEET_BACKUP_KEEP_DAILY="0",
                         SPARKFLEET_BACKUP_KEEP_WEEKLY="0")
    for _ in range(3):
        assert host_backup.run(config)["ok"]
    assert len(listed(config)) == 1
    [usage] = listed(other)
    assert (restored(other, tmp_path, usage["short_id"]) / "usage.snapshot").read_text() == "alice 12\n"


@pytest.mark.restic
def test_one_run_at_a_time(tmp_path):
    """A run while another holds the lock (restic 0.14 has no --retry-lock) fails in one line, touching nothing."""
    chat_ui_data(tmp_path).close()
    config = make_config(tmp_path)
    with host_backup.Locked(config):
        record = host_backup.run(config)
    assert not record["ok"] and "another backup or restore is running" in record["error"]
    assert listed(config) == []


# --- the chat UI's restore ----------------------------------------------------------------------------------------


class FakeHost(host_backup.Host):
    """systemd, the image's migrations and the UI's health, without a host: what was asked, in order."""

    def __init__(self, config, revisions=("rev-a", "rev-b"), answers=True):
        super().__init__(config)
        self.calls: list[tuple[str, ...]] = []
        self.known, self.answers = set(revisions), answers

    def systemctl(self, *args):
        self.calls.append(args)

    def revisions(self):
        return self.known

    def healthy(self, timeout_s):
        return self.answers


def backed_up_then_changed(tmp_path: Path):
    """A backup of 100 chats, then the live data changed (a chat more, a file more): what a restore replaces."""
    live = chat_ui_data(tmp_path, rows=100)
    config = make_config(tmp_path)
    assert host_backup.run(config)["ok"]
    live.execute("INSERT INTO chat (text) VALUES ('after the backup')")
    live.commit()
    live.close()
    (tmp_path / "data" / "uploads" / "new.txt").write_text("new")
    return config


def chats(data: Path) -> int:
    return sqlite3.connect(data / "webui.db").execute("SELECT count(*) FROM chat").fetchone()[0]


@pytest.mark.restic
def test_a_restore_puts_the_snapshot_in_place(tmp_path):
    """The UI stopped, the snapshot's data in place (0700), the cache kept, the UI started and answering, the
    replaced data gone; a dry run first changes nothing and says what it would replace."""
    config = backed_up_then_changed(tmp_path)
    data = tmp_path / "data"
    dry = FakeHost(config)
    said = host_backup.restore_chat_ui(config, "latest", dry_run=True, host=dry)
    assert said["dry_run"] and said["version"] == "rev-b" and "webui.db" in said["replaces"]
    assert dry.calls == [] and chats(data) == 101

    fake = FakeHost(config)
    done = host_backup.restore_chat_ui(config, "latest", dry_run=False, host=fake)
    assert done["ok"] and done["snapshot"] == listed(config)[-1]["id"]
    assert fake.calls == [("stop", "sparkfleet-chat-ui.service"), ("start", "sparkfleet-chat-ui.service")]
    assert chats(data) == 100 and not (data / "uploads" / "new.txt").exists()
    assert (data / "cache" / "model.bin").exists()
    assert data.stat().st_mode & 0o777 == 0o700
    assert not data.with_name("data.replaced").exists() and not (config.state / "restore").exists()


@pytest.mark.restic
def test_a_restore_that_cannot_be_is_refused_or_undone(tmp_path):
    """A database newer than the image (a revision it does not know) and a snapshot that does not exist are refused
    before the UI stops; a UI that does not answer on the restored data gets its own data back and is started."""
    config = backed_up_then_changed(tmp_path)
    data = tmp_path / "data"
    older = FakeHost(config, revisions=("rev-a",))
    with pytest.raises(host_backup.BackupError, match="revision rev-b, which the chat UI's image does not know"):
        host_backup.restore_chat_ui(config, "latest", dry_run=False, host=older)
    with pytest.raises(host_backup.BackupError, match="snapshot 'deadbeef' is not one of chat-ui's"):
        host_backup.restore_chat_ui(config, "deadbeef", dry_run=False, host=older)
    assert older.calls == [] and chats(data) == 101

    silent = FakeHost(config, answers=False)
    with pytest.raises(host_backup.BackupError, match="did not answer"):
        host_backup.restore_chat_ui(config, "latest", dry_run=False, host=silent, start_wait_s=0)
    assert [c[0] for c in silent.calls] == ["stop", "start", "stop", "start"]
    assert chats(data) == 101 and (data / "uploads" / "new.txt").exists() and (data / "cache" / "model.bin").exists()


@pytest.mark.restic
def test_the_command_line_prints_one_line(tmp_path):
    """`sparkfleet_host backup ...` as the unit and the controller run it: one JSON line for snapshots, one line on
    stderr and exit 1 for a failure (a host that is no source)."""
    chat_ui_data(tmp_path).close()
    config = make_config(tmp_path)
    env = tmp_path / "restic.env"
    env.write_text("".join(f"{k}={host_backup.shlex.quote(v)}\n" for k, v in config.values.items()))
    base = ["python3", str(shared.PACKAGE_DIR), "backup"]
    ran = subprocess.run([*base, "run", "--env", str(env)], capture_output=True, text=True)
    assert ran.returncode == 0 and ran.stdout.startswith("sparkfleet backup chat-ui: snapshot "), ran.stderr
    found = subprocess.run([*base, "snapshots", "--env", str(env)], capture_output=True, text=True)
    assert [s["hostname"] for s in json.loads(found.stdout)] == ["chat-ui"]
    missing = subprocess.run([*base, "run", "--env", str(tmp_path / "none.env")], capture_output=True, text=True)
    assert missing.returncode == 1 and len(missing.stderr.strip().splitlines()) == 1
    assert "this host is not a backup source" in missing.stderr
