"""Backups (contract/backup.py, docs/backups.md): each data host's timer and the backup target's jailed SFTP user.

A data host (the chat UI's host: source `chat-ui`; each front door: `usage-<door>`) gets restic, its own source's
repository password and SSH key (derived from the office's one backup password on the controller: it holds no other
source's), the target's host key as the controller pinned it (written for the address the data host dials), an env
file naming the repository and the paths, and `sparkfleet-backup.timer` running the oneshot unit that runs
`sparkfleet_host backup run` (files/sparkfleet_host/backup.py) at idle CPU and I/O priority: colleagues' chats come
first. The host of the group `backup` gets a system user reached over SFTP only (sshd's Match block: a chroot, no
shell, no forwarding), one directory a source, and the sources' public keys, each `restrict`ed.

Everything here is planned without a host: the controller's side (which sources an inventory has, the password
file, the pinned host key) is controller/backup_plan.py's.
"""

from __future__ import annotations

import base64
import re
import shlex
from dataclasses import dataclass

from sparkfleet.contract import backup as b
from sparkfleet.contract import paths
from sparkfleet.contract.settings import Settings, SettingsError
from sparkfleet.release import render
from sparkfleet.roles import chat_ui
from sparkfleet.roles.desired import Absent, Command, DesiredState, Directory, File, Packages, Unit, UnitRemoved, \
    desired, secret

PACKAGE = "restic"
SSH_PORT = 22
# an address a data host dials the target at: a name or an IP (restic splits sftp.command on blanks itself)
ADDRESS = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")
KEY_TYPE = re.compile(r"(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)|sk-[a-z0-9@.-]+)")
KEY_DATA = re.compile(r"[A-Za-z0-9+/]+={0,3}")
ONE_HOUR_S = 3600


def source_name(source: str) -> str:
    """A source's name, refused in one line unless it is one contract/backup.py's SOURCE allows (a door's name
    becomes part of a path, a restic host name and a label)."""
    if not b.SOURCE.fullmatch(source):
        raise SettingsError([f"backup source {source[:60]!r}: a door's name makes it, and it holds a character a "
                             "source may not (letters, digits, `_`, `.`, `-`): rename the host in the inventory"])
    return source


def sources(chat_ui_host: str | None, doors: list[str]) -> dict[str, str]:
    """{host: its source}: the chat UI's host backs up `chat-ui`, each front door `usage-<door>`. A host that is
    both has two sources, which one unit does not run yet: refused in one line."""
    found: dict[str, str] = {}
    if chat_ui_host:
        found[chat_ui_host] = b.CHAT_UI
    for door in doors:
        if door in found:
            raise SettingsError([f"{door}: the chat UI's host is a front door too: its backup runs one source; "
                                 "put the chat UI on a Spark that is not a door, or the door elsewhere"])
        found[door] = source_name(b.usage_source(door))
    return found


def known_hosts_line(found: str, dial: str) -> str:
    """The target's key line for the data hosts: `ssh-keygen -F NAME -f KNOWN_HOSTS`'s output (hashed or not) for
    the name the controller dials, rewritten for `dial` (the address, `[address]:port` off port 22, the data host
    dials). Only well-formed key lines are kept (a marker line, @revoked or @cert-authority, is not a host key);
    ValueError when none is left."""
    lines = []
    for line in found.splitlines():
        fields = line.split()
        if len(fields) < 3 or line.startswith(("#", "@")):
            continue
        kind, key = fields[1], fields[2]
        if KEY_TYPE.fullmatch(kind) and KEY_DATA.fullmatch(key):
            lines.append(f"{dial} {kind} {key}\n")
    if not lines:
        raise ValueError("no host key")
    return "".join(dict.fromkeys(lines))


def dial_name(address: str, port: int) -> str:
    """How ssh names a host in known_hosts: `address`, or `[address]:port` off port 22."""
    return address if port == SSH_PORT else f"[{address}]:{port}"


def sftp_command(address: str, port: int) -> str:
    """restic's `sftp.command` to the target's SFTP user: the source's key, the pinned host key only, no agent, no
    prompt. Files, never a secret; restic splits it on blanks (an address with one is refused before)."""
    if not ADDRESS.fullmatch(address):
        raise SettingsError([f"backup target address {address[:60]!r} is not a host name or an IP address: fix "
                             "its `lan_address`"])
    options = " ".join(f"-o {o}" for o in (f"UserKnownHostsFile={b.KNOWN_HOSTS}", "StrictHostKeyChecking=yes",
                                            "BatchMode=yes", "IdentitiesOnly=yes", "ConnectTimeout=10",
                                            "ServerAliveInterval=30"))
    return f"ssh -i {b.SSH_KEY} -p {int(port)} {options} {b.TARGET_USER}@{address} -s sftp"


@dataclass(frozen=True)
class Target:
    """Where a source's repository lives: the backup host (its address and SSH port as the data hosts dial it, its
    host key line for them), or an office's own repository (`base`: the setting backup_repository)."""

    address: str | None = None
    port: int = SSH_PORT
    known_hosts: str | None = None
    base: str | None = None

    def repository(self, source: str) -> str:
        if self.base:
            return b.named_repository(self.base, source)
        assert self.address is not None
        return b.sftp_repository(self.address, source)


@dataclass(frozen=True)
class Source:
    """One data host's backup: its source, its target, its secrets (derived from the office's password, never
    shown), the settings it runs by."""

    source: str
    target: Target
    settings: Settings
    password: str = ""  # the office's backup password (controller_backup_password_file's content)

    def __repr__(self) -> str:  # the password never in a repr, a traceback or a log
        return f"Source({self.source!r}, {self.target!r})"


def private_key(password: str, source: str) -> str:
    """The source's private key as contract/backup.py derives it, in OpenSSH's format with its two check words
    derived too (OpenSSH writes random ones): the same bytes at every converge, so a converge changes nothing."""
    pem = b.ssh_key(password, source)[0]
    lines = pem.strip().splitlines()
    blob = bytearray(base64.b64decode("".join(lines[1:-1])))
    at = len(b"openssh-key-v1\0")
    for _ in range(3):  # the cipher's, the KDF's names and the KDF's options: each a length and its bytes
        at += 4 + int.from_bytes(blob[at:at + 4], "big")
    at += 4  # the number of keys (1)
    at += 4 + int.from_bytes(blob[at:at + 4], "big")  # the public key
    at += 4  # the private section's length; then its two check words, which must be equal
    blob[at:at + 8] = b.derived(password, f"ssh check {source}")[:4] * 2
    body = base64.b64encode(bytes(blob)).decode()
    return "\n".join([lines[0], *(body[i:i + 70] for i in range(0, len(body), 70)), lines[-1]]) + "\n"


def data_of(source: str) -> str:
    return paths.CHAT_UI_DATA if source == b.CHAT_UI else paths.FRONT_DOOR_USAGE_SNAPSHOT


def env_file(src: Source) -> str:
    """The source's env file (ENV, 0600): what `sparkfleet_host backup` reads; every value one shell word. It holds
    the names of the password's and the key's files, never their content."""
    s = src.settings
    values = {
        "RESTIC_REPOSITORY": src.target.repository(src.source),
        "RESTIC_PASSWORD_FILE": b.PASSWORD_FILE,
        "SPARKFLEET_BACKUP_SOURCE": src.source,
        "SPARKFLEET_BACKUP_FLEET": b.fleet_id(src.password),
        "SPARKFLEET_BACKUP_STATE": b.STATE,
        "SPARKFLEET_BACKUP_STAGING": b.staging_dir(src.source),
        "SPARKFLEET_BACKUP_RECORD": b.RECORD,
        "SPARKFLEET_BACKUP_TEXTFILE": b.TEXTFILE,
        "SPARKFLEET_BACKUP_DATA": data_of(src.source),
        "SPARKFLEET_BACKUP_INTERVAL_S": str(s.backup_interval_s),
        "SPARKFLEET_BACKUP_KEEP_HOURLY": str(s.backup_keep_hourly),
        "SPARKFLEET_BACKUP_KEEP_DAILY": str(s.backup_keep_daily),
        "SPARKFLEET_BACKUP_KEEP_WEEKLY": str(s.backup_keep_weekly),
    }
    if not src.target.base:
        values["SPARKFLEET_BACKUP_SFTP_COMMAND"] = sftp_command(src.target.address or "", src.target.port)
    if src.source == b.CHAT_UI:
        values |= {
            "SPARKFLEET_BACKUP_DATABASES": ",".join(b.CHAT_UI_DATABASES),
            "SPARKFLEET_BACKUP_EXCLUDED": ",".join(b.CHAT_UI_EXCLUDED),
            "SPARKFLEET_CHAT_UI_UNIT": paths.CHAT_UI_UNIT_NAME,
            "SPARKFLEET_CHAT_UI_CONTAINER": paths.CHAT_UI_CONTAINER,
            "SPARKFLEET_CHAT_UI_SOCKET": paths.CHAT_UI_SOCKET,
            "SPARKFLEET_CHAT_UI_HEALTH": chat_ui.HEALTH,
            "SPARKFLEET_CHAT_UI_IMAGE_RECORD": chat_ui.IMAGE_RECORD,
            "SPARKFLEET_CHAT_UI_START_WAIT_S": str(chat_ui.START_WAIT_S),
        }
    head = "# Managed by sparkfleet: this host's backup (0600; the password and the key are in files of their own)\n"
    return head + "".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items())


def unit(src: Source) -> str:
    return render._templates.get_template("sparkfleet-backup.service.j2").render(
        source=src.source, host_module=paths.HOST_MODULE, q=shlex.quote)


def timer(src: Source) -> str:
    interval = src.settings.backup_interval_s
    return render._templates.get_template("sparkfleet-backup.timer.j2").render(
        source=src.source, interval_s=interval, delay_s=min(300, interval // 10))


def backup_source_state(src: Source) -> DesiredState:
    """What a data host holds for its source's backups: restic, its root-only directory with the source's password
    and key (0600) and the target's host key, the env file, its state directory, the unit and its timer enabled.
    Nothing runs at a converge: the timer (or `sparkfleet backup`) starts the unit."""
    steps: list = [
        Packages("restic installed (the backups' tool)", (PACKAGE,)),
        Directory(b.CONFIG, "Backup directory (root-only: the source's password and key)", mode="0700"),
        secret(b.PASSWORD_FILE, f"Backup password of {src.source} (root-only)",
               b.repository_password(src.password, src.source) + "\n"),
    ]
    if src.target.base:  # an office's own repository: its credentials are the office's, no key of ours
        steps += [Absent(path, f"{path} absent (the repository is the office's own)")
                  for path in (b.SSH_KEY, b.KNOWN_HOSTS)]
    else:
        steps += [secret(b.SSH_KEY, f"Backup SSH key of {src.source} (root-only)",
                         private_key(src.password, src.source)),
                  File(b.KNOWN_HOSTS, "The backup target's host key (as the controller pinned it)",
                       content=src.target.known_hosts or "")]
    steps += [
        secret(b.ENV, f"Backup settings of {src.source} (root-only)", env_file(src)),
        Directory(b.STATE, "Backup state (root-only: the staged copy, the last run's record)", mode="0700"),
        File(b.UNIT_PATH, f"Backup unit ({src.source})", content=unit(src)),
        File(b.TIMER_PATH, f"Backup timer (every {src.settings.backup_interval_s} s)", content=timer(src)),
        # the unit is oneshot, started by its timer: never by a converge (a restart would be a backup)
        Unit(b.UNIT, "Backup unit known to systemd (started by its timer)", running=None, enabled=None,
             daemon_reload_on=(b.UNIT_PATH, b.TIMER_PATH)),
        Unit(b.TIMER, "Backup timer enabled and running", restart_on=(b.TIMER_PATH,)),
    ]
    return desired(steps)


def no_backup_state() -> DesiredState:
    """A host that is no (longer a) backup source: its timer and unit stopped and removed, its password, key and
    settings removed. Its data stays, and so do its snapshots in the repository."""
    why = "this host backs up no source"
    return desired(UnitRemoved(b.TIMER, b.TIMER_PATH, why), UnitRemoved(b.UNIT, b.UNIT_PATH, why),
                   [Absent(path, f"{path} removed ({why})") for path in
                    (b.PASSWORD_FILE, b.SSH_KEY, b.ENV, b.KNOWN_HOSTS, b.TEXTFILE)])


SSHD_RELOAD = "sshd -t && (systemctl reload ssh.service || systemctl reload sshd.service)"


def sshd_config() -> str:
    """sshd's drop-in for the target's user: SFTP only, in its chroot, with its own authorized_keys; the closing
    `Match all` ends the block inside this file (Debian includes the drop-ins at the top of sshd_config)."""
    return (f"# Managed by sparkfleet: the backup target's SFTP-only user (contract/backup.py)\n"
            f"Match User {b.TARGET_USER}\n"
            f"    ChrootDirectory {b.TARGET_DIR}\n"
            f"    ForceCommand internal-sftp\n"
            f"    AuthorizedKeysFile {b.TARGET_AUTHORIZED_KEYS}\n"
            f"    PasswordAuthentication no\n"
            f"    KbdInteractiveAuthentication no\n"
            f"    AllowTcpForwarding no\n"
            f"    AllowStreamLocalForwarding no\n"
            f"    AllowAgentForwarding no\n"
            f"    X11Forwarding no\n"
            f"    PermitTunnel no\n"
            f"    PermitTTY no\n"
            f"Match all\n")


def authorized_keys(public_keys: dict[str, str]) -> str:
    """{source: its public line} as the target's authorized_keys: each key `restrict`ed (no forwarding, no pty)."""
    lines = "".join(f"restrict {public_keys[s]}\n" for s in sorted(public_keys))
    return "# Managed by sparkfleet: the backup sources' keys (SFTP only, sshd's Match block)\n" + lines


def backup_target_state(public_keys: dict[str, str]) -> DesiredState:
    """What the backup host holds (its system user made first, by the stage): the chroot (root 0755, as sshd
    wants it), the repositories' directory (the user's, 0700), the sources' keys (root 0644), sshd's drop-in
    checked with `sshd -t` and sshd reloaded only when it or the keys' file changed."""
    return desired(
        Directory(b.TARGET_DIR, "Backup target's jail (root, as sshd's chroot wants it)", mode="0755",
                  owner=("root", "root")),
        Directory(b.TARGET_REPOS, "Backup repositories (the SFTP user's only)", mode="0700",
                  owner=(b.TARGET_USER, b.TARGET_USER)),
        Directory(b.CONFIG, "Backup directory", mode="0755"),
        File(b.TARGET_AUTHORIZED_KEYS, "The backup sources' keys", content=authorized_keys(public_keys),
             mode="0644", owner=("root", "root")),
        File(b.TARGET_SSHD_CONFIG, "sshd: the backup user's SFTP-only jail", content=sshd_config(), mode="0644"),
        Command("sshd's config checked (sshd -t), then sshd reloaded", SSHD_RELOAD, when=(b.TARGET_SSHD_CONFIG,)),
    )


def no_target_state() -> DesiredState:
    """A host that is no longer the backup target: sshd's drop-in and the keys removed (no source reaches it
    again), sshd reloaded; the repositories stay (an office's history: moved or removed by hand)."""
    return desired(Absent(b.TARGET_SSHD_CONFIG, f"{b.TARGET_SSHD_CONFIG} removed (this host is no backup target)"),
                   Absent(b.TARGET_AUTHORIZED_KEYS, f"{b.TARGET_AUTHORIZED_KEYS} removed"),
                   Command("sshd reloaded without the backup user's block", SSHD_RELOAD.replace("sshd -t && ", ""),
                           when=(b.TARGET_SSHD_CONFIG,)))
