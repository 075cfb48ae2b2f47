"""The inventory's backups, planned once per run on the controller (roles/backup.py says what each host holds).

Which sources an inventory has (the chat UI's host: `chat-ui`; each front door: `usage-<door>`), where each one's
repository is (the host of the group `backup`, or an office's own `backup_repository`), the office's one password
(`controller_backup_password_file`, 0600, made by `sparkfleet init`), and the target's host key as the controller
pinned it (its known_hosts, looked up with `ssh-keygen -F` for the name the controller dials, rewritten for the
address the data hosts dial). Every refusal is one line naming the fix: controller/checks.py `check_inventory` runs
`plan_backups`, so `plan` and the deploy refuse before any host is touched; the deploy's stages take the plan once
per run (tasks/backup.py `backup_of`).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from sparkfleet.contract import backup as b
from sparkfleet.contract.monitoring import FRONT_DOOR_GROUP
from sparkfleet.contract.private_files import open_to_others
from sparkfleet.contract.reach import ssh_address, ssh_port
from sparkfleet.contract.settings import GROUPS_KEY, Settings, SettingsError
from sparkfleet.release.plan import HostPlan
from sparkfleet.roles.backup import SSH_PORT, Source, Target, dial_name, known_hosts_line, sftp_command, sources


@dataclass(frozen=True)
class BackupPlan:
    """The inventory's backups: each data host's Source, the target host (None: none in the inventory) and the
    public keys it lets in, by source."""

    sources: dict[str, Source] = field(default_factory=dict)
    target: str | None = None
    public_keys: dict[str, str] = field(default_factory=dict)


def backup_password(host: str, s: Settings) -> str:
    """The office's backup password from `controller_backup_password_file`: one line per problem, naming the fix."""
    path = s.controller_backup_password_file
    if not path:
        raise SettingsError([f"{host}: backups are set (a `{b.GROUP}` group or `backup_repository`) but "
                             "`controller_backup_password_file` is not: run `sparkfleet init`, which makes the "
                             "office's backup password, or set it to the file holding it"])
    file = Path(path).expanduser()
    try:
        problem = open_to_others(file, "the backup password file")
        text = file.read_text().strip()
    except FileNotFoundError:
        raise SettingsError([f"{host}: controller_backup_password_file {file} does not exist: run `sparkfleet init` "
                             "(or write the office's backup password there, chmod 600)"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError([f"{host}: controller_backup_password_file {file} is unreadable "
                             f"({type(exc).__name__}): fix its owner and mode (600)"]) from None
    if problem:
        raise SettingsError([f"{host}: {problem}"])
    if not text:
        raise SettingsError([f"{host}: controller_backup_password_file {file} is empty: write the office's backup "
                             "password there (`sparkfleet init` shows it once)"])
    return text


def pinned_key(known_hosts: Path, name: str) -> str:
    """`ssh-keygen -F NAME -f KNOWN_HOSTS`'s lines for the name the controller dials (hashed entries too); '' when
    there are none."""
    if not known_hosts.is_file():
        return ""
    found = subprocess.run(["ssh-keygen", "-F", name, "-f", str(known_hosts)], capture_output=True, text=True,
                           timeout=30)
    return found.stdout if found.returncode == 0 else ""


def target_of(name: str, data: dict, plan: HostPlan, lookup=pinned_key) -> Target:
    """The backup host as the data hosts reach it: its LAN address, on the inventory's SSH port where the
    controller dials that very address (else sshd's own port: the controller's may be a forward, as in the sim),
    with the host key the controller pinned for it."""
    port = ssh_port(name, data) or SSH_PORT
    controller_name = dial_name(ssh_address(name, data), port)
    dial_port = port if ssh_address(name, data) == plan.lan_address else SSH_PORT
    known_hosts = Path(str(data.get("ssh_known_hosts_file") or "~/.ssh/known_hosts")).expanduser()
    try:
        line = known_hosts_line(lookup(known_hosts, controller_name), dial_name(plan.lan_address, dial_port))
    except ValueError:
        raise SettingsError([f"{name}: the backup target's host key is not pinned ({controller_name} is not in "
                             f"{known_hosts}): run `sparkfleet hostkeys INVENTORY` first"]) from None
    sftp_command(plan.lan_address, dial_port)  # an address restic's split would break: refused here, by `plan` too
    return Target(address=plan.lan_address, port=dial_port, known_hosts=line)


def plan_backups(hosts: dict[str, dict], plans: dict[str, HostPlan], chat_ui_host: str | None,
                 lookup=pinned_key) -> BackupPlan:
    """The inventory's backups from its hosts' data ({name: merged data, with GROUPS_KEY}) and plans; SettingsError
    naming every problem. No `backup` group and no `backup_repository`: no backups (an empty plan)."""
    groups = {name: set(data.get(GROUPS_KEY, ())) for name, data in hosts.items()}
    targets = [name for name, of in groups.items() if b.GROUP in of]
    doors = [name for name, of in groups.items() if FRONT_DOOR_GROUP in of]
    if len(targets) > 1:
        raise SettingsError([f"group {b.GROUP}: {', '.join(targets)}: one host keeps the backups: keep one"])
    candidates = [h for h in (chat_ui_host, *doors) if h]
    if not targets and not any(plans[h].settings.backup_repository for h in candidates):
        return BackupPlan()  # no backups: nothing of theirs is refused
    wanted = sources(chat_ui_host, doors)
    own = {h for h in wanted if plans[h].settings.backup_repository}
    problems: list[str] = []
    target: Target | None = None
    if targets and set(wanted) - own:
        name = targets[0]
        try:
            target = target_of(name, hosts[name], plans[name], lookup)
        except SettingsError as exc:
            problems += exc.problems
    found: dict[str, Source] = {}
    keys: dict[str, str] = {}
    for host, source in wanted.items():
        s = plans[host].settings
        if host in targets and host not in own:
            problems.append(f"{host}: the backup target is this host, which holds {source}'s data: a backup must be "
                            f"off the box: put another host in the group {b.GROUP}")
            continue
        try:
            password = backup_password(host, s)
        except SettingsError as exc:
            problems += exc.problems
            continue
        if host in own:
            found[host] = Source(source, Target(base=s.backup_repository), s, password)
        elif target is not None:
            found[host] = Source(source, target, s, password)
            keys[source] = b.ssh_key(password, source)[1]
    if problems:
        raise SettingsError(list(dict.fromkeys(problems)))
    if target is not None and found:  # the controller's own state goes there too (fleet/backup.py), as `controller`
        keys[b.CONTROLLER] = b.ssh_key(next(iter(found.values())).password, b.CONTROLLER)[1]
    return BackupPlan(found, targets[0] if targets else None, keys)
