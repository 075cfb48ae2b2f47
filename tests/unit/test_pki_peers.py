"""Issue 50, item 3: the doors' peers link trusts only the doors. With Debian's real HAProxy on loopback, a door's
peers listener, rendered and given its files as the stages plan them, refuses a Spark's fleet certificate and a
retired door's, and admits a current door's; a host certificate is for client use only on a host that acts as a
client (a door, a monitoring host, the controller); a host's key is rotated on its own by its key generation."""

from __future__ import annotations

import os
import re
import socket
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from sparkfleet.contract import paths
from sparkfleet.roles import pki
from sparkfleet.roles.desired import File
from sparkfleet.roles.front_door import address as fd_address, plan as fd_plan
from sparkfleet.roles.front_door.desired import door_state
from tests.conftest import free_port
from tests.tiers import needs

from .helpers import start_haproxy, wait_for
from .test_front_door_address import plans
from .test_guard_tls import _handshake, _one_ssl_context_class, tls_guard  # noqa: F401 (fixtures)

SERVER, CLIENT = ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH


def make_ca(directory: Path) -> tuple[str, str]:
    directory.mkdir(parents=True, exist_ok=True)
    crt, key = directory / "fleet.ca.crt", directory / "fleet.ca.key"
    pki.write_ca(crt, key)
    return str(crt), str(key)


def tls_fleet(tmp_path, doors, peers_port=10000):
    """Offline plans of spark-1 and `doors`, every hop TLS with a fleet CA made in `tmp_path`."""
    crt, key = make_ca(tmp_path / "keys")
    return plans(doors=doors, sparks=("spark-1",), backend_key_in_clear=False, fleet_ca_cert=crt, fleet_ca_key=key,
                 front_door_peers_port=peers_port)


def usages(pem: str) -> set:
    cert = x509.load_pem_x509_certificate(pem.encode())
    return set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def write_files(files: dict[str, File], moved: dict[str, str]) -> None:
    """A host's planned files as its stages write them, under the moved directories."""
    for path, f in files.items():
        dest = next((Path(new) / path[len(old):].lstrip("/") for old, new in moved.items()
                     if path.startswith(old + "/")), None)
        if dest is None:
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(f.content if f.content is not None else Path(f.src).read_text())
        dest.chmod(int(f.mode, 8))


def host_files(ca, found, name, doors=None) -> dict[str, File]:
    """Every file the stages plan for host `name` in the TLS directory and, on a door, the door's directory."""
    files = dict(pki.tls_state(ca, name, found[name].lan_address, None)[0].files)
    if doors and name in doors.names:
        files.update(door_state(fd_plan.front_door_plan(name, found, doors=doors)).files)
    return files


def peers_crt(config: str) -> str:
    """The certificate a door presents on its peers link: its config's peers section's `default-server ... crt`."""
    section = config[re.search(r"^peers ", config, re.M).start():]
    return re.search(r"^\s*default-server .*\bcrt (\S+)", section, re.M).group(1)


def hello(port: int, crt: Path, key: Path | None, claims: str) -> str:
    """A peers client on `port` presenting (crt, key), claiming to be door `claims`: HAProxy's status line, or the
    error that ended the link (TLS 1.3 delivers a refused client certificate as an alert after the handshake)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # the listener's check is under test, not ours
    ctx.load_cert_chain(str(crt), str(key) if key else None)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
                ctx.wrap_socket(raw, server_hostname="door-1") as link:
            link.sendall(f"HAProxyS 2.1\ndoor-1\n{claims} {os.getpid()} 1\n".encode())
            answer = link.recv(64).decode(errors="replace")
            return answer.split("\n")[0] or "closed"
    except (ssl.SSLError, ConnectionError, socket.timeout) as exc:
        return type(exc).__name__


@needs("haproxy")
def test_a_doors_peers_listener_admits_only_the_current_doors(tmp_path):
    """door-1's peers listener, as planned for the doors door-1 and door-2: door-2's peers certificate gets the
    peers protocol's 200; a Spark's fleet certificate (server and client use on main: it pushed counts) and the
    certificate a retired door-3 held are refused at the TLS layer, whatever door they claim to be."""
    port = free_port()
    found = tls_fleet(tmp_path, ("door-1", "door-2"), port)
    ca = pki.ca_of(found["door-1"].settings)
    doors = fd_address.door_set(["door-1", "door-2"], found)
    retired = tls_fleet(tmp_path, ("door-1", "door-2", "door-3"), port)  # before door-3 left: the same CA
    old_doors = fd_address.door_set(["door-1", "door-2", "door-3"], retired)

    def on_disk(host: str, files: dict[str, File]) -> dict[str, str]:
        moved = {paths.TLS_DIR: str(tmp_path / host / "tls"), paths.FRONT_DOOR_DIR: str(tmp_path / host / "fd")}
        write_files(files, moved)
        return moved

    door = fd_plan.front_door_plan("door-1", found, doors=doors)
    config = door.config()
    moved = on_disk("door-1", host_files(ca, found, "door-1", doors))
    other = free_port()
    moved.update({paths.FRONT_DOOR_SOCKET: str(tmp_path / "door-1" / "admin.sock"),
                  paths.FRONT_DOOR_STATE_FILE: str(tmp_path / "door-1" / "state"),
                  paths.FRONT_DOOR_USAGE_SNAPSHOT: str(tmp_path / "door-1" / "usage.snapshot"),
                  f"bind :{door.settings.front_door_port}": f"bind 127.0.0.1:{free_port()}",
                  f"peer door-1 10.0.0.11:{port}": f"peer door-1 127.0.0.1:{port}",
                  f"peer door-2 10.0.0.12:{port}": f"peer door-2 127.0.0.1:{other}"})
    assert re.search(r"^\s*default-bind ssl verify required ", config, re.M)  # the peers link is TLS
    proc = start_haproxy(config, tmp_path / "door-1", moved)
    try:
        def presented(host: str, planned: dict[str, File], door_config: str | None) -> tuple[Path, Path | None]:
            """What `host` holds for the peers link: a door its config's peers `crt`, a Spark its fleet pair."""
            where = on_disk(host, planned)
            crt = peers_crt(door_config) if door_config else paths.TLS_HOST_CERT
            local = Path(crt.replace(paths.TLS_DIR, where[paths.TLS_DIR]))
            key = Path(f"{local}.key")
            return local, (key if key.exists() else None)

        door2 = presented("door-2", host_files(ca, found, "door-2", doors),
                          fd_plan.front_door_plan("door-2", found, doors=doors).config())
        spark = presented("spark-1", host_files(ca, found, "spark-1"), None)
        door3 = presented("door-3", host_files(ca, retired, "door-3", old_doors),
                          fd_plan.front_door_plan("door-3", retired, doors=old_doors).config())
        wait_for(lambda: hello(port, *door2, "door-2") == "200", 10)
        assert hello(port, *spark, "door-2") != "200"
        assert hello(port, *spark, "spark-1") != "200"
        assert hello(port, *door3, "door-2") != "200"
        assert hello(port, *door3, "door-3") != "200"
        refused = {hello(port, *spark, "door-2"), hello(port, *door3, "door-2")}
        assert not any(r.isdigit() for r in refused), refused  # refused by TLS, not by the peers protocol's names
    finally:
        proc.terminate()
        proc.wait()


def test_client_use_only_for_hosts_that_act_as_clients(tmp_path):
    """A Spark's certificate is for server use only (its guard); a door's and a monitoring host's for server and
    client (they ask the guards); the controller's own for client use only."""
    found = tls_fleet(tmp_path, ("door-1",))
    ca = pki.ca_of(found["spark-1"].settings)
    spark = pki.tls_state(ca, "spark-1", "10.0.0.1", None)[1]
    door = pki.tls_state(ca, "door-1", "10.0.0.11", None, client=True)[1]
    assert usages(spark) == {SERVER}
    assert usages(door) == {SERVER, CLIENT}
    assert usages(pki.client_pair(ca)[0]) == {CLIENT}
    assert pki.is_client(["front_door"]) and pki.is_client(["monitoring", "all"])
    assert not pki.is_client(["chat_ui"]) and not pki.is_client([])
    # a Spark's certificate of main (server and client) is re-issued; a door moved out of the group too
    assert pki.wrong(ca, door, "spark-1", ("spark-1",)) is not None
    assert pki.wrong(ca, pki.issue(ca, "spark-1", ("spark-1", "10.0.0.1"), client=True), "spark-1",
                     ("spark-1", "10.0.0.1")) == "not for server use only"
    assert pki.wrong(ca, spark, "spark-1", ("spark-1", "10.0.0.1")) is None
    assert pki.wrong(ca, door, "door-1", ("door-1", "10.0.0.11"), client=True) is None
    assert pki.wrong(ca, pki.issue(ca, "door-1", ("door-1", "10.0.0.11")), "door-1", ("door-1", "10.0.0.11"),
                     client=True) == "not for server and client use"


def test_bumping_a_hosts_generation_changes_its_key_and_no_other(tmp_path):
    """`bump_generations` (sparkfleet rekey) beside the CA key: that host's derived key changes, its certificate is
    then wrong ("not for this host's key") and the converge plans a new key file; another host's key stays."""
    found = tls_fleet(tmp_path, ("door-1",))
    s = found["spark-1"].settings
    before = pki.ca_of(s)
    keys = {n: pki.host_key_pem(before, n) for n in ("spark-1", "door-1")}
    state, cert = pki.tls_state(before, "spark-1", "10.0.0.1", None)
    assert pki.bump_generations(s.fleet_ca_key, ["spark-1"]) == {"spark-1": 1}
    generations = pki.generations_path(s.fleet_ca_key)
    assert generations.parent == Path(s.fleet_ca_key).parent and generations.stat().st_mode & 0o777 == 0o600
    after = pki.ca_of(s)
    assert after.generations == {"spark-1": 1}
    assert pki.host_key_pem(after, "spark-1") != keys["spark-1"]
    assert pki.host_key_pem(after, "door-1") == keys["door-1"]
    assert pki.host_key_pem(after, "spark-1") == pki.host_key_pem(pki.ca_of(s), "spark-1")  # the same each run
    assert pki.wrong(after, cert, "spark-1", ("spark-1", "10.0.0.1")) == "not for this host's key"
    again, new_cert = pki.tls_state(after, "spark-1", "10.0.0.1", cert)
    assert new_cert != cert
    assert again.files[paths.TLS_HOST_KEY].content != state.files[paths.TLS_HOST_KEY].content
    assert pki.bump_generations(s.fleet_ca_key, ["spark-1", "door-1"]) == {"spark-1": 2, "door-1": 1}
    assert len({pki.host_key_pem(pki.ca_of(s), "spark-1"), keys["spark-1"], pki.host_key_pem(after, "spark-1")}) == 3


@pytest.mark.parametrize("text", ["[]", '{"spark-1": 0}', '{"spark-1": "1"}', '{"spark-1": true}', "{", "\x00"])
def test_a_malformed_generations_file_is_one_line(tmp_path, text):
    found = tls_fleet(tmp_path, ("door-1",))
    s = found["spark-1"].settings
    pki.generations_path(s.fleet_ca_key).write_text(text)
    with pytest.raises(pki.PkiError) as exc:
        pki.load_ca(s.fleet_ca_cert, s.fleet_ca_key)
    assert "\n" not in str(exc.value) and str(pki.generations_path(s.fleet_ca_key)) in str(exc.value)


def test_the_peers_trust_names_every_door_and_nothing_else(tmp_path):
    """Each door's planned peers files: its own certificate (self-signed, its derived key) and the same list of
    the doors' certificates on every door; the same bytes each converge (a reload only on a change)."""
    found = tls_fleet(tmp_path, ("door-1", "door-2"))
    doors = fd_address.door_set(["door-1", "door-2"], found)
    ca = pki.ca_of(found["door-1"].settings)
    one, two = (door_state(fd_plan.front_door_plan(n, found, doors=doors)).files for n in ("door-1", "door-2"))
    assert one[paths.TLS_PEERS_CA].content == two[paths.TLS_PEERS_CA].content
    assert one[paths.TLS_PEERS_PEM].secret and one[paths.TLS_PEERS_PEM].mode == "0600"
    trusted = x509.load_pem_x509_certificates(one[paths.TLS_PEERS_CA].content.encode())
    assert sorted(c.subject.rfc4514_string() for c in trusted) == ["CN=door-1", "CN=door-2"]
    assert all(c.issuer == c.subject for c in trusted)  # pinned: no CA that could issue another
    assert pki.host_key(ca, "door-1").public_key() in [c.public_key() for c in trusted]
    again = door_state(fd_plan.front_door_plan("door-1", found, doors=doors)).files
    assert again[paths.TLS_PEERS_PEM].content == one[paths.TLS_PEERS_PEM].content
    assert again[paths.TLS_PEERS_CA].content == one[paths.TLS_PEERS_CA].content


def test_a_sparks_certificate_is_no_client_of_a_guard(tls_guard):
    """Debian's HAProxy as a guard: a Spark's certificate (server use only) is refused as a client at the
    handshake, a door's (server and client) gets through."""
    tmp, ca, _, _, port = tls_guard
    spark_state, spark_cert = pki.tls_state(ca, "spark-b", "10.0.0.2", None)
    assert _handshake(port, ca, tmp, (spark_cert, spark_state.files[paths.TLS_HOST_KEY].content)) != "ok"
    door_state_, door_cert = pki.tls_state(ca, "door-1", "10.0.0.11", None, client=True)
    assert _handshake(port, ca, tmp, (door_cert, door_state_.files[paths.TLS_HOST_KEY].content)) == "ok"


def test_rekey_bumps_the_named_hosts_alone_and_refuses_a_stranger(tmp_path, capsys):
    """`sparkfleet rekey INVENTORY HOST...`: the named hosts' generations one higher beside the CA key, what to
    converge next (every door where one is a door); a host the inventory lacks, or a fleet of plain hops, is
    refused in one line and nothing is written."""
    from sparkfleet import cli

    crt, key = make_ca(tmp_path / "keys")
    office = tmp_path / "office"
    office.mkdir()
    common = {"fleet_ca_cert": crt, "fleet_ca_key": key, "api_key": "k" * 32, "api_host": "0.0.0.0"}
    inventory = office / "inventory.py"
    inventory.write_text(f"sparks = [('spark-1', {common!r}), ('spark-2', {common!r})]\n"
                         f"front_door = [('door-1', {common!r})]\n")
    assert cli.main(["rekey", str(inventory), "spark-1", "door-1"]) == 0
    out = capsys.readouterr().out
    assert "spark-1: key generation 1" in out and "door-1: key generation 1" in out and "every door" in out
    assert pki.read_generations(key) == {"spark-1": 1, "door-1": 1}
    assert cli.main(["rekey", str(inventory), "spark-1", "--json"]) == 0
    assert '"spark-1": 2' in capsys.readouterr().out
    assert cli.main(["rekey", str(inventory), "spark-9"]) == 2
    err = capsys.readouterr().err
    assert "spark-9 is no host of" in err and err.count("\n") == 1
    plain = office / "plain.py"
    plain.write_text(f"sparks = [('spark-1', {{**{common!r}, 'backend_key_in_clear': True}})]\n")
    assert cli.main(["rekey", str(plain), "spark-1"]) == 2
    assert "plain http" in capsys.readouterr().err
    assert pki.read_generations(key) == {"spark-1": 2, "door-1": 1}
