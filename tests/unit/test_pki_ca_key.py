"""Issue 50, item 6: the fleet CA's key is held to the secrets file's two rules. A key open to other users, or
inside the project or a git work tree, is refused in one line naming the file and the fix, never its content,
before any host is touched; the secrets file keeps the same rules through the same checks."""

from __future__ import annotations

import pytest

import sparkfleet
from sparkfleet.contract import private_files
from sparkfleet.contract.settings import SettingsError
from sparkfleet.fleet import users
from sparkfleet.release.plan import plan_hosts
from sparkfleet.roles import pki
from sparkfleet.roles.pki import hosts_ca, plans_ca

from .test_pki import inventory, make_ca as _make_ca


def make_ca(directory):
    directory.mkdir(parents=True, exist_ok=True)
    return _make_ca(directory)


@pytest.fixture
def project(tmp_path, monkeypatch):
    """The project a command works in (sparkfleet.PROJECT_ROOT), a directory of its own under tmp_path."""
    root = tmp_path / "office"
    root.mkdir()
    monkeypatch.setattr(sparkfleet, "PROJECT_ROOT", root)
    return root


def refused(crt, key) -> str:
    with pytest.raises(pki.PkiError) as exc:
        pki.load_ca(crt, key)
    line = str(exc.value)
    assert "\n" not in line and str(key) in line
    assert "PRIVATE KEY" not in line and key.read_text().strip().splitlines()[1] not in line
    return line


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644, 0o620, 0o601], ids=oct)
def test_a_ca_key_open_to_other_users_is_refused_naming_the_fix(tmp_path, project, mode):
    crt, key = make_ca(tmp_path / "keys")
    key.chmod(mode)
    line = refused(crt, key)
    assert f"open to other users (mode {mode:04o}): chmod 600 {key}" in line


def test_a_private_ca_key_outside_the_project_and_any_repository_loads(tmp_path, project):
    crt, key = make_ca(tmp_path / "keys")
    assert pki.load_ca(crt, key).cert.subject.rfc4514_string() == f"CN={pki.CA_NAME}"
    crt.chmod(0o644)  # the certificate is public: no rule on its mode
    assert pki.load_ca(crt, key)


def test_a_ca_key_inside_the_project_is_refused(project):
    crt, key = make_ca(project / "tls")
    line = refused(crt, key)
    assert f"inside the project {project.resolve()}" in line and "fleet_ca_key" in line


def test_a_ca_key_inside_a_git_work_tree_is_refused(tmp_path, project):
    repo = tmp_path / "dotfiles"
    (repo / ".git").mkdir(parents=True)
    crt, key = make_ca(repo / "config" / "sparkfleet")
    line = refused(crt, key)
    assert f"inside the git work tree {repo.resolve()}" in line and "out of any repository" in line


def test_the_project_is_none_where_a_command_runs_from_home(tmp_path, monkeypatch):
    """From the home directory (or above it) there is no project: the keys' default place is under it."""
    monkeypatch.setattr(sparkfleet, "PROJECT_ROOT", tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert private_files.working_project() is None
    monkeypatch.setattr(sparkfleet, "PROJECT_ROOT", tmp_path / "home" / "office")
    assert private_files.working_project() == tmp_path / "home" / "office"


def test_an_exposed_ca_key_is_refused_before_any_host(tmp_path, project):
    """Through the settings (plan, converge, status): a SettingsError, one line, before any host is touched."""
    crt, key = make_ca(tmp_path / "keys")
    key.chmod(0o644)
    hosts = inventory({}, fleet_ca_cert=str(crt), fleet_ca_key=str(key))
    with pytest.raises(SettingsError, match="open to other users"):
        plans_ca(plan_hosts(hosts))
    with pytest.raises(SettingsError, match="open to other users"):
        hosts_ca(hosts)


def test_the_secrets_file_and_the_ca_key_share_one_check_each(tmp_path, project, monkeypatch):
    """One owner per rule: the secrets file and the CA key are refused by the same two functions."""
    calls = []
    for name in ("open_to_others", "exposed"):
        real = getattr(private_files, name)
        monkeypatch.setattr(private_files, name, lambda *a, _real=real, _name=name, **k: calls.append(_name)
                            or _real(*a, **k))
    secrets = tmp_path / "keys" / "office.json"
    users.write_secrets(secrets, users.new_secrets())
    users.read_secrets(secrets)
    from sparkfleet.fleet import project as fleet_project

    fleet_project.check_secrets_place(secrets, project)
    crt, key = make_ca(tmp_path / "keys")
    pki.load_ca(crt, key)
    assert calls.count("open_to_others") == 2 and calls.count("exposed") == 2
