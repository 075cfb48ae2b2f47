"""The backups on a converged fleet (roles/backup.py): each data host's timer enabled, its source's password, key
and settings root-only, no secret in its unit; the backup target's SFTP user jailed by sshd; every other host
without any of it. A fleet without backups deselects nothing: its hosts hold none."""

from __future__ import annotations

import pytest

from sparkfleet.contract import backup as b
from sparkfleet.controller.backup_plan import BackupPlan, plan_backups
from sparkfleet.controller.inventory import load_hosts

from .conftest import _plans, chat_ui_of


@pytest.fixture
def planned(request) -> BackupPlan:
    """The inventory's backups as the deploy planned them (the same plan, the same refusals)."""
    config = request.config
    if not hasattr(config, "_sparkfleet_backups"):
        _plans(config)
        ui = chat_ui_of(config)
        hosts = dict(load_hosts(config.getoption("--inventory")))
        config._sparkfleet_backups = plan_backups(hosts, config._sparkfleet_all_plans, ui.host if ui else None)
    return config._sparkfleet_backups


def test_a_data_host_runs_its_timer_with_its_secrets_root_only(node, planned):
    src = planned.sources.get(node.plan.name)
    if src is None:
        assert not node.host.file(b.TIMER_PATH).exists and not node.host.file(b.PASSWORD_FILE).exists
        return
    timer = node.host.service(b.TIMER)
    assert timer.is_enabled and timer.is_running
    assert node.host.run("restic version").rc == 0
    config = node.host.file(b.CONFIG)
    assert (config.user, config.mode) == ("root", 0o700)
    for path in (b.PASSWORD_FILE, b.ENV) + (() if src.target.base else (b.SSH_KEY,)):
        f = node.host.file(path)
        assert (f.user, f.group, f.mode) == ("root", "root", 0o600), path
    derived = b.repository_password(src.password, src.source)
    unit = node.host.file(b.UNIT_PATH).content_string
    assert "Type=oneshot" in unit and "IOSchedulingClass=idle" in unit
    for text in (unit, node.host.file(b.TIMER_PATH).content_string,
                 node.host.run(f"systemctl show {b.UNIT} {b.TIMER}").stdout):
        assert derived not in text and src.password not in text and "PRIVATE KEY" not in text


def test_the_target_jails_its_sftp_user(node, planned):
    if planned.target != node.plan.name:
        assert not node.host.file(b.TARGET_SSHD_CONFIG).exists
        return
    repos = node.host.file(b.TARGET_REPOS)
    assert (repos.user, repos.mode) == (b.TARGET_USER, 0o700)
    jail = node.host.file(b.TARGET_DIR)
    assert (jail.user, jail.mode) == ("root", 0o755)
    keys = node.host.file(b.TARGET_AUTHORIZED_KEYS)
    assert (keys.user, keys.mode) == ("root", 0o644)
    lines = [line for line in keys.content_string.splitlines() if not line.startswith("#")]
    assert len(lines) == len(planned.public_keys) and all(line.startswith("restrict ssh-ed25519 ") for line in lines)
    effective = node.host.run(f"sshd -T -C user={b.TARGET_USER},host=x,addr=10.0.0.1").stdout.lower()
    assert f"chrootdirectory {b.TARGET_DIR}" in effective and "forcecommand internal-sftp" in effective
    assert "allowtcpforwarding no" in effective and "permittty no" in effective
    root = node.host.run("sshd -T -C user=root,host=x,addr=10.0.0.1").stdout.lower()
    assert "forcecommand internal-sftp" not in root and "chrootdirectory none" in root  # the block ends in its file
