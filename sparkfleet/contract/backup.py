"""Backups: what the data hosts, the backup target and the controller agree on (one owner: docs/backups.md).

An office's data lives in three kinds of places, each a *source* backed up to its own restic repository:
- `chat-ui`: the chat UI's data on the host of the group chat_ui (its SQLite databases copied through SQLite's
  online backup, uploads, the vector store; Open WebUI's `cache/` left out: re-downloaded on demand);
- `usage-<door>`: a front door's usage snapshot;
- `controller`: the controller's state (the secrets file, the fleet CA, the door's certificate and key, the lock).

The repositories live on the backup target: the host of the group `backup` (an SFTP-only user there, one directory
a source) or the repository an office names (`backup_repository`). Everything is derived from one password, made by
`sparkfleet init` and shown once: each source's repository password and each source's SSH key (HMAC), so a data host
holds only its own source's secrets, and a new controller with the password and the inventory from git derives them
all again (a converge after a restore changes nothing).

A snapshot's restic host name is its source, never the machine's: the chat UI's series goes on when it moves to
another Spark, and retention (`forget`, grouped by host and paths) prunes one series a source.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re

from sparkfleet.contract import paths
from sparkfleet.contract.monitoring import TEXTFILE_DIR

GROUP = "backup"  # the inventory group of the backup target host (at most one)

# --- on the backup target host --------------------------------------------------------------------------------
TARGET_USER = "sparkfleet-backup"  # a system user reached over SFTP only, jailed (sshd's Match block below)
TARGET_DIR = "/srv/sparkfleet-backup"  # its ChrootDirectory: root-owned 0755, as sshd requires
TARGET_REPOS_IN_CHROOT = "/repos"  # the user's own directory (0700) in the jail: one repository a source
TARGET_REPOS = f"{TARGET_DIR}{TARGET_REPOS_IN_CHROOT}"
TARGET_AUTHORIZED_KEYS = f"{paths.CONFIG_DIR}/backup/authorized_keys"  # root-owned 0644: the sources' keys
# sshd's drop-in: Match User TARGET_USER -> ChrootDirectory, ForceCommand internal-sftp, AuthorizedKeysFile above,
# no forwarding; checked with `sshd -t` before sshd reloads
TARGET_SSHD_CONFIG = "/etc/ssh/sshd_config.d/sparkfleet-backup.conf"

# --- on a data host (the chat UI's, a door) ---------------------------------------------------------------------
CONFIG = f"{paths.CONFIG_DIR}/backup"  # 0700 root: the source's password, SSH key, the target's host key
PASSWORD_FILE = f"{CONFIG}/password"  # 0600: restic's --password-file (RESTIC_PASSWORD_FILE), never a command line
SSH_KEY = f"{CONFIG}/id_ed25519"  # 0600: the source's key for the target's SFTP user
KNOWN_HOSTS = f"{CONFIG}/known_hosts"  # 0644: the target's host key, from the controller's pinned known_hosts
ENV = f"{CONFIG}/restic.env"  # 0600: RESTIC_REPOSITORY, RESTIC_PASSWORD_FILE and the settings, read by the unit
STATE = f"{paths.STATE_DIR}/backup"  # 0700 root
STAGING = f"{STATE}/staging"  # the consistent copy restic reads (SQLite's online backup, never a `cp` of a live db)
RECORD = f"{STATE}/last.json"  # the last run: {"source", "ok", "finished", "last_success", "snapshot", "error"}
UNIT = "sparkfleet-backup.service"  # oneshot: one run at a time (restic 0.14 has no --retry-lock)
TIMER = "sparkfleet-backup.timer"
UNIT_PATH, TIMER_PATH = paths.unit_path(UNIT), paths.unit_path(TIMER)
TEXTFILE = f"{TEXTFILE_DIR}/backup.prom"  # the node exporter's textfile collector reads it

# --- metrics (textfile) and the alert's meaning ---------------------------------------------------------------
METRIC_LAST_SUCCESS = "sparkfleet_backup_last_success_timestamp_seconds"  # {source}: unix time of the last good one
METRIC_INTERVAL = "sparkfleet_backup_interval_seconds"  # {source}: the timer's interval
METRIC_LAST_RUN_OK = "sparkfleet_backup_last_run_ok"  # {source}: 1 when the last run made a snapshot, else 0
STALE_FACTOR = 2  # a source is overdue when its last good backup is older than twice its interval
METRICS = (METRIC_LAST_SUCCESS, METRIC_INTERVAL, METRIC_LAST_RUN_OK)  # what the alert rules may read

# --- sources ----------------------------------------------------------------------------------------------------
CHAT_UI = "chat-ui"
CONTROLLER = "controller"
USAGE_PREFIX = "usage-"
SOURCE = re.compile(r"chat-ui|controller|usage-[A-Za-z0-9][A-Za-z0-9_.-]*")
# Open WebUI's data: its SQLite databases (copied through the online backup API), the rest as files; `cache/` left
CHAT_UI_DATABASES = ("webui.db", "vector_db/chroma.sqlite3")
CHAT_UI_EXCLUDED = ("cache",)
# the controller's files in a snapshot, by the names a restore puts back where the inventory names them
CONTROLLER_FILES = ("secrets.json", "front-door.crt", "front-door.key", "fleet-ca.crt", "fleet-ca.key",
                    "fleet-ca.generations.json", "sparkfleet.lock")
TAG = "sparkfleet"  # every snapshot's tag


def usage_source(door: str) -> str:
    return f"{USAGE_PREFIX}{door}"


def staging_dir(source: str) -> str:
    """Where a source's consistent copy is made and what restic reads: the snapshot's one path."""
    return f"{STAGING}/{source}"


def repository_dir(source: str) -> str:
    """A source's repository as the jailed SFTP user sees it (on the host: TARGET_REPOS/<source>)."""
    return f"{TARGET_REPOS_IN_CHROOT}/{source}"


def sftp_repository(address: str, source: str) -> str:
    """restic's repository string for a source on the backup host; the port and keys come from `sftp.command`."""
    host = f"[{address}]" if ":" in address else address
    return f"sftp:{TARGET_USER}@{host}:{repository_dir(source)}"


def named_repository(base: str, source: str) -> str:
    """A source's repository under an office's own `backup_repository` (sftp:, rest: or s3:): a subdirectory."""
    return f"{base.rstrip('/')}/{source}"


# --- everything derived from the one password -----------------------------------------------------------------


def derived(password: str, purpose: str) -> bytes:
    """32 bytes of HMAC-SHA256 of the office's backup password: nothing new to keep."""
    return hmac.new(password.encode(), f"sparkfleet backup {purpose}".encode(), hashlib.sha256).digest()


def repository_password(password: str, source: str) -> str:
    """A source's repository password (a data host holds its own source's only)."""
    return base64.urlsafe_b64encode(derived(password, f"repository {source}")).decode().rstrip("=")


def ssh_key(password: str, source: str) -> tuple[str, str]:
    """A source's Ed25519 key for the target's SFTP user: (the private key in OpenSSH's format, the public line)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.from_private_bytes(derived(password, f"ssh {source}"))
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return private, f"{public} {TARGET_USER}-{source}"


def fleet_id(password: str) -> str:
    """This office's mark on its snapshots (tag `fleet=<id>`): a repository another fleet wrote is told apart."""
    return derived(password, "fleet").hex()[:12]


def new_password() -> str:
    """A fresh backup password: 24 random bytes, base64 (32 characters to write down)."""
    import secrets

    return base64.urlsafe_b64encode(secrets.token_bytes(24)).decode()
