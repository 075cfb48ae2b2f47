"""The controller's side of the backups (contract/backup.py; docs/backups.md): its own state backed up, each data
host's unit started and its record read back, the snapshots listed, the controller's files and the chat UI put back.

restic runs on the controller with every secret in a file: RESTIC_PASSWORD_FILE names a 0600 file holding the
source's derived password, and `sftp.command` names the source's derived key in a 0600 file, both in a private
temporary directory (0700) removed when the run ends. No password or key is ever on a command line, in the
environment or in a log. The target is the host of the group `backup`, reached as the inventory names it (its
ssh_hostname, ssh_port and pinned known_hosts, strictly) as the jailed SFTP user; or the office's own
`backup_repository` (then restic reaches it as the user's own SSH configuration or S3 variables say).

A repository is made (`restic init`) only where there is none; one that does not open with the derived password is
another fleet's, or the password is wrong: one line, never made again. Retention (`forget --prune`) runs only after a
good backup. The controller's own record (`controller_record`, the shape of contract.backup.RECORD) sits beside the
password file, for `status`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkfleet.contract import backup as contract
from sparkfleet.contract import private_files, shared
from sparkfleet.contract.paths import HOST_MODULE
from sparkfleet.refused import FAILED, INVALID, Refusal

RESTIC = "restic"
RESTIC_TIMEOUT_S = 3600  # one restic command of the controller's (its state is a few files)
HOST_TIMEOUT_S = 6 * 3600  # a data host's unit: a first backup of a large chat UI over a slow LAN
SSH_OPTIONS = ("-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
               "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4")
# restic 0.14's words for a missing repository and a wrong password: the host's reading, one owner
NO_REPOSITORY, WRONG_PASSWORD = shared.backup.NO_REPOSITORY, shared.backup.WRONG_PASSWORD
CONTROLLER_HOST = "controller"  # the `host` column of the controller's own row
# a restored file's mode: the certificates are handed out (0644, as `init` makes them), the lock is committed
PUBLIC_FILES = {"front-door.crt": 0o644, "fleet-ca.crt": 0o644, "sparkfleet.lock": 0o644}


class BackupError(ValueError, Refusal):
    """A backup or a restore cannot go on: one line naming the problem and the fix (exit 2 for bad input, 1 for a
    target or host that did not answer or a check that failed)."""

    def __init__(self, message: str, code: int = INVALID):
        super().__init__(message)
        self.code = code


# --- the office's password ----------------------------------------------------------------------------------------


def password_file_beside(secrets: Path) -> Path:
    """Where `sparkfleet init` keeps the office's backup password: beside the secrets file."""
    return secrets.with_suffix(".backup-password")


def controller_record(password_file: Path) -> Path:
    """The controller's own last backup (contract.backup.RECORD's shape), beside the password file."""
    return password_file.with_name(f"{password_file.name}.last.json")


def read_password(path: Path, what: str = "the backup password file") -> str:
    """The office's password from its file (one line, 0600): one line naming the fix when it cannot be used."""
    try:
        problem = private_files.open_to_others(path, what)
        text = path.read_text()
    except FileNotFoundError:
        raise BackupError(f"no backup password at {path}: `sparkfleet init --force` makes one in an existing project "
                          "(write it down), or put the office's password there (one line, chmod 600)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BackupError(f"cannot read {what} {path} ({getattr(exc, 'strerror', None) or exc}): "
                          "make it readable by you") from None
    if problem:
        raise BackupError(problem)
    password = text.strip()
    if not password or "\n" in password:
        raise BackupError(f"{what} {path} must hold the password on one line: fix it")
    return password


write_private = private_files.write_private  # the controller's one writer of a file only its owner reads


def new_password_file(path: Path) -> str | None:
    """A fresh office password at `path` (0600), returned to be shown once; None where a file is there already
    (kept: every snapshot's password derives from it)."""
    if path.exists():
        return None
    password = contract.new_password()
    write_private(path, (password + "\n").encode())
    return password


# --- where the repositories are -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """The backup host as the controller reaches it: the inventory's address, port and pinned known_hosts."""

    host: str
    address: str
    port: int | None = None
    known_hosts: str | None = None


def _word(value: str, what: str) -> str:
    """A value for restic's `sftp.command`, which restic splits at blanks itself: refused when it holds one."""
    if not value or any(c.isspace() or c in "\"'\\" for c in value):
        raise BackupError(f"{what} {value!r} holds a blank or a quote, which restic's sftp.command cannot carry: "
                          "use a path without one")
    return value


def sftp_command(target: Target, key_file: str) -> str:
    """restic's `sftp.command`: OpenSSH as the target's jailed SFTP user with the source's key (a file), the pinned
    known_hosts and strict checking, no agent, no password prompt."""
    argv = ["ssh", "-i", _word(key_file, "the key's temporary file")]
    if target.port:
        argv += ["-p", str(int(target.port))]
    if target.known_hosts:
        known = _word(str(Path(target.known_hosts).expanduser()), "ssh_known_hosts_file")
        argv += ["-o", f"UserKnownHostsFile={known}"]
    argv += [*SSH_OPTIONS, f"{contract.TARGET_USER}@{_word(target.address, 'the backup host address')}", "-s", "sftp"]
    return " ".join(argv)


def repository_of(source: str, target: Target | None, base: str | None) -> str:
    """A source's repository: under the office's own `backup_repository`, else on the backup host."""
    if base:
        return contract.named_repository(base, source)
    if target is None:
        raise BackupError("the inventory names no backup target: add a group `backup` (one host, off the chat UI's "
                          "box) or set backup_repository")
    return contract.sftp_repository(target.address, source)


# --- restic on the controller --------------------------------------------------------------------------------------


def fatal_line(stderr: str) -> str:
    return shared.backup.fatal_line(stderr)


@dataclass
class Restic:
    """restic against one source's repository; its password and key in `private` (a 0600 file each)."""

    repository: str
    source: str
    private: Path
    sftp: str | None = None
    runner: Callable[..., subprocess.CompletedProcess] = subprocess.run

    def env(self) -> dict[str, str]:
        """The caller's environment (HOME and SSH's agent for an office's own sftp:, S3's variables) less every
        RESTIC_ variable, and the repository and the password's file."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RESTIC_")}
        env.update(RESTIC_REPOSITORY=self.repository, RESTIC_PASSWORD_FILE=str(self.private / "password"))
        return env

    def argv(self, *args: str) -> list[str]:
        return [RESTIC, "--no-cache", *(["-o", f"sftp.command={self.sftp}"] if self.sftp else []), *args]

    def run(self, *args: str, timeout_s: float = RESTIC_TIMEOUT_S, cwd: Path | None = None
            ) -> subprocess.CompletedProcess:
        try:
            return self.runner(self.argv(*args), env=self.env(), capture_output=True, timeout=timeout_s,
                               stdin=subprocess.DEVNULL, cwd=cwd)
        except FileNotFoundError:
            raise BackupError("no restic on this controller: apt-get install restic") from None
        except subprocess.TimeoutExpired:
            raise BackupError(f"restic {args[0]} on {self.repository} took over {int(timeout_s)} s: stopped "
                              "(is the backup target answering?)", FAILED) from None

    def problem(self, done: subprocess.CompletedProcess, doing: str) -> BackupError:
        """What a failed restic command means, in one line."""
        stderr = _text(done.stderr)
        if WRONG_PASSWORD in stderr:
            return BackupError(f"the repository {self.repository} does not open with this office's password: "
                               "another fleet's repository, or a wrong backup password (check "
                               "controller_backup_password_file, or the password you gave)")
        if NO_REPOSITORY in stderr:
            return BackupError(f"no repository at {self.repository}: nothing of {self.source} was backed up there "
                               "yet (sparkfleet backup INVENTORY), or the backup target is another", FAILED)
        return BackupError(f"restic {doing} on {self.repository} failed: {fatal_line(stderr)}", FAILED)


def _text(data) -> str:
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else (data or "")


@contextlib.contextmanager
def restic_for(repository: str, password: str, source: str, target: Target | None = None,
               runner: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> Iterator[Restic]:
    """A `Restic` for `source`'s repository: its derived password (and, with a target, its derived key) in a private
    temporary directory for as long as the block runs, removed after it whatever happened."""
    private = Path(tempfile.mkdtemp(prefix="sparkfleet-restic-"))  # 0700
    try:
        write_private(private / "password", contract.repository_password(password, source).encode())
        sftp = None
        if target is not None:
            key, _public = contract.ssh_key(password, source)
            write_private(private / "id_ed25519", key.encode())
            sftp = sftp_command(target, str(private / "id_ed25519"))
        yield Restic(repository, source, private, sftp, runner)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def open_repository(r: Restic, create: bool) -> bool:
    """The repository opened (`cat config`); made (`restic init`) only where there is none and `create` says so.
    True when it was made. One that exists and does not open is never made again."""
    found = r.run("cat", "config", timeout_s=300)
    if found.returncode == 0:
        return False
    if not create or NO_REPOSITORY not in _text(found.stderr):
        raise r.problem(found, "cat config")
    made = r.run("init", timeout_s=300)
    if made.returncode != 0:
        raise r.problem(made, "init")
    return True


def summary(stdout) -> dict:
    """The summary of `restic backup --json`: the host's own reading (files/sparkfleet_host/backup.py)."""
    return shared.backup.summary(_text(stdout))


def snapshots(r: Restic) -> list[dict]:
    """The source's snapshots, oldest first (restic's JSON); none where there is no repository yet."""
    done = r.run("snapshots", "--json", "--host", r.source, timeout_s=300)
    if done.returncode != 0:
        if NO_REPOSITORY in _text(done.stderr):
            return []
        raise r.problem(done, "snapshots")
    try:
        found = json.loads(_text(done.stdout) or "[]")
    except ValueError:
        raise BackupError(f"restic snapshots on {r.repository} printed no JSON: is restic 0.14 or later "
                          "installed?", FAILED) from None
    return sorted((s for s in found or [] if isinstance(s, dict)), key=lambda s: str(s.get("time", "")))


def fleet_tag(password: str) -> str:
    return f"fleet={contract.fleet_id(password)}"


def pick_snapshot(found: list[dict], wanted: str, source: str, fleet: str) -> dict:
    """The snapshot `wanted` names (`latest`, an id or a prefix of one), refused in one line when there is none or
    when another fleet wrote it (its `fleet=` tag is not this office's)."""
    ours = [s for s in found if fleet in (s.get("tags") or [])]
    if wanted == "latest":
        if ours:
            return ours[-1]
        if found:
            raise BackupError(f"the snapshots of {source} were written by another fleet (none tagged {fleet}): "
                              "check the inventory's backup target", FAILED)
        raise BackupError(f"there is no snapshot of {source} yet: take one with `sparkfleet backup INVENTORY`", FAILED)
    matches = [s for s in found if str(s.get("id", "")).startswith(wanted) or s.get("short_id") == wanted]
    if len(wanted) < 4 or not matches:
        listed = ", ".join(str(s.get("short_id")) for s in ours[-5:]) or "none"
        raise BackupError(f"no snapshot {wanted!r} of {source} (its latest: {listed}): `sparkfleet backup INVENTORY "
                          "--list` lists them, or leave --snapshot out for the latest")
    if len(matches) > 1:
        raise BackupError(f"snapshot {wanted!r} names {len(matches)} snapshots of {source}: give more of its id")
    if fleet not in (matches[0].get("tags") or []):
        raise BackupError(f"snapshot {wanted} of {source} was written by another fleet (not tagged {fleet}): refused")
    return matches[0]


def forget(r: Restic, keep: tuple[int, int, int]) -> None:
    """The retention after a good backup: the source's series (grouped by restic host: the staging path may move)
    kept by hour, day and week, then pruned. Every keep 0: nothing is forgotten (no policy)."""
    if not any(keep):
        return
    args = [a for flag, n in zip(("hourly", "daily", "weekly"), keep, strict=True) for a in (f"--keep-{flag}", str(n))]
    done = r.run("forget", "--host", r.source, "--group-by", "host", *args, "--prune")
    if done.returncode != 0:
        raise r.problem(done, "forget --prune")


# --- one source's result -------------------------------------------------------------------------------------------


@dataclass
class Result:
    """One source's backup now: a row of `sparkfleet backup`'s table."""

    source: str
    host: str
    ok: bool = False
    snapshot: str | None = None
    bytes_added: int | None = None
    total_bytes: int | None = None
    seconds: float | None = None
    files: list[str] = field(default_factory=list)
    error: str | None = None

    def to_dict(self) -> dict:
        return {"source": self.source, "host": self.host, "ok": self.ok, "snapshot": self.snapshot,
                "bytes_added": self.bytes_added, "total_bytes": self.total_bytes, "seconds": self.seconds,
                "files": self.files, "error": self.error}


def write_record(path: Path, result: Result, now: float, previous: dict | None = None) -> dict:
    """The controller's record (contract.backup.RECORD's shape), whatever happened: a failed run keeps the last good
    one's time and snapshot."""
    previous = previous or {}
    record = {"source": result.source, "ok": result.ok, "finished": int(now),
              "snapshot": result.snapshot if result.ok else previous.get("snapshot"),
              "last_success": int(now) if result.ok else previous.get("last_success"),
              "error": result.error, "bytes_added": result.bytes_added, "duration_s": result.seconds}
    write_private(path, (json.dumps(record, sort_keys=True) + "\n").encode())
    return record


def read_record(path: Path) -> dict | None:
    """A record as written (None: none, or not a JSON object)."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


# --- the controller's state ---------------------------------------------------------------------------------------


def stage(files: dict[str, Path | None], into: Path) -> list[str]:
    """Each named file that exists copied into `into` under its contract name (0600): the names staged."""
    staged = []
    for name in contract.CONTROLLER_FILES:
        where = files.get(name)
        if where is None or not Path(where).is_file():
            continue
        shutil.copyfile(where, into / name)
        os.chmod(into / name, 0o600)
        staged.append(name)
    return staged


@contextlib.contextmanager
def _one_at_a_time(password_file: Path) -> Iterator[None]:
    """One controller backup at a time (restic 0.14 fails at once on a locked repository): a flock beside the
    password file, waited for."""
    fd = os.open(password_file.with_name(f".{password_file.name}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def backup_controller(repository: str, password: str, files: dict[str, Path | None], keep: tuple[int, int, int],
                      target: Target | None = None, record: Path | None = None,
                      runner: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> Result:
    """The controller's state now: the files the inventory names staged under CONTROLLER_FILES' names in a private
    temporary directory, `restic backup --host controller --tag sparkfleet --tag fleet=<id>` of it (the repository
    made only where there is none), then the retention. Never raises for a failure: the result says it, and the
    record (`record`) keeps the last good one."""
    result = Result(contract.CONTROLLER, CONTROLLER_HOST)
    started = time.monotonic()
    try:
        with restic_for(repository, password, contract.CONTROLLER, target, runner) as r:
            staging = r.private / contract.CONTROLLER
            staging.mkdir(mode=0o700)
            result.files = stage(files, staging)
            if not result.files:
                raise BackupError("none of the controller's files the inventory names exists: nothing to back up")
            open_repository(r, create=True)
            # `.` from inside the staging directory: the files at the snapshot's root (/secrets.json, ...), wherever
            # the temporary directory was (restic keeps an absolute target's whole path in the tree)
            done = r.run("backup", "--json", "--host", contract.CONTROLLER, "--tag", contract.TAG,
                         "--tag", fleet_tag(password), ".", cwd=staging)
            made = summary(done.stdout)
            if done.returncode != 0 or not made.get("snapshot_id"):
                raise r.problem(done, "backup")
            result.ok, result.snapshot = True, str(made["snapshot_id"])
            result.bytes_added, result.total_bytes = made.get("data_added"), made.get("total_bytes_processed")
            forget(r, keep)  # only after a good backup
    except BackupError as exc:
        result.ok, result.error = False, str(exc)
    except OSError as exc:  # a file that went away while staged, a full temporary disk
        result.ok, result.error = False, f"staging the controller's files failed: {exc.strerror or exc}"
    result.seconds = round(time.monotonic() - started, 1)
    if record is not None:
        write_record(record, result, time.time(), read_record(record))
    return result


def restore_plan(files: dict[str, Path | None], found: set[str]) -> list[dict]:
    """What a restore of the controller would write: each file of the snapshot (`found`) and where the inventory
    names it, whether one is there now; a file the inventory names no place for is left out (said so)."""
    plan = []
    for name in contract.CONTROLLER_FILES:
        if name not in found:
            continue
        where = files.get(name)
        plan.append({"file": name, "path": str(where) if where else None, "exists": bool(where and where.exists()),
                     "mode": f"{PUBLIC_FILES.get(name, 0o600):04o}"})
    return plan


def snapshot_files(r: Restic, snapshot: dict) -> set[str]:
    """The CONTROLLER_FILES names a controller snapshot holds (`restic ls`: its paths, the staging dir its root)."""
    done = r.run("ls", "--json", str(snapshot["id"]), timeout_s=300)
    if done.returncode != 0:
        raise r.problem(done, "ls")
    names = set()
    for line in _text(done.stdout).splitlines():
        try:
            node = json.loads(line)
        except ValueError:
            continue
        if isinstance(node, dict) and node.get("type") == "file":
            names.add(str(node.get("path", "")).lstrip("/"))
    return names & set(contract.CONTROLLER_FILES)


def restore_controller(repository: str, password: str, files: dict[str, Path | None], wanted: str = "latest",
                       yes: bool = False, target: Target | None = None,
                       runner: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> tuple[dict, list[dict]]:
    """The controller's files from a snapshot: (the snapshot, each file's row of `restore_plan`). With `yes`, each
    written whole where the inventory names it (restored into the private directory, then a rename; 0600 but for the
    certificates and the lock, 0644); without, nothing is written. Refused in one line before anything is written:
    a wrong password or another fleet's repository, a snapshot that does not exist or another fleet's."""
    with restic_for(repository, password, contract.CONTROLLER, target, runner) as r:
        open_repository(r, create=False)
        snapshot = pick_snapshot(snapshots(r), wanted, contract.CONTROLLER, fleet_tag(password))
        plan = restore_plan(files, snapshot_files(r, snapshot))
        if not yes:
            return snapshot, plan
        wanted_files = [row["file"] for row in plan if row["path"] is not None]
        if wanted_files:  # one `restic restore` into the private directory: every file read before any is written
            into = r.private / "restored"
            done = r.run("restore", str(snapshot["id"]), "--target", str(into),
                         *(a for name in wanted_files for a in ("--include", f"/{name}")))
            if done.returncode != 0:
                raise r.problem(done, "restore")
            try:
                contents = {name: (into / name).read_bytes() for name in wanted_files}
            except OSError as exc:
                raise BackupError(f"restic restore of {snapshot.get('short_id')} left out {exc.filename}: "
                                  "nothing was written", FAILED) from None
            for row in plan:
                if row["file"] in contents:
                    write_private(Path(row["path"]), contents[row["file"]], PUBLIC_FILES.get(row["file"], 0o600))
                    row["written"] = True
        return snapshot, plan


# --- the inventory's view ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Office:
    """What the backups need of an inventory: the password's file, the target, the retention, the data hosts and
    where the controller's files are."""

    password_file: Path | None
    target: Target | None
    repository: str | None  # the office's own backup_repository
    keep: tuple[int, int, int]
    interval_s: int
    sources: tuple[tuple[str, str], ...]  # (source, host) of each data host
    chat_ui: tuple[str, ...]  # the group chat_ui's hosts
    files: dict[str, Path | None]  # CONTROLLER_FILES name -> where the inventory names it

    @property
    def configured(self) -> bool:
        return self.target is not None or bool(self.repository)

    def repository_for(self, source: str) -> str:
        return repository_of(source, None if self.repository else self.target, self.repository)

    def reach(self) -> Target | None:
        """The target for sftp.command: the backup host's; none for an office's own repository."""
        return None if self.repository else self.target

    def password(self) -> str:
        if self.password_file is None:
            raise BackupError("the inventory sets no controller_backup_password_file: `sparkfleet init --force` "
                              "adds one (or set it to the 0600 file holding the office's backup password)")
        return read_password(self.password_file)


def office_from(hosts: list[tuple[str, dict]], settings: dict, secrets: Path | None, lock: Path) -> Office:
    """The Office of an inventory's hosts [(name, merged data)] and their Settings; `secrets`: the file the
    inventory names (SPARKFLEET_SECRETS), `lock`: the release lock's path. Pure: tested without an inventory."""
    from sparkfleet.contract.monitoring import FRONT_DOOR_GROUP
    from sparkfleet.contract.paths import CHAT_UI_GROUP
    from sparkfleet.contract.reach import ssh_address, ssh_port
    from sparkfleet.contract.settings import GROUPS_KEY
    from sparkfleet.roles.backup import sources as data_sources
    from sparkfleet.roles.pki import generations_path

    def in_group(group: str) -> list[str]:
        return [name for name, data in hosts if group in data.get(GROUPS_KEY, ())]

    targets = in_group(contract.GROUP)
    if len(targets) > 1:
        raise BackupError(f"the group {contract.GROUP} has {len(targets)} hosts ({', '.join(targets)}): name one")
    data = dict(hosts)
    target = None
    if targets:
        name = targets[0]
        target = Target(name, ssh_address(name, data[name]), ssh_port(name, data[name]),
                        data[name].get("ssh_known_hosts_file"))

    def first(key: str):
        return next((getattr(s, key) for s in settings.values() if getattr(s, key, None)), None)

    # each data host's source as its unit backs it up (roles/backup.py: the one rule; a door that is the chat UI's
    # host too is refused there, only where the inventory has backups: as the deploy refuses it)
    sources = []
    if target or first("backup_repository"):
        chat_ui = next(iter(in_group(CHAT_UI_GROUP)), None)
        sources = [(source, host) for host, source in data_sources(chat_ui, in_group(FRONT_DOOR_GROUP)).items()]
    base = settings[targets[0]] if targets else next(iter(settings.values()), None)
    keep = (base.backup_keep_hourly, base.backup_keep_daily, base.backup_keep_weekly) if base else (24, 7, 4)
    ca_key = first("fleet_ca_key")
    paths = {"secrets.json": secrets, "front-door.crt": first("front_door_tls_cert"),
             "front-door.key": first("front_door_tls_key"), "fleet-ca.crt": first("fleet_ca_cert"),
             "fleet-ca.key": ca_key, "fleet-ca.generations.json": generations_path(ca_key) if ca_key else None,
             "sparkfleet.lock": lock}
    password_file = first("controller_backup_password_file")
    return Office(Path(password_file).expanduser() if password_file else None, target, first("backup_repository"),
                  keep, base.backup_interval_s if base else 3600, tuple(sources), tuple(in_group(CHAT_UI_GROUP)),
                  {k: Path(v).expanduser() if v else None for k, v in paths.items()})


def office_of(inventory: str) -> Office:
    """The inventory's Office: its hosts loaded (a secrets file it names read as the inventory reads it), their
    settings, the secrets file it names, the lock's path (after the load: an inventory may set SPARKFLEET_LOCK)."""
    from sparkfleet.contract.settings import parse_settings
    from sparkfleet.controller.inventory import load_hosts, lock_path
    from sparkfleet.fleet.users import SecretsError, secrets_path_of

    hosts = load_hosts(inventory)
    settings = {name: parse_settings(name, data) for name, data in hosts}
    try:
        secrets = secrets_path_of(inventory)
    except SecretsError:  # an inventory with its keys inline (the sim's): no secrets file to keep
        secrets = None
    return office_from(hosts, settings, secrets, lock_path())


def back_up_controller(office: Office) -> Result:
    """The controller's state to its repository, one run at a time, its record beside the password file."""
    password = office.password()
    assert office.password_file is not None
    with _one_at_a_time(office.password_file):
        return backup_controller(office.repository_for(contract.CONTROLLER), password, office.files, office.keep,
                                 office.reach(), controller_record(office.password_file))


def after_change(inventory: str, log: Callable[[str], None]) -> Result | None:
    """The controller's state backed up after a command changed it (users, init, update), where the inventory has a
    backup target and a password: best effort, one line on failure; the change itself stands. None: not set up."""
    try:
        office = office_of(inventory)
    except Refusal:  # an inventory that does not load: its next command says why; no target is known
        return None
    if not office.configured or office.password_file is None or not office.password_file.exists():
        return None
    try:
        result = back_up_controller(office)
    except Refusal as exc:
        log(f"the controller's state was not backed up: {exc} (the change itself is saved; "
            f"`sparkfleet backup {inventory}` tries again)")
        return None
    if not result.ok:
        log(f"the controller's state was not backed up: {result.error} (the change itself is saved; "
            f"`sparkfleet backup {inventory}` tries again)")
    return result


# --- the data hosts -------------------------------------------------------------------------------------------------


def trigger_command() -> str:
    """Run on a data host: its unit started (systemctl waits for the oneshot to end), then its record printed. The
    host's time before the start comes first, so a record older than this run is told apart."""
    return (f"started=$(date +%s); systemctl start {shlex.quote(contract.UNIT)} >/dev/null 2>&1; "
            f"echo \"$started $?\"; cat {shlex.quote(contract.RECORD)} 2>/dev/null || true")


def record_command() -> str:
    return f"cat {shlex.quote(contract.RECORD)} 2>/dev/null || true"


def parse_record(text: str | None) -> dict | None:
    """A host's record as it printed it (untrusted: a JSON object or nothing)."""
    try:
        found = json.loads(text or "")
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def triggered(source: str, host: str, output: str | None) -> Result:
    """A data host's result from what `trigger_command` printed (None: it did not answer over SSH)."""
    result = Result(source, host)
    if output is None:
        result.error = f"{host} did not answer over SSH: is it up? (sparkfleet status)"
        return result
    first, _, rest = output.partition("\n")
    started, _, code = first.strip().partition(" ")
    record = parse_record(rest)
    finished = record.get("finished") if record else None
    fresh = isinstance(finished, (int, float)) and started.isdigit() and finished >= int(started)
    if record is not None and fresh and record.get("source") != source:
        result.error = (f"{host} backs up {str(record.get('source'))[:60]!r}, not {source} (one source a host): "
                        "converge it with the inventory's groups")
        return result
    if record is None or not fresh:
        result.error = (f"{contract.UNIT} did not run on {host} (exit {code or '?'}): converge it with the backup "
                        "target in the inventory (its unit and keys), then `journalctl -u sparkfleet-backup`")
        return result
    result.ok = record.get("ok") is True and code == "0"
    result.snapshot = str(record["snapshot"]) if record.get("snapshot") else None
    added, seconds = record.get("bytes_added"), record.get("duration_s")
    result.bytes_added = added if isinstance(added, int) else None
    result.seconds = seconds if isinstance(seconds, (int, float)) else None
    if not result.ok:
        result.error = "".join(c for c in str(record.get("error") or f"its unit failed (exit {code})")
                               if c.isprintable())[:300]
    return result


def on_hosts(inventory: str, hosts: list[str], command: str, timeout_s: float) -> dict[str, str | None]:
    """`command` on each host, as pyinfra reaches it (the inventory's SSH settings, strict host keys, its sudo):
    its output, or None where it did not answer."""
    from sparkfleet.fleet.converge import connected
    from sparkfleet.host.run import as_the_host_runs

    out: dict[str, str | None] = {name: None for name in hosts}
    if not hosts:
        return out
    with connected(inventory, hosts) as (state, limit):
        for host in limit:
            if host in state.failed_hosts:
                continue
            _, output = as_the_host_runs(host, command, timeout=timeout_s)
            out[host.name] = output.stdout
    return out


def back_up_data_hosts(inventory: str, office: Office) -> list[Result]:
    """Each data host's unit started now and its record read back, one row a source."""
    hosts = list(dict.fromkeys(h for _, h in office.sources))
    outputs = on_hosts(inventory, hosts, trigger_command(), HOST_TIMEOUT_S)
    return [triggered(source, host, outputs.get(host)) for source, host in office.sources]


NO_TARGET = ("the inventory names no backup target: add a group `backup` (one host, off the chat UI's box) or set "
             "backup_repository (docs/backups.md)")


def back_up_all(inventory: str, office: Office) -> list[Result]:
    """`sparkfleet backup`: the controller's state, then every data host's."""
    if not office.configured:
        raise BackupError(NO_TARGET)
    return [back_up_controller(office), *back_up_data_hosts(inventory, office)]


def list_snapshots(office: Office) -> dict[str, list[dict]]:
    """Each source's snapshots (this office's), oldest first, asked of its repository from the controller."""
    if not office.configured:
        raise BackupError(NO_TARGET)
    password = office.password()
    found = {}
    for source in [contract.CONTROLLER, *(s for s, _ in office.sources)]:
        with restic_for(office.repository_for(source), password, source, office.reach()) as r:
            found[source] = [s for s in snapshots(r) if fleet_tag(password) in (s.get("tags") or [])]
    return found


# --- the chat UI's restore ----------------------------------------------------------------------------------------


def chat_ui_host(chat_ui: tuple[str, ...], host: str | None) -> str:
    """The host a chat UI restore goes to: the inventory's chat UI host; `host`, where given, must be it."""
    if not chat_ui:
        raise BackupError("the inventory has no chat UI (group chat_ui): nothing to restore it on")
    if host is not None and host not in chat_ui:
        raise BackupError(f"{host} is not in the group chat_ui ({', '.join(chat_ui)}): move the chat UI to it in the "
                          "inventory and converge, then restore")
    return host or chat_ui[0]


def restore_chat_ui_command(snapshot: str, dry_run: bool) -> str:
    """The host helper's restore (files/sparkfleet_host/backup.py), which prints one JSON line."""
    return shlex.join(["python3", HOST_MODULE, "backup", "restore-chat-ui", "--snapshot", snapshot,
                       *(["--dry-run"] if dry_run else [])])


def parse_restore(output: str | None, host: str) -> dict:
    """The helper's JSON line (its last line that parses), or a failure that says what was missing."""
    if output is None:
        return {"ok": False, "error": f"{host} did not answer over SSH"}
    for line in reversed(output.splitlines()):
        found = parse_record(line)
        if found is not None:
            return found
    return {"ok": False, "error": f"{host} printed no result: converge it (its backup helper), then try again"}


def check_chat_ui_snapshot(office: Office, wanted: str) -> dict:
    """The chat UI's snapshot checked from the controller before its host is touched: the repository opens with
    this office's password, the snapshot exists and this fleet wrote it."""
    password = office.password()
    with restic_for(office.repository_for(contract.CHAT_UI), password, contract.CHAT_UI, office.reach()) as r:
        open_repository(r, create=False)
        return pick_snapshot(snapshots(r), wanted, contract.CHAT_UI, fleet_tag(password))


def restore_chat_ui(inventory: str, host: str, snapshot_id: str, dry_run: bool) -> dict:
    """The chat UI's data put back on `host` by its helper (dry run: what it would replace)."""
    output = on_hosts(inventory, [host], restore_chat_ui_command(snapshot_id, dry_run), HOST_TIMEOUT_S)[host]
    return parse_restore(output, host)


# --- status ---------------------------------------------------------------------------------------------------------


def age_words(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h ago"
    return f"{seconds / 86400:.1f} days ago"


def backup_state(source: str, host: str, record: dict | None, interval_s: int, now: float) -> dict:
    """A source's last backup for `status`: ok (its last run made a snapshot and the last good one is younger than
    STALE_FACTOR intervals), failed, overdue or none yet; its age and why."""
    row: dict[str, Any] = {"source": source, "host": host, "state": "none", "last_success": None, "age_s": None,
                           "snapshot": None, "error": None}
    if not record:
        row["error"] = "no backup record yet: the timer has not run (converge the host), or `sparkfleet backup`"
        return row
    last = record.get("last_success")
    if isinstance(last, (int, float)):
        row["last_success"], row["age_s"] = int(last), max(0.0, now - last)
    row["snapshot"] = str(record["snapshot"]) if record.get("snapshot") else None
    if record.get("ok") is not True:
        row["state"] = "failed"
        row["error"] = "".join(c for c in str(record.get("error") or "its last run failed") if c.isprintable())[:200]
    elif row["age_s"] is None or row["age_s"] > contract.STALE_FACTOR * interval_s:
        row["state"] = "overdue"
        row["error"] = f"its last good backup is older than {contract.STALE_FACTOR} x {interval_s} s"
    else:
        row["state"] = "ok"
    return row


def backup_status(inventory: str, now: float | None = None) -> list[dict] | None:
    """Each source's last backup for `status` (None: the inventory has no backup target): the data hosts' records
    over SSH, the controller's from beside its password file. The controller's state changes only with a command,
    so its age is judged against no interval: only its last run's verdict."""
    office = office_of(inventory)
    if not office.configured:
        return None
    now = time.time() if now is None else now
    rows = []
    if office.password_file is not None:
        record = read_record(controller_record(office.password_file))
        row = backup_state(contract.CONTROLLER, CONTROLLER_HOST, record, 10**9, now)
        rows.append(row)
    hosts = list(dict.fromkeys(h for _, h in office.sources))
    outputs = on_hosts(inventory, hosts, record_command(), 60)
    for source, host in office.sources:
        if outputs.get(host) is None:
            rows.append({"source": source, "host": host, "state": "unknown", "last_success": None, "age_s": None,
                         "snapshot": None, "error": f"{host} did not answer over SSH"})
        else:
            rows.append(backup_state(source, host, parse_record(outputs[host]), office.interval_s, now))
    return rows
