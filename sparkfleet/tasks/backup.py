"""The backups' stages (roles/backup.py says what each host holds; controller/backup_plan.py plans the inventory's):
a data host's timer after its data's own stage (the chat UI on its Spark, the front door on its host), and the
backup target's jailed SFTP user on the host of the group `backup`. A host that is neither has what it held removed;
its data and the repositories stay.
"""

from pyinfra.api import deploy

from sparkfleet.contract.settings import SettingsError
from sparkfleet.controller.backup_plan import BackupPlan, plan_backups
from sparkfleet.controller.inventory import DeployRefused, chat_ui_of, host_data, plans
from sparkfleet.host.run import run_of

from sparkfleet.contract import backup as b
from sparkfleet.contract import paths
from sparkfleet.contract.shared import PACKAGE_DIR, PACKAGE_NAME, package_files
from sparkfleet.host.managed import managed_files, managed_user
from sparkfleet.roles.backup import (Source, backup_source_state, backup_target_state, no_backup_state,
                                     no_target_state)
from sparkfleet.tasks.ensure import ensure


def backup_of(state) -> BackupPlan:
    """The inventory's backups, planned once per run."""
    def plan() -> BackupPlan:
        ui, _ = chat_ui_of(state)
        hosts = {h.name: host_data(h) for h in state.inventory}
        return plan_backups(hosts, plans(state), ui.host if ui else None)

    try:
        return run_of(state).once("backup", "inventory", plan)
    except SettingsError as exc:  # refusal: planned (plan_backups: controller/checks.py check_inventory)
        raise DeployRefused(f"invalid backup settings; no host was changed:\n{exc}") from None


@deploy("Backup")
def backup_source(src: Source, service_host: bool = False):
    if service_host:  # a Spark has the host package from its model stage (tasks/model.py helpers); a door not
        managed_files(name=f"Host package {PACKAGE_NAME} (the backup's program)",
                      files=[(str(PACKAGE_DIR / name), f"{paths.HOST_MODULE}/{name}", "0644")
                             for name in package_files()])
    ensure(backup_source_state(src))


@deploy("No backup")
def no_backup():
    ensure(no_backup_state())


@deploy("Backup target")
def backup_target(public_keys: dict[str, str]):
    # the SFTP user, jailed by sshd's Match block (its home is the repositories' directory inside the chroot)
    managed_user(name=f"Backup user {b.TARGET_USER} (SFTP only)", user=b.TARGET_USER,
                 home=b.TARGET_REPOS_IN_CHROOT, shell="/usr/sbin/nologin")
    ensure(backup_target_state(public_keys))


@deploy("No backup target")
def no_backup_target():
    ensure(no_target_state())
