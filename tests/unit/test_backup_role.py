"""The backups' desired state and the inventory's backup plan (roles/backup.py, controller/backup_plan.py): what a
data host and the target hold, and every refusal, without a host."""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparkfleet.contract import backup as b
from sparkfleet.contract import paths, shared  # noqa: F401  (shared registers the host package)
from sparkfleet.contract.settings import GROUPS_KEY, Settings, SettingsError, parse_settings
from sparkfleet.controller.backup_plan import BackupPlan, plan_backups
from sparkfleet.roles import backup as role
from sparkfleet.roles.desired import Absent, File, Unit, UnitRemoved
from tests.unit.helpers import host_data

host_backup = importlib.import_module("sparkfleet_host.backup")
PASSWORD = "office-backup-password-0123456789"
KEY = "AAAAC3NzaC1lZDI1NTE5AAAAIHlTq0x9b5b0e5mU8wB3Vq8jK2m1P0xq9bP0c2m1aZ3e"


def settings(**more) -> Settings:
    return parse_settings("h", host_data(**more))


def source(name: str = b.CHAT_UI, target: role.Target | None = None, **more) -> role.Source:
    target = target or role.Target(address="spark-3", port=22, known_hosts=f"spark-3 ssh-ed25519 {KEY}\n")
    return role.Source(name, target, settings(**more), PASSWORD)


def test_the_sources_of_an_inventory():
    """The chat UI's host backs up chat-ui, each door its usage; a door named with a character no source may hold,
    or a chat UI host that is a door too (one unit runs one source), is refused in one line."""
    assert role.sources("spark-1", ["door-1", "door-2"]) == {"spark-1": "chat-ui", "door-1": "usage-door-1",
                                                            "door-2": "usage-door-2"}
    assert role.sources(None, []) == {}
    for hostile in ("door;rm -rf /", "door 1", "$(id)", "-door"):
        with pytest.raises(SettingsError, match="rename the host"):
            role.sources(None, [hostile])
    with pytest.raises(SettingsError, match="the chat UI's host is a front door too"):
        role.sources("spark-1", ["spark-1"])


def test_the_target_key_is_rewritten_for_the_address_the_data_hosts_dial():
    """ssh-keygen -F's output (a hashed line, its comment, a marker line) becomes one plain line for the data
    hosts' name of the target; a line that is no key (an option smuggled in, a broken key) is never copied."""
    found = (f"# Host [127.0.0.1]:2203 found: line 4\n|1|abc=|def= ssh-ed25519 {KEY}\n"
             f"@revoked * ssh-rsa {KEY}\n[127.0.0.1]:2203 ssh-ed25519 {KEY} comment\n")
    assert role.known_hosts_line(found, "sparkfleet-spark-3") == f"sparkfleet-spark-3 ssh-ed25519 {KEY}\n"
    assert role.dial_name("10.0.0.3", 2222) == "[10.0.0.3]:2222"
    for junk in ("", "host command=\"sh\" ssh-ed25519\n", f"host ssh-ed25519 {KEY};id\n", "host bogus-type AAAA\n"):
        with pytest.raises(ValueError):
            role.known_hosts_line(junk, "spark-3")


def test_an_address_restic_would_split_is_refused():
    assert role.sftp_command("10.0.0.3", 22).endswith(f" {b.TARGET_USER}@10.0.0.3 -s sftp")
    for hostile in ("a b", "a;id", "$(id)", "-oProxyCommand=sh", ""):
        with pytest.raises(SettingsError, match="not a host name or an IP address"):
            role.sftp_command(hostile, 22)


def test_a_data_host_holds_its_own_source_secrets_in_files_only():
    """The password and the key are 0600 secrets (the password the source's derived one, never the office's); the
    env file names their files and is what the host program reads, every value one word; no unit or timer holds a
    secret; the unit is oneshot at idle priority and started by its timer only."""
    src = source()
    state = role.backup_source_state(src)
    files = state.files
    derived = b.repository_password(PASSWORD, b.CHAT_UI)
    assert files[b.PASSWORD_FILE].secret and files[b.PASSWORD_FILE].content == derived + "\n"
    assert files[b.SSH_KEY].secret and files[b.SSH_KEY].content == role.private_key(PASSWORD, b.CHAT_UI)
    assert files[b.ENV].secret and state.directories[b.CONFIG].mode == "0700"
    assert files[b.KNOWN_HOSTS].content == f"spark-3 ssh-ed25519 {KEY}\n"
    env = host_backup.parse_env(files[b.ENV].content)
    assert env["RESTIC_REPOSITORY"] == "sftp:sparkfleet-backup@spark-3:/repos/chat-ui"
    assert env["RESTIC_PASSWORD_FILE"] == b.PASSWORD_FILE and env["SPARKFLEET_BACKUP_DATA"] == paths.CHAT_UI_DATA
    assert env["SPARKFLEET_BACKUP_STAGING"] == b.staging_dir(b.CHAT_UI)
    assert env["SPARKFLEET_BACKUP_FLEET"] == b.fleet_id(PASSWORD)
    assert f"-i {b.SSH_KEY} " in env["SPARKFLEET_BACKUP_SFTP_COMMAND"]
    unit, timer = files[b.UNIT_PATH].content or "", files[b.TIMER_PATH].content or ""
    for text in (unit, timer, files[b.ENV].content or "", files[b.KNOWN_HOSTS].content or ""):
        assert PASSWORD not in text and derived not in text and "PRIVATE KEY" not in text
    assert "Type=oneshot" in unit and "IOSchedulingClass=idle" in unit and "Nice=19" in unit
    assert f"ExecStart=/usr/bin/python3 {paths.HOST_MODULE} backup run\n" in unit
    assert "OnUnitActiveSec=3600\n" in timer and "WantedBy=timers.target" in timer
    units = state.units
    assert units[b.UNIT].running is None and units[b.UNIT].enabled is None  # never started by a converge
    assert units[b.TIMER].running and units[b.TIMER].enabled
    assert "restic" in state.packages
    assert repr(src).count(PASSWORD) == 0


def test_a_door_backs_up_its_usage_snapshot_and_an_office_repository_needs_no_key():
    src = source("usage-door-1", role.Target(base="s3:s3.example:9000/bucket/fleet"), backup_interval_s=900)
    state = role.backup_source_state(src)
    env = host_backup.parse_env(state.files[b.ENV].content)
    assert env["RESTIC_REPOSITORY"] == "s3:s3.example:9000/bucket/fleet/usage-door-1"
    assert env["SPARKFLEET_BACKUP_DATA"] == paths.FRONT_DOOR_USAGE_SNAPSHOT
    assert "SPARKFLEET_BACKUP_SFTP_COMMAND" not in env
    assert "SPARKFLEET_CHAT_UI_UNIT" not in env
    assert {b.SSH_KEY, b.KNOWN_HOSTS} <= set(state.absent)
    assert "OnUnitActiveSec=900\n" in state.files[b.TIMER_PATH].content


def test_env_values_with_metacharacters_are_one_word():
    """A repository or path with a blank, a quote or a `;` reaches the host program as written, one value."""
    hostile = "sftp:u@host:/a b;'c'$(id)"
    src = role.Source("usage-d", role.Target(base=hostile), settings(), PASSWORD)
    env = host_backup.parse_env(role.env_file(src))
    assert env["RESTIC_REPOSITORY"] == f"{hostile}/usage-d"


def test_the_target_jails_its_sftp_user():
    keys = {"chat-ui": b.ssh_key(PASSWORD, "chat-ui")[1], "usage-d": b.ssh_key(PASSWORD, "usage-d")[1]}
    state = role.backup_target_state(keys)
    assert state.directories[b.TARGET_DIR].mode == "0755" and state.directories[b.TARGET_DIR].owner == ("root", "root")
    assert state.directories[b.TARGET_REPOS].owner == (b.TARGET_USER, b.TARGET_USER)
    lines = state.files[b.TARGET_AUTHORIZED_KEYS].content.splitlines()[1:]
    assert lines == [f"restrict {keys['chat-ui']}", f"restrict {keys['usage-d']}"]
    sshd = state.files[b.TARGET_SSHD_CONFIG].content
    assert f"Match User {b.TARGET_USER}\n" in sshd and "ForceCommand internal-sftp" in sshd
    assert sshd.endswith("Match all\n")  # the block ends inside the drop-in
    [reload] = state.commands.values()
    assert reload.command.startswith("sshd -t && ") and reload.when == (b.TARGET_SSHD_CONFIG,)


def test_a_host_that_is_no_source_keeps_its_data():
    state = role.no_backup_state()
    assert set(state.removed_units) == {b.UNIT, b.TIMER}
    assert b.PASSWORD_FILE in state.absent and b.SSH_KEY in state.absent
    assert not any(p.startswith((paths.CHAT_UI_DIR, b.STATE + "/", "/srv")) for p in state.absent)
    assert all(isinstance(s, (Absent, UnitRemoved)) for s in state.steps)
    assert all(not isinstance(s, (File, Unit)) for s in role.no_target_state().steps)


# --- the inventory's plan -----------------------------------------------------------------------------------------


@dataclass
class Plan:
    settings: Settings
    lan_address: str


def password_file(tmp_path: Path, mode: int = 0o600, text: str = PASSWORD) -> str:
    path = tmp_path / "backup-password"
    path.write_text(text + "\n")
    path.chmod(mode)
    return str(path)


def inventory(tmp_path: Path, targets=("spark-3",), **more):
    """The sim's shape: spark-1 runs the chat UI, door-1 is a door, spark-3 the target; its SSH from the controller
    on 127.0.0.1:2203, from the LAN on 22."""
    if "controller_backup_password_file" not in more:
        more["controller_backup_password_file"] = password_file(tmp_path)
    groups = {"spark-1": {"sparks", "chat_ui"}, "spark-2": {"sparks"}, "spark-3": {"sparks"}, "door-1": {"front_door"}}
    for t in targets:
        groups[t].add(b.GROUP)
    hosts = {name: {GROUPS_KEY: sorted(of), "ssh_hostname": "127.0.0.1", "ssh_port": 2200 + int(name[-1]) + (
        10 if name.startswith("door") else 0), "ssh_known_hosts_file": str(tmp_path / "known_hosts")}
        for name, of in groups.items()}
    plans = {name: Plan(settings(**more), f"sparkfleet-{name}") for name in groups}
    return hosts, plans


def lookup(known_hosts: Path, name: str) -> str:
    return f"{name} ssh-ed25519 {KEY}\n" if name == "[127.0.0.1]:2203" else ""


def test_the_sim_inventory_plan(tmp_path):
    hosts, plans = inventory(tmp_path)
    planned = plan_backups(hosts, plans, "spark-1", lookup)
    assert set(planned.sources) == {"spark-1", "door-1"} and planned.target == "spark-3"
    chat = planned.sources["spark-1"]
    assert chat.target.repository("chat-ui") == "sftp:sparkfleet-backup@sparkfleet-spark-3:/repos/chat-ui"
    assert chat.target.port == 22 and chat.target.known_hosts == f"sparkfleet-spark-3 ssh-ed25519 {KEY}\n"
    assert planned.public_keys == {s: b.ssh_key(PASSWORD, s)[1] for s in ("chat-ui", "usage-door-1", "controller")}
    assert plan_backups(*inventory(tmp_path, targets=()), "spark-1", lookup) == BackupPlan()


@pytest.mark.parametrize("case, problem", [
    ("two targets", "group backup: spark-2, spark-3: one host keeps the backups: keep one"),
    ("target is the source", "spark-1: the backup target is this host, which holds chat-ui's data: a backup must "
                             "be off the box"),
    ("no password file", "`controller_backup_password_file` is not: run `sparkfleet init`"),
    ("missing file", "does not exist: run `sparkfleet init`"),
    ("open to others", "is open to other users (mode 0644): chmod 600"),
    ("empty file", "is empty"),
    ("key not pinned", "spark-3: the backup target's host key is not pinned ([127.0.0.1]:2203 is not in"),
])
def test_the_refusals_name_the_fix(tmp_path, case, problem):
    more: dict = {}
    targets: tuple = ("spark-3",)
    found = lookup
    if case == "two targets":
        targets = ("spark-2", "spark-3")
    elif case == "target is the source":
        targets = ("spark-1",)
    elif case == "no password file":
        more["controller_backup_password_file"] = None
    elif case == "missing file":
        more["controller_backup_password_file"] = str(tmp_path / "nowhere")
    elif case == "open to others":
        more["controller_backup_password_file"] = password_file(tmp_path, mode=0o644)
    elif case == "empty file":
        more["controller_backup_password_file"] = password_file(tmp_path, text="")
    else:
        def found(known_hosts, name):
            return ""
    hosts, plans = inventory(tmp_path, targets=targets, **more)
    with pytest.raises(SettingsError) as refused:
        plan_backups(hosts, plans, "spark-1", found)
    assert problem in str(refused.value)
    assert PASSWORD not in str(refused.value)


@pytest.mark.ssh
def test_the_controller_reads_the_pinned_key_with_ssh_keygen(tmp_path):
    """The real lookup: a hashed known_hosts entry for the name the controller dials (ssh-keygen -F)."""
    import subprocess

    from sparkfleet.controller.backup_plan import pinned_key

    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:2203 ssh-ed25519 {KEY}\n")
    subprocess.run(["ssh-keygen", "-H", "-f", str(known)], capture_output=True, check=True)
    assert "[127.0.0.1]" not in known.read_text()
    assert role.known_hosts_line(pinned_key(known, "[127.0.0.1]:2203"), "spark-3") == f"spark-3 ssh-ed25519 {KEY}\n"
    assert pinned_key(known, "[127.0.0.1]:2204") == "" and pinned_key(tmp_path / "none", "x") == ""
    assert os.stat(known).st_size > 0


@pytest.mark.ssh
def test_the_private_key_is_the_same_at_every_converge_and_opens(tmp_path):
    """OpenSSH's format holds two random check words: derived here instead, so a second converge writes nothing,
    and ssh-keygen still reads the key and finds the public line the target lets in."""
    import subprocess

    key = role.private_key(PASSWORD, "usage-door-1")
    assert key == role.private_key(PASSWORD, "usage-door-1") != role.private_key(PASSWORD, "chat-ui")
    assert b.ssh_key(PASSWORD, "usage-door-1")[0] != b.ssh_key(PASSWORD, "usage-door-1")[0]  # why: random words
    path = tmp_path / "id"
    path.write_text(key)
    path.chmod(0o600)
    public = subprocess.run(["ssh-keygen", "-y", "-f", str(path)], capture_output=True, text=True)
    assert public.returncode == 0, public.stderr
    assert public.stdout.split()[:2] == b.ssh_key(PASSWORD, "usage-door-1")[1].split()[:2]


def test_the_batched_read_covers_the_backup_package_and_user():
    """The host's one read of its state (host/state.py) reports restic and the target's user: without them every
    converge would install the one and make the other again."""
    assert role.PACKAGE in paths.MANAGED_PACKAGES and b.TARGET_USER in paths.MANAGED_USERS


def test_the_batched_read_covers_every_path_a_host_without_backups_asks_about():
    """Every host asks that the backups' files are absent (no source, no target): each path in the one batched read
    (paths.MANAGED_GLOBS), or a no-op converge costs a round trip more per host (tests/e2e/test_sudo_user.py)."""
    from sparkfleet.host.state import _covered

    asked = [p for s in (role.no_backup_state(), role.no_target_state()) for p in s.absent]
    assert asked and [p for p in asked if not _covered(p)] == []


def test_plan_refuses_what_the_deploy_would_before_any_host(tmp_path, capsys):
    """`sparkfleet plan` runs the backup plan's checks (controller/checks.py): two backup hosts, and a password
    file open to others, are each one line and exit 2, offline."""
    from sparkfleet import cli

    loose = password_file(tmp_path, mode=0o640)
    path = tmp_path / "office.py"
    path.write_text(f"_d = {{'api_host': '0.0.0.0', 'api_key': 'k' * 32, 'backend_key_in_clear': True, "
                    f"'controller_backup_password_file': {loose!r}}}\n"
                    "sparks = [(f'spark-{n}', {**_d, 'ssh_hostname': f'10.0.0.{n}'}) for n in (1, 2, 3)]\n"
                    "chat_ui = sparks[:1]\nbackup = sparks[1:]\n")
    assert cli.main(["plan", str(path), "--offline"]) == 2
    err = capsys.readouterr().err
    assert "group backup: spark-2, spark-3: one host keeps the backups: keep one" in err
    other = tmp_path / "office2.py"
    other.write_text(path.read_text().replace("backup = sparks[1:]", "backup = sparks[2:]"))
    assert cli.main(["plan", str(other), "--offline"]) == 2
    err += capsys.readouterr().err
    assert f"the backup password file {loose} is open to other users (mode 0640): chmod 600" in err
    assert PASSWORD not in err


def test_an_inventory_without_backups_is_refused_nothing_of_theirs(tmp_path):
    """A chat UI host that is a door too is refused only where backups are set (a one-source unit): an inventory
    without a `backup` group or `backup_repository` plans as before."""
    hosts, plans = inventory(tmp_path, targets=())
    hosts["spark-1"][GROUPS_KEY] = ["chat_ui", "front_door", "sparks"]
    assert plan_backups(hosts, plans, "spark-1", lookup) == BackupPlan()
    hosts["spark-3"][GROUPS_KEY] = ["backup", "sparks"]
    with pytest.raises(SettingsError, match="the chat UI's host is a front door too"):
        plan_backups(hosts, plans, "spark-1", lookup)
