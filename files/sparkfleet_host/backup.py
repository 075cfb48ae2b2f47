"""A data host's backup (sparkfleet/contract/backup.py, docs/backups.md): what `sparkfleet-backup.service` runs.

`python3 sparkfleet_host backup run`: one run, under a lock (restic 0.14 has no --retry-lock): the source's
consistent copy staged (its SQLite databases through SQLite's online backup API, then `PRAGMA integrity_check`;
every other file as it is; the excluded names left out), the repository made by `restic init` only where none
exists, `restic backup`, and only after a good one `restic forget --prune` (the retention). The record and the
textfile metrics are written (a temporary file, then a rename) after each run, good or not; a failed run keeps the
last good one's time and forgets nothing, and says why in one line of the journal.

`backup snapshots`: this source's snapshots (restic's JSON). `backup restore-chat-ui --snapshot ID|latest
[--dry-run]`: the chat UI's data put back from a snapshot (restore_chat_ui).

Everything a run needs comes from the source's env file (ENV, written by the converge: roles/backup.py): the
repository, the password's and the key's files (restic reads them: never a command line, never the journal), the
paths. No secret is ever printed: restic's own error lines name the repository, never the password.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.client import HTTPConnection
from pathlib import Path

ENV = "/etc/sparkfleet/backup/restic.env"  # contract/backup.py ENV (held equal by tests/unit/test_backup_host.py)
TAG = "sparkfleet"
RESTIC_TIMEOUT_S = 6 * 3600  # a first backup of a large store over a slow LAN
NO_REPOSITORY = "Is there a repository at the following location?"  # restic 0.14: a missing config (any backend)
WRONG_PASSWORD = "wrong password or no key found"


class BackupError(Exception):
    """One line for the journal and the record: what failed, and where it is useful, what to do."""


@dataclass(frozen=True)
class Config:
    """A source's env file, read: restic's variables and sparkfleet's (SPARKFLEET_BACKUP_*)."""

    values: dict[str, str]

    def __getitem__(self, name: str) -> str:
        try:
            return self.values[name]
        except KeyError:
            raise BackupError(f"{name} is missing from the backup's env file: converge the host") from None

    def get(self, name: str, default: str = "") -> str:
        return self.values.get(name, default)

    @property
    def source(self) -> str:
        return self["SPARKFLEET_BACKUP_SOURCE"]

    @property
    def state(self) -> Path:
        return Path(self["SPARKFLEET_BACKUP_STATE"])

    @property
    def staging(self) -> Path:
        return Path(self["SPARKFLEET_BACKUP_STAGING"])

    def names(self, name: str) -> tuple[str, ...]:
        return tuple(n for n in self.get(name).split(",") if n)


def parse_env(text: str) -> dict[str, str]:
    """KEY=VALUE lines, each value one shell word (as roles/backup.py writes them); comments and blanks skipped."""
    values = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, rest = line.partition("=")
        try:
            words = shlex.split(rest) if sep else []
        except ValueError:  # an unbalanced quote
            words = ["", ""]
        if not sep or not key.isidentifier() or len(words) > 1:
            raise BackupError(f"the backup's env file has a line that is not KEY=VALUE ({key[:40]!r}): "
                              "converge the host")
        values[key] = words[0] if words else ""
    return values


def read_config(path: str) -> Config:
    try:
        return Config(parse_env(Path(path).read_text()))
    except FileNotFoundError:
        raise BackupError(f"{path} is missing: this host is not a backup source (converge it with a `backup` "
                          "group or `backup_repository`)") from None


# --- restic ------------------------------------------------------------------------------------------------------


def restic_env(config: Config) -> dict[str, str]:
    """restic's environment: the repository and the password's file (never the password), its cache under STATE."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESTIC_")}
    env.update(RESTIC_REPOSITORY=config["RESTIC_REPOSITORY"], RESTIC_PASSWORD_FILE=config["RESTIC_PASSWORD_FILE"],
               RESTIC_CACHE_DIR=str(config.state / "cache"))
    return env


def restic_argv(config: Config, *args: str) -> list[str]:
    """`restic ARGS`, with the SFTP command (its key and known_hosts are files) where the repository is sftp:."""
    options = ["-o", f"sftp.command={config.get('SPARKFLEET_BACKUP_SFTP_COMMAND')}"] \
        if config.get("SPARKFLEET_BACKUP_SFTP_COMMAND") else []
    return [config.get("SPARKFLEET_BACKUP_RESTIC", "restic"), *options, *args]


def restic(config: Config, *args: str, timeout_s: float = RESTIC_TIMEOUT_S) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(restic_argv(config, *args), env=restic_env(config), capture_output=True, text=True,
                              timeout=timeout_s, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise BackupError("restic is not installed: converge the host") from None
    except subprocess.TimeoutExpired:
        raise BackupError(f"restic {args[0]} took over {int(timeout_s)} s: stopped") from None


def fatal_line(stderr: str) -> str:
    """restic's one useful line: its `Fatal:` line, else its last line (its output names no secret), printable
    characters only (what a repository's far side says is untrusted), cut short. The controller's too."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    fatal = [line for line in lines if line.startswith("Fatal:")]
    return "".join(c for c in (fatal or lines or ["no output"])[-1] if c.isprintable())[:300]


def open_repository(config: Config) -> bool:
    """Open the source's repository, made by `restic init` only where none exists; True when it was made. A
    repository that exists and does not open with this source's password is never made again."""
    found = restic(config, "cat", "config", timeout_s=300)
    if found.returncode == 0:
        return False
    if WRONG_PASSWORD in found.stderr:
        raise BackupError(f"the repository {config['RESTIC_REPOSITORY']} does not open with this source's password: "
                          "another fleet's repository, or a wrong backup password (controller_backup_password_file)")
    if NO_REPOSITORY not in found.stderr:
        raise BackupError(f"the repository {config['RESTIC_REPOSITORY']} does not answer: {fatal_line(found.stderr)}")
    made = restic(config, "init", timeout_s=300)
    if made.returncode != 0:
        raise BackupError(f"restic init {config['RESTIC_REPOSITORY']} failed: {fatal_line(made.stderr)}")
    return True


def summary(stdout: str) -> dict:
    """The summary message of `restic backup --json` (its last line: snapshot_id, data_added,
    total_bytes_processed, total_duration). The controller's too."""
    for line in reversed(stdout.splitlines()):
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if isinstance(message, dict) and message.get("message_type") == "summary":
            return message
    return {}


def snapshots(config: Config) -> list[dict]:
    """This source's snapshots, oldest first (restic's JSON)."""
    found = restic(config, "snapshots", "--json", "--host", config.source, "--tag", TAG, timeout_s=300)
    if found.returncode != 0:
        if NO_REPOSITORY in found.stderr:
            return []
        if WRONG_PASSWORD in found.stderr:
            raise BackupError(f"the repository {config['RESTIC_REPOSITORY']} does not open with this source's "
                              "password: another fleet's repository, or a wrong backup password")
        raise BackupError(f"restic snapshots failed: {fatal_line(found.stderr)}")
    listed = json.loads(found.stdout or "[]")
    return sorted(listed or [], key=lambda s: s.get("time", ""))


def forget(config: Config) -> None:
    """The retention after a good backup: restic's forget of this source's series, then its prune. No policy (every
    keep 0) keeps everything: restic would otherwise be asked to remove every snapshot."""
    keep = [(flag, config.get(f"SPARKFLEET_BACKUP_KEEP_{flag.upper()}", "0")) for flag in ("hourly", "daily", "weekly")]
    if all(int(n) == 0 for _, n in keep):
        return
    args = [a for flag, n in keep for a in (f"--keep-{flag}", n)]
    done = restic(config, "forget", "--host", config.source, "--tag", TAG, *args, "--prune")
    if done.returncode != 0:
        raise BackupError(f"the retention (restic forget --prune) failed: {fatal_line(done.stderr)}")


# --- the consistent copy -----------------------------------------------------------------------------------------

SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def copy_database(source: Path, copy: Path) -> None:
    """A live SQLite database copied through SQLite's online backup API (what its write-ahead log holds included:
    a `cp` misses it), in rollback-journal mode (one file), checked with `PRAGMA integrity_check`."""
    copy.parent.mkdir(parents=True, exist_ok=True)
    src = sqlite3.connect(source, timeout=60)  # read only; read-only mode would want a WAL database's -shm
    dst = sqlite3.connect(copy)
    try:
        src.backup(dst)
        dst.execute("PRAGMA journal_mode=DELETE")
        verdict = dst.execute("PRAGMA integrity_check").fetchone()[0]
    except sqlite3.Error as exc:
        raise BackupError(f"{source}: SQLite's backup failed: {exc}") from None
    finally:
        src.close()
        dst.close()
    if verdict != "ok":
        raise BackupError(f"{source}: the copy fails SQLite's integrity check ({str(verdict)[:100]})")


def stage(config: Config) -> int:
    """The source's consistent copy in its staging directory (made anew, 0700): the number of files staged. DATA is
    a directory (its databases through copy_database, every other file copied, EXCLUDED names left out) or one
    file (a door's usage snapshot, which its writer replaces by a rename: a copy is whole)."""
    data, staging = Path(config["SPARKFLEET_BACKUP_DATA"]), config.staging
    databases, excluded = config.names("SPARKFLEET_BACKUP_DATABASES"), config.names("SPARKFLEET_BACKUP_EXCLUDED")
    clean(staging)
    staging.mkdir(mode=0o700, parents=True)
    if data.is_file():
        shutil.copy2(data, staging / data.name)
        return 1
    if not data.is_dir():
        raise BackupError(f"{data}: nothing to back up there (no such file or directory)")
    skipped = {Path(db + side) for db in databases for side in ("", *SQLITE_SIDE_FILES)}
    count = 0
    for db in databases:
        if (data / db).is_file():  # an optional database (the vector store's) not made yet is skipped
            copy_database(data / db, staging / db)
            count += 1
    for root, dirs, files in os.walk(data):
        relative = Path(root).relative_to(data)
        if relative == Path("."):
            dirs[:] = [d for d in dirs if d not in excluded]
        (staging / relative).mkdir(mode=0o700, parents=True, exist_ok=True)
        for name in files:
            if relative / name in skipped or (relative == Path(".") and name in excluded):
                continue
            shutil.copy2(Path(root) / name, staging / relative / name, follow_symlinks=False)
            count += 1
    return count


def clean(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


# --- the record and the metrics ----------------------------------------------------------------------------------


def write_atomically(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_record(path: Path) -> dict:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def textfile(record: dict, interval_s: int) -> str:
    """The node exporter's textfile: the last good backup's time (0: none yet), the interval, the last run's
    verdict, each labelled with the source (contract/backup.py's METRIC_* names)."""
    label = f'{{source="{record["source"]}"}}'
    rows = [("sparkfleet_backup_last_success_timestamp_seconds", "unix time of the last good backup",
             record.get("last_success") or 0),
            ("sparkfleet_backup_interval_seconds", "the backup timer's interval", interval_s),
            ("sparkfleet_backup_last_run_ok", "1 when the last backup run made a snapshot", int(bool(record["ok"])))]
    return "".join(f"# HELP {name} {what}\n# TYPE {name} gauge\n{name}{label} {value}\n" for name, what, value in rows)


def write_record(config: Config, record: dict) -> None:
    write_atomically(Path(config["SPARKFLEET_BACKUP_RECORD"]), json.dumps(record, sort_keys=True) + "\n")
    interval = int(config.get("SPARKFLEET_BACKUP_INTERVAL_S", "3600"))
    write_atomically(Path(config["SPARKFLEET_BACKUP_TEXTFILE"]), textfile(record, interval))


class Locked:
    """One run at a time on a host (a backup, a restore): an exclusive flock on STATE/lock, not waited for."""

    def __init__(self, config: Config) -> None:
        self.path = config.state / "lock"

    def __enter__(self) -> Locked:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            raise BackupError("another backup or restore is running on this host: try again when it is done") from None
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)


def run(config: Config, now: Callable[[], float] = time.time) -> dict:
    """One backup run (the unit's): its record, written whatever happened."""
    started = now()
    previous = read_record(Path(config["SPARKFLEET_BACKUP_RECORD"]))
    record = {"source": config.source, "ok": False, "finished": None, "snapshot": previous.get("snapshot"),
              "last_success": previous.get("last_success"), "error": None}
    try:
        with Locked(config):
            try:
                files = stage(config)
                open_repository(config)
                made = restic(config, "backup", "--json", "--host", config.source, "--tag", TAG, "--tag",
                              f"fleet={config['SPARKFLEET_BACKUP_FLEET']}", str(config.staging))
            except OSError as exc:  # a disk that fills while staging, a file that went away
                raise BackupError(f"staging the copy failed: {exc.strerror or exc}: {exc.filename or ''}") from None
            finally:
                clean(config.staging)
            done = summary(made.stdout)
            if made.returncode != 0 or not done.get("snapshot_id"):
                raise BackupError(f"restic backup failed: {fatal_line(made.stderr)}")
            record.update(snapshot=done["snapshot_id"], last_success=int(now()), files=files,
                          bytes_added=done.get("data_added"), duration_s=round(now() - started, 1))
            forget(config)  # only after a good backup: a failed one forgets nothing
            record["ok"] = True
    except BackupError as exc:
        record["error"] = str(exc)
    record["finished"] = int(now())
    write_record(config, record)
    return record


# --- the chat UI's restore ---------------------------------------------------------------------------------------

# What the pinned Open WebUI knows: its Alembic revisions, read from its package's migrations (no import of it)
REVISIONS_SCRIPT = """\
import glob, importlib.util, json, os, re
spec = importlib.util.find_spec("open_webui")
revs = []
for where in spec.submodule_search_locations:
    for f in glob.glob(os.path.join(where, "migrations", "versions", "*.py")):
        m = re.search(r"^revision(?:\\s*:\\s*str)?\\s*=\\s*[\\"']([^\\"']+)", open(f).read(), re.M)
        if m:
            revs.append(m.group(1))
print(json.dumps(sorted(revs)))
"""


@dataclass
class Host:
    """What a restore does to its host, replaceable in tests: systemd, the image's revisions, the UI's health."""

    config: Config

    def systemctl(self, *args: str) -> None:
        done = subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise BackupError(f"systemctl {' '.join(args)} failed: {(done.stderr.strip() or 'no output')[:200]}")

    def revisions(self) -> set[str]:
        """The Alembic revisions the chat UI's image knows: from its running container, else from the pinned
        image itself (a throw-away container with no network)."""
        container = self.config["SPARKFLEET_CHAT_UI_CONTAINER"]
        running = subprocess.run(["docker", "exec", container, "python3", "-c", REVISIONS_SCRIPT],
                                 capture_output=True, text=True, timeout=120)
        if running.returncode != 0:
            image = image_ref(Path(self.config["SPARKFLEET_CHAT_UI_IMAGE_RECORD"]))
            running = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3",
                                      image, "-c", REVISIONS_SCRIPT], capture_output=True, text=True, timeout=600)
        try:
            found = json.loads(running.stdout) if running.returncode == 0 else None
        except ValueError:
            found = None
        if not found:
            raise BackupError("the chat UI's image did not list its database migrations: "
                              f"{(running.stderr.strip() or 'no output')[-200:]}")
        return set(found)

    def healthy(self, timeout_s: float) -> bool:
        """Whether the chat UI answers its health URL on its socket within timeout_s."""
        sock, path = self.config["SPARKFLEET_CHAT_UI_SOCKET"], self.config.get("SPARKFLEET_CHAT_UI_HEALTH", "/health")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if answers(sock, path):
                return True
            time.sleep(1)
        return False


class UnixHTTPConnection(HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("open-webui", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


def answers(sock: str, path: str) -> bool:
    connection = UnixHTTPConnection(sock, 5)
    try:
        connection.request("GET", path)
        return 200 <= connection.getresponse().status < 400
    except OSError:
        return False
    finally:
        connection.close()


def image_ref(record: Path) -> str:
    try:
        ref = json.loads(record.read_text()).get("ref")
    except (OSError, ValueError, AttributeError):
        ref = None
    if not isinstance(ref, str) or not ref:
        raise BackupError(f"{record} names no image: converge the chat UI's host first")
    return ref


def chosen_snapshot(config: Config, wanted: str) -> dict:
    """The snapshot `wanted` names (an id, its short id, or `latest`) of this source; one line when there is none."""
    found = snapshots(config)
    if not found:
        raise BackupError(f"the repository holds no snapshot of {config.source}: take one with `sparkfleet backup`")
    if wanted == "latest":
        return found[-1]
    matches = [s for s in found if wanted in (s.get("id"), s.get("short_id"))
               or (len(wanted) >= 8 and str(s.get("id", "")).startswith(wanted))]
    if len(matches) != 1:
        raise BackupError(f"snapshot {wanted!r} is not one of {config.source}'s ({len(found)} snapshots, the latest "
                          f"{found[-1].get('short_id')}): name one of them, or latest")
    return matches[0]


def database_version(db: Path) -> str | None:
    """Open WebUI's Alembic revision in a database (None: a database from before its Alembic migrations)."""
    connection = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        row = connection.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.Error:
        return None
    finally:
        connection.close()
    return row[0] if row else None


def restored_data(config: Config, snapshot: dict, into: Path, only: str | None = None) -> Path:
    """The snapshot restored under `into` (only the file `only`, relative to the data, where given): the data's
    directory there (restic restores the snapshot's absolute path)."""
    args = ["restore", snapshot["id"], "--target", str(into)]
    if only:
        args += ["--include", str(config.staging / only)]
    done = restic(config, *args)
    if done.returncode != 0:
        raise BackupError(f"restic restore of {snapshot['short_id']} failed: {fatal_line(done.stderr)}")
    return into / config.staging.relative_to("/")


def restore_chat_ui(config: Config, wanted: str, dry_run: bool, host: Host | None = None,
                    start_wait_s: float | None = None) -> dict:
    """Put the chat UI's data back from a snapshot: the snapshot checked, restored beside, its database's version
    checked against the image's migrations (a newer one refused; an older one Open WebUI migrates at its start),
    the UI stopped, its data moved aside, the restored data in its place, the UI started and answering; the data it
    replaced is removed only then, and put back (the UI started again) when it does not answer."""
    host = host or Host(config)
    if config.source != "chat-ui":
        raise BackupError(f"this host backs up {config.source}, not the chat UI: restore on the chat UI's host")
    data = Path(config["SPARKFLEET_BACKUP_DATA"])
    wait = start_wait_s if start_wait_s is not None else float(config.get("SPARKFLEET_CHAT_UI_START_WAIT_S", "300"))
    with Locked(config):
        snapshot = chosen_snapshot(config, wanted)
        work = config.state / "restore"
        clean(work)
        work.mkdir(mode=0o700, parents=True)
        try:
            restored = restored_data(config, snapshot, work, only="webui.db" if dry_run else None)
            db = restored / "webui.db"
            if not db.is_file():
                raise BackupError(f"snapshot {snapshot['short_id']} holds no webui.db: not a chat UI's data")
            version = database_version(db)
            known = host.revisions()
            if version is not None and version not in known:
                raise BackupError(f"snapshot {snapshot['short_id']}'s database is at revision {version}, which the "
                                  "chat UI's image does not know (a newer Open WebUI's): set `chat_ui_image` to "
                                  "that version, converge, then restore")
            result = {"ok": True, "snapshot": snapshot["id"], "time": snapshot.get("time"), "version": version,
                      "data": str(data), "replaces": sorted(p.name for p in data.iterdir()) if data.is_dir() else []}
            if dry_run:
                return {**result, "dry_run": True}
            swap(host, restored, data, wait)
            return result
        finally:
            clean(work)


def swap(host: Host, restored: Path, data: Path, wait_s: float) -> None:
    """The UI stopped, `data` moved aside, `restored` in its place (root, 0700, as the chat UI's role makes it;
    the old data's cache/, left out of backups, carried over), the UI started; the old data removed once the UI
    answers, else put back and the UI started on it."""
    unit = host.config["SPARKFLEET_CHAT_UI_UNIT"]
    aside = data.with_name(f"{data.name}.replaced")
    clean(aside)
    host.systemctl("stop", unit)
    had_data = data.exists()
    if had_data:
        os.rename(data, aside)
    carried: list[str] = []
    try:
        shutil.move(str(restored), str(data))
        if os.geteuid() == 0:
            os.chown(data, 0, 0)
        os.chmod(data, 0o700)
        for name in host.config.names("SPARKFLEET_BACKUP_EXCLUDED"):
            if (aside / name).exists() and not (data / name).exists():
                os.rename(aside / name, data / name)
                carried.append(name)
        host.systemctl("start", unit)
        if not host.healthy(wait_s):
            raise BackupError(f"the chat UI did not answer within {int(wait_s)} s on the restored data: its data "
                              f"before the restore is back in place (journalctl -u {unit})")
    except BaseException:
        try:
            host.systemctl("stop", unit)
        finally:
            for name in carried:
                os.rename(data / name, aside / name)
            clean(data)
            if had_data:
                os.rename(aside, data)
            host.systemctl("start", unit)
        raise
    clean(aside)


# --- the command line --------------------------------------------------------------------------------------------


def main(argv: Sequence[str]) -> int:
    """`backup run | snapshots | restore-chat-ui --snapshot ID|latest [--dry-run]` [--env ENV]: one line of JSON
    on stdout for snapshots and restore-chat-ui; a failure is one line on stderr and a non-zero exit."""
    import argparse

    parser = argparse.ArgumentParser(prog="sparkfleet_host backup")
    parser.add_argument("action", choices=("run", "snapshots", "restore-chat-ui"))
    parser.add_argument("--env", default=ENV)
    parser.add_argument("--snapshot")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(list(argv))
    try:
        config = read_config(args.env)
        if args.action == "run":
            record = run(config)
            if not record["ok"]:
                print(f"sparkfleet backup {record['source']}: failed: {record['error']}", file=sys.stderr)
                return 1
            print(f"sparkfleet backup {record['source']}: snapshot {record['snapshot']} ({record.get('files')} "
                  f"files, {record.get('bytes_added')} bytes added, {record.get('duration_s')} s)")
            return 0
        if args.action == "snapshots":
            print(json.dumps(snapshots(config)))
            return 0
        if not args.snapshot:
            raise BackupError("restore-chat-ui needs --snapshot ID (or latest)")
        print(json.dumps(restore_chat_ui(config, args.snapshot, args.dry_run)))
        return 0
    except BackupError as exc:
        if args.action == "restore-chat-ui":
            print(json.dumps({"ok": False, "error": str(exc)}))
        print(f"sparkfleet backup {args.action}: {exc}", file=sys.stderr)
        return 1
