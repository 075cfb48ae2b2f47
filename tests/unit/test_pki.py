"""The fleet CA and the host certificates it issues (roles/pki.py), the controller's client (fleet/tls.py) and the
refusal by default of a backend hop without a CA (release/plan.py `fleet_tls`): hostile cases first."""

from __future__ import annotations

import datetime as dt
import os
import stat

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from sparkfleet.contract.settings import GROUPS_KEY, SettingsError
from sparkfleet.roles import pki
from sparkfleet.fleet.tls import guard_client
from sparkfleet.roles.pki import hosts_ca, plans_ca
from sparkfleet.release.plan import plan_hosts
from tests.unit.helpers import host_data

NOW = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)
NAMES = ("spark-a", "10.0.0.11")


def make_ca(tmp_path, name="ca", now=None, days=pki.CA_DAYS):
    crt, key = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
    cert_pem, key_pem = pki.new_ca(now=now, days=days)
    crt.write_bytes(cert_pem)
    key.write_bytes(key_pem)
    key.chmod(0o600)
    return crt, key


@pytest.fixture
def ca(tmp_path):
    return pki.load_ca(*make_ca(tmp_path))


def test_a_cert_and_key_of_two_cas_are_refused_in_one_line(tmp_path):
    crt, _ = make_ca(tmp_path, "one")
    _, key = make_ca(tmp_path, "two")
    with pytest.raises(pki.PkiError) as exc:
        pki.load_ca(crt, key)
    line = str(exc.value)
    assert "\n" not in line and "is not the key of the certificate" in line and str(key) in line
    assert "PRIVATE KEY" not in line and key.read_text() not in line


def test_an_expired_ca_is_refused_naming_the_fix(tmp_path):
    crt, key = make_ca(tmp_path, now=dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=20), days=10)
    with pytest.raises(pki.PkiError, match="expired on .*sparkfleet init --force"):
        pki.load_ca(crt, key)


@pytest.mark.parametrize("which", ["crt", "key"])
def test_a_missing_or_foreign_file_is_refused_in_one_line(tmp_path, which):
    crt, key = make_ca(tmp_path)
    target = crt if which == "crt" else key
    target.unlink()
    with pytest.raises(pki.PkiError, match="cannot read .* on the controller") as exc:
        pki.load_ca(crt, key)
    assert "\n" not in str(exc.value)
    target.write_text("not a pem\n")
    target.chmod(0o600)
    with pytest.raises(pki.PkiError, match="is not a PEM|is not an unencrypted PEM"):
        pki.load_ca(crt, key)


def test_a_leaf_certificate_is_no_ca(tmp_path, ca):
    crt, key = tmp_path / "leaf.crt", tmp_path / "leaf.key"
    crt.write_text(pki.issue(ca, "spark-a", NAMES))
    key.write_text(pki.host_key_pem(ca, "spark-a"))
    key.chmod(0o600)
    with pytest.raises(pki.PkiError, match="is not a CA certificate"):
        pki.load_ca(crt, key)


def test_the_host_key_is_derived_the_same_each_time_and_differs_per_host_and_ca(tmp_path, ca):
    assert pki.host_key_pem(ca, "spark-a") == pki.host_key_pem(ca, "spark-a")
    assert pki.host_key_pem(ca, "spark-a") != pki.host_key_pem(ca, "spark-b")
    other = pki.load_ca(*make_ca(tmp_path, "other"))
    assert pki.host_key_pem(other, "spark-a") != pki.host_key_pem(ca, "spark-a")


def test_a_fresh_certificate_stands(ca):
    pem = pki.issue(ca, "spark-a", NAMES)
    assert pki.wrong(ca, pem, "spark-a", NAMES) is None
    cert = x509.load_pem_x509_certificate(pem.encode())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["spark-a"]
    assert [str(a) for a in sans.get_values_for_type(x509.IPAddress)] == ["10.0.0.11"]
    assert (cert.not_valid_after_utc - cert.not_valid_before_utc).days == pki.HOST_DAYS


def test_a_certificate_of_another_ca_is_reissued(tmp_path, ca):
    other = pki.load_ca(*make_ca(tmp_path, "other"))
    # another CA, even for the very key this host derives from ours
    foreign = pki.issue(other, "spark-a", NAMES, key=pki.host_key(ca, "spark-a"))
    assert pki.wrong(ca, foreign, "spark-a", NAMES) == "not issued by the fleet CA"


@pytest.mark.parametrize("pem, why", [(None, "absent"), ("", "absent"), ("garbage", "not a PEM certificate"),
                                      ("x" * (pki.MAX_PEM + 1), "too large to be a certificate")])
def test_what_a_host_sends_is_data(ca, pem, why):
    assert pki.wrong(ca, pem, "spark-a", NAMES) == why


def test_another_key_a_missing_name_and_a_near_end_are_reissued(ca):
    assert pki.wrong(ca, pki.issue(ca, "spark-b", NAMES), "spark-a", NAMES) == "not for this host's key"
    assert pki.wrong(ca, pki.issue(ca, "spark-a", ("spark-a",)), "spark-a", NAMES) == "lacks the name 10.0.0.11"
    old = pki.issue(ca, "spark-a", NAMES, now=dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=61))
    assert pki.wrong(ca, old, "spark-a", NAMES).startswith("expires ")
    expired = pki.issue(ca, "spark-a", NAMES, now=dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=100))
    assert pki.wrong(ca, expired, "spark-a", NAMES).startswith("expires ")


def test_write_ca_keeps_an_existing_one_and_makes_the_key_private(tmp_path):
    crt, key = tmp_path / "s" / "x.ca.crt", tmp_path / "s" / "x.ca.key"
    assert pki.write_ca(crt, key) is True
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    before = crt.read_bytes()
    assert pki.write_ca(crt, key) is False and crt.read_bytes() == before
    key.unlink()
    with pytest.raises(pki.PkiError, match="but not"):
        pki.write_ca(crt, key)


def test_the_controller_client_is_private_and_removed(ca):
    with guard_client(ca) as client:
        ca_file, cert_file, key_file = client.files
        assert stat.S_IMODE(os.stat(os.path.dirname(key_file)).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
        cert = x509.load_pem_x509_certificate(open(cert_file, "rb").read())
        assert pki.CONTROLLER_NAME in cert.subject.rfc4514_string()
        assert (cert.not_valid_after_utc - cert.not_valid_before_utc) <= dt.timedelta(days=1, minutes=5)
        serialization.load_pem_private_key(open(key_file, "rb").read(), None)
    assert not os.path.exists(os.path.dirname(key_file))
    with guard_client(None) as plain:
        assert not plain.tls and plain.ssl_context() is None


# --- refusal by default: a backend hop and no CA ---------------------------------------------------------------

KEY = "k" * 32


def inventory(door: dict | None = None, **shared):
    spark = {"api_host": "0.0.0.0", "api_key": KEY, GROUPS_KEY: ["sparks"], **shared}
    hosts = [("spark-a", host_data(**spark, lan_address="10.0.0.11"))]
    if door is not None:
        hosts.append(("door", host_data(**shared, lan_address="10.0.0.9", **{GROUPS_KEY: ["front_door"]}, **door)))
    return hosts


def test_a_backend_hop_without_a_ca_is_refused_at_plan_time_naming_both_fixes():
    with pytest.raises(SettingsError) as exc:
        plan_hosts(inventory({}))
    [line] = exc.value.problems
    assert "sparkfleet init --force" in line and "backend_key_in_clear = True" in line


def test_no_backend_hop_keeps_the_guard_plain():
    [plan] = plan_hosts(inventory())
    assert plan.backend_tls is False


def test_in_clear_on_purpose_is_plain():
    plans = plan_hosts(inventory({}, backend_key_in_clear=True))
    assert not any(p.backend_tls for p in plans)


def test_the_ca_settings_are_the_fleets(tmp_path):
    crt, key = make_ca(tmp_path)
    hosts = inventory({"fleet_ca_cert": str(crt), "fleet_ca_key": str(key)})
    with pytest.raises(SettingsError, match="differ between hosts"):
        plan_hosts(hosts)


def test_a_ca_of_mismatched_files_is_refused_before_any_host(tmp_path):
    crt, _ = make_ca(tmp_path, "one")
    _, key = make_ca(tmp_path, "two")
    hosts = inventory({}, fleet_ca_cert=str(crt), fleet_ca_key=str(key))
    plans = plan_hosts(hosts)
    assert all(p.backend_tls for p in plans)
    with pytest.raises(SettingsError, match="is not the key of the certificate"):
        plans_ca(plans)
    with pytest.raises(SettingsError, match="is not the key of the certificate"):
        hosts_ca(hosts)


def test_relative_ca_paths_are_refused(tmp_path):
    with pytest.raises(SettingsError, match="fleet_ca_cert"):
        plan_hosts(inventory({}, fleet_ca_cert="ca.crt", fleet_ca_key=str(tmp_path / "k")))


def test_the_expiry_metric_and_its_alert(ca):
    from sparkfleet.contract.settings import parse_settings
    from sparkfleet.roles import monitoring

    pem = pki.issue(ca, "spark-a", NAMES)
    end = x509.load_pem_x509_certificate(pem.encode()).not_valid_after_utc
    assert f"{pki.EXPIRY_METRIC} {int(end.timestamp())}\n" in pki.expiry_metric(pem)
    [rule] = [r for r in monitoring.rules(parse_settings("spark-1", host_data())) if r["alert"] == "TlsCertificateExpiring"]
    assert rule["expr"] == f"{pki.EXPIRY_METRIC} - time() < {14 * 86400}"


def test_status_reads_a_certificates_end_from_the_hosts_text_and_flags_it_14_days_ahead(tmp_path):
    import datetime as dt

    from sparkfleet.roles import pki
    from sparkfleet.fleet.status import ending_soon

    cert, key = pki.new_ca()
    (tmp_path / "ca.crt").write_bytes(cert)
    (tmp_path / "ca.key").write_bytes(key)
    (tmp_path / "ca.key").chmod(0o600)
    ca = pki.load_ca(tmp_path / "ca.crt", tmp_path / "ca.key")
    day = pki.ends(pki.issue(ca, "spark-1", ("spark-1",)))
    assert day == f"{dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=pki.HOST_DAYS):%Y-%m-%d}"
    for hostile in (None, "", "not a certificate", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----",
                    "x" * (pki.MAX_PEM + 1)):
        assert pki.ends(hostile) is None
    now = dt.datetime(2027, 1, 1, tzinfo=dt.timezone.utc).timestamp()
    assert ending_soon("2027-01-10", now) and not ending_soon("2027-02-01", now) and not ending_soon(None, now)
