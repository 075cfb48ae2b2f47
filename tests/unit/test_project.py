"""`sparkfleet init` and `sparkfleet hostkeys`: a project that plans offline, keys outside it, host keys
collected by a stand-in ssh-keyscan on PATH (no network) and printed as `ssh-keygen -lf` prints them."""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from sparkfleet import cli
from sparkfleet.fleet import project
from sparkfleet.roles.front_door.plan import front_door_plan
from sparkfleet.controller.inventory import load_hosts
from sparkfleet.release.plan import plan_hosts
from sparkfleet.contract.settings import SettingsError

pytestmark = pytest.mark.skipif(not shutil.which("ssh-keygen"), reason="needs OpenSSH's ssh-keygen")

FAKE_KEYSCAN = r"""#!/bin/sh
# ssh-keyscan -T N -t TYPE -p PORT HOST: prints HOST's key from $KEYS/HOST.pub, as the real one does
port=22
while [ $# -gt 1 ]; do case "$1" in -p) port=$2; shift 2;; -T|-t) shift 2;; *) shift;; esac; done
host=$1
[ -f "$KEYS/$host.pub" ] || exit 1
name=$host; [ "$port" = 22 ] || name="[$host]:$port"
echo "# $host:$port SSH-2.0-OpenSSH_9.6"
echo "evil.example ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA"
echo "$name not a key line"
echo "$name $(cut -d' ' -f1,2 "$KEYS/$host.pub")"
"""


@pytest.fixture
def keys(tmp_path, monkeypatch):
    """A stand-in ssh-keyscan first on PATH; `keys(host)` gives that host a real ed25519 key to answer with."""
    bin_dir, key_dir = tmp_path / "bin", tmp_path / "hostkeys"
    bin_dir.mkdir()
    key_dir.mkdir()
    scan = bin_dir / "ssh-keyscan"
    scan.write_text(FAKE_KEYSCAN)
    scan.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    monkeypatch.setenv("KEYS", str(key_dir))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))

    def add(host: str) -> str:
        """The host's fingerprint, from the key file itself."""
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key_dir / host)], check=True)
        out = subprocess.run(["ssh-keygen", "-lf", str(key_dir / f"{host}.pub")], capture_output=True,
                             text=True, check=True).stdout.split()
        return out[1]

    return add


HOSTS = ["--host", "spark-a=10.0.0.1", "--host", "spark-b=10.0.0.2", "--host", "spark-c=spark-c.lan"]


def test_init_writes_a_project_that_plans_offline_with_no_secret_inside(tmp_path, keys, capsys):
    fingerprint = {"10.0.0.1": keys("10.0.0.1"), "spark-c.lan": keys("spark-c.lan")}  # 10.0.0.2 is off
    office = tmp_path / "office"
    assert cli.main(["init", str(office), *HOSTS]) == 0
    out = capsys.readouterr().out
    assert f"spark-a (10.0.0.1): {fingerprint['10.0.0.1']} (ED25519)" in out
    assert f"spark-c (spark-c.lan): {fingerprint['spark-c.lan']} (ED25519)" in out
    assert "spark-b (10.0.0.2): did not answer" in out and project.CONSOLE_CHECK in out

    assert (office / "deploy.py").read_text() == (
        '"""Converge this office\'s Sparks: pyinfra inventory.py deploy.py"""\n'
        "from sparkfleet.tasks import converge\n"
        "converge()\n")
    known = (office / "known_hosts").read_text().splitlines()
    assert [line.split()[0] for line in known] == ["10.0.0.1", "spark-c.lan"]  # no stranger's, no junk line

    secrets = tmp_path / "home/.config/sparkfleet/office.json"
    doc = json.loads(secrets.read_text())
    assert doc["users"] == {} and len(doc["api_key"]) >= 32
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o600 and stat.S_IMODE(secrets.parent.stat().st_mode) == 0o700
    private_key = secrets.with_suffix(".key")
    assert stat.S_IMODE(private_key.stat().st_mode) == 0o600
    pem = private_key.read_text().splitlines()[1]
    for path in office.rglob("*"):
        if path.is_file():
            text = path.read_text()
            assert doc["api_key"] not in text and pem not in text, path

    assert cli.main(["plan", str(office / "inventory.py"), "--offline", "--json"]) == 0
    hosts = load_hosts(str(office / "inventory.py"))
    assert [name for name, _ in hosts] == ["spark-a", "spark-b", "spark-c"]
    assert [name for name, _ in load_hosts(str(office / "inventory.py"), "front_door")] == ["spark-a"]
    data = dict(hosts)["spark-b"]
    assert data["ssh_strict_host_key_checking"] == "yes" and data["ssh_known_hosts_file"] == str(office / "known_hosts")
    assert data["api_key"] == doc["api_key"] and data["ssh_hostname"] == "10.0.0.2"
    door = front_door_plan("spark-a", {p.name: p for p in plan_hosts(hosts)})  # what the converge will build
    assert door.tls and [b.name for b in door.backends] == ["spark-a", "spark-b", "spark-c"]
    san = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in", door.settings.front_door_tls_cert],
                         capture_output=True, text=True).stdout
    assert "IP Address:10.0.0.1" in san and "DNS:spark-c.lan" in san


def test_hostkeys_collects_only_what_is_missing(tmp_path, keys, capsys):
    keys("10.0.0.1")
    office = tmp_path / "office"
    assert cli.main(["init", str(office), *HOSTS]) == 0
    inventory = str(office / "inventory.py")
    assert cli.main(["hostkeys", inventory]) == 1  # two still do not answer
    capsys.readouterr()
    late = keys("10.0.0.2")
    assert cli.main(["hostkeys", inventory, "--limit", "spark-b", "--json"]) == 0
    [result] = json.loads(capsys.readouterr().out)["known_hosts"][str(office / "known_hosts")]
    assert result["state"] == "added" and result["fingerprints"] == [f"{late} (ED25519)"]
    assert cli.main(["hostkeys", inventory]) == 1
    out = capsys.readouterr().out
    assert "spark-a (10.0.0.1): already in known_hosts" in out and "spark-b (10.0.0.2): already" in out
    assert "spark-c (spark-c.lan): did not answer" in out
    hosts = [line.split()[0] for line in (office / "known_hosts").read_text().splitlines()]
    assert hosts == ["10.0.0.1", "10.0.0.2"]


def test_a_host_off_port_22_is_named_as_known_hosts_names_it(tmp_path, keys):
    keys("10.0.0.5")
    found = project.collect_host_keys(tmp_path / "kh", [project.Spark("a", "10.0.0.5", 2222)])
    assert found[0].state == "added"
    assert (tmp_path / "kh").read_text().startswith("[10.0.0.5]:2222 ssh-ed25519 ")
    assert project.is_known(tmp_path / "kh", project.Spark("a", "10.0.0.5", 2222))
    assert not project.is_known(tmp_path / "kh", project.Spark("a", "10.0.0.5"))


def test_hostkeys_refuses_an_inventory_without_a_known_hosts_file(tmp_path, keys, capsys):
    inventory = tmp_path / "inv.py"
    inventory.write_text("sparks = [('spark-a', {'ssh_hostname': '10.0.0.1'})]\n")
    assert cli.main(["hostkeys", str(inventory)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "spark-a: no ssh_known_hosts_file" in err


def test_force_rewrites_the_project_and_keeps_the_keys(tmp_path, keys, capsys):
    office = tmp_path / "office"
    assert cli.main(["init", str(office), "--host", "a=10.0.0.1"]) == 0
    secrets = tmp_path / "home/.config/sparkfleet/office.json"
    before = secrets.read_text()
    (office / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert cli.main(["init", str(office), "--host", "a=10.0.0.9"]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert cli.main(["init", str(office), "--host", "a=10.0.0.9", "--force"]) == 0
    assert secrets.read_text() == before and (office / "notes.txt").read_text() == "mine"
    assert '"ssh_hostname": "10.0.0.9"' in (office / "inventory.py").read_text()
    assert "kept as it was" in capsys.readouterr().out


@pytest.mark.parametrize("args,needle", [
    (["--host", "spark-a"], "give NAME=ADDRESS"),
    (["--host", "bad name=10.0.0.1"], "--host name 'bad name'"),
    (["--host", "a=10.0.0.1;reboot"], "must be an IP address or a host name"),
    (["--host", "a=10.0.0.1", "--host", "a=10.0.0.2"], "--host names repeat (a)"),
    (["--host", "a=10.0.0.1", "--ssh-user", "root -oProxyCommand=x"], "--ssh-user"),
    (["--host", "a=10.0.0.1", "--host", "b=10.0.0.2", "--front-door", "a", "--front-door", "b"],
     "2 front doors need the address they share: give --front-door-address CIDR"),
    (["--host", "a=10.0.0.1", "--front-door", "c"], "--front-door 'c' is no --host"),
    (["--host", "a=10.0.0.1", "--host", "b=10.0.0.2", "--front-door", "a", "--front-door", "b",
      "--front-door-address", "10.0.0.2/24"], "is b's own address"),
    (["--host", "a=10.0.0.1", "--host", "b=10.0.0.2", "--front-door", "a", "--front-door", "b",
      "--front-door-address", "10.0.0.100"], "--front-door-address '10.0.0.100'"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, keys, capsys, args, needle):
    office = tmp_path / "office"
    assert cli.main(["init", str(office), *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err
    assert not office.exists() and not (tmp_path / "home").exists()


def test_secrets_inside_the_project_or_a_git_work_tree_are_refused(tmp_path, keys, capsys):
    office = tmp_path / "office"
    assert cli.main(["init", str(office), "--host", "a=10.0.0.1", "--secrets", str(office / "keys.json")]) == 2
    assert "inside the project" in capsys.readouterr().err
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    assert cli.main(["init", str(office), "--host", "a=10.0.0.1", "--secrets", str(repo / "conf/k.json")]) == 2
    assert f"inside the git work tree {repo}" in capsys.readouterr().err
    shutil.move(str(repo), str(tmp_path / "home"))  # a home directory kept in git: the default is refused too
    assert cli.main(["init", str(office), "--host", "a=10.0.0.1"]) == 2
    assert "inside the git work tree" in capsys.readouterr().err
    assert not office.exists()


def test_an_existing_secrets_file_is_not_replaced_without_force(tmp_path, keys, capsys):
    secrets = tmp_path / "keys" / "office.json"
    assert cli.main(["init", str(tmp_path / "one"), "--host", "a=10.0.0.1", "--secrets", str(secrets)]) == 0
    before = secrets.read_text()
    assert cli.main(["init", str(tmp_path / "two"), "--host", "a=10.0.0.1", "--secrets", str(secrets)]) == 2
    assert "a secrets file exists" in capsys.readouterr().err and secrets.read_text() == before


def test_without_openssl_the_project_plans_and_the_front_door_asks_for_tls_once_users_come(tmp_path, keys,
                                                                                             monkeypatch, capsys):
    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "openssl" else which(name))
    office = tmp_path / "office"
    assert cli.main(["init", str(office), "--host", "a=10.0.0.1", "--host", "b=10.0.0.2"]) == 0
    assert "front door TLS: none (no openssl here)" in capsys.readouterr().out
    assert [p.name for p in (tmp_path / "home/.config/sparkfleet").glob("*.key")] == ["office.ca.key"]  # the CA needs no openssl
    inventory = str(office / "inventory.py")
    assert cli.main(["plan", inventory, "--offline", "--json"]) == 0
    assert cli.main(["users", "add", inventory, "alice"]) == 0
    with pytest.raises(SettingsError, match="front_door_tls_cert"):
        front_door_plan("a", {p.name: p for p in plan_hosts(load_hosts(inventory))})


def test_group_data_holds_no_setting(tmp_path, keys):
    assert cli.main(["init", str(tmp_path / "office"), "--host", "a=10.0.0.1"]) == 0
    import runpy

    values = {k for k in runpy.run_path(str(tmp_path / "office/group_data/all.py")) if not k.startswith("__")}
    assert values == set()  # only comments: nothing there differs from the defaults yet


def test_san_names_ips_and_dns_names_once():
    assert project.san(["10.0.0.1", "fd00::1", "spark.lan", "10.0.0.1"]) == "IP:10.0.0.1,IP:fd00::1,DNS:spark.lan"


def test_host_key_targets_group_by_known_hosts_file():
    hosts = [("a", {"ssh_hostname": "10.0.0.1", "ssh_known_hosts_file": "/k1"}),
             ("b", {"ssh_port": 2222, "ssh_known_hosts_file": "/k1"}), ("c", {})]
    targets, unchecked = project.host_key_targets(hosts)
    assert targets == {Path("/k1"): [project.Spark("a", "10.0.0.1"), project.Spark("b", "b", 2222)]}
    assert unchecked == ["c"]


def test_init_with_two_doors_writes_their_shared_address_and_plans_offline(tmp_path, keys, capsys):
    office = tmp_path / "office"
    assert cli.main(["init", str(office), "--host", "a=10.0.0.1", "--host", "b=10.0.0.2", "--front-door", "b",
                     "--front-door", "a", "--front-door-address", "10.0.0.100/24"]) == 0
    text = (office / "inventory.py").read_text()
    assert 'front_door = ([sparks[1], sparks[0]], {"front_door_address": "10.0.0.100/24"})' in text
    doors = load_hosts(str(office / "inventory.py"), limit="front_door")
    assert [name for name, _ in doors] == ["a", "b"]  # pyinfra keeps the inventory's order: the priorities'
    assert {data["front_door_address"] for _, data in doors} == {"10.0.0.100/24"}
    if shutil.which("openssl"):  # the self-signed certificate names the floating address: clients reach it there
        crt = tmp_path / "home/.config/sparkfleet/office.crt"
        text = subprocess.run(["openssl", "x509", "-noout", "-text", "-in", str(crt)], capture_output=True, text=True).stdout
        assert "IP Address:10.0.0.100" in text
