"""The fleet's certificate authority and the certificates it issues: TLS on every backend hop (the front doors,
Prometheus and the controller to each host's guard), so the backend key never crosses the LAN in clear.

`sparkfleet init` makes the CA (ECDSA P-256, ten years) beside the secrets, outside the project; its key is held to
the secrets file's rules (contract/private_files.py: not open to other users, not inside the project or a git work
tree). The controller issues each host's certificate at converge: the host's private key is *derived* from the CA
key, the host's name and its key generation (HMAC-SHA256, reduced to a P-256 scalar), so the key file is the same on
every converge, and the certificate (public) is re-issued only when the host's current one is `wrong` (another CA,
another key, a missing name, another usage, expiring within RENEW_BEFORE). The generations (0 unless bumped) are the
one state kept: a JSON file beside the CA key, 0600, bumped by `sparkfleet rekey` (`bump_generations`) to rotate one
host's key alone.

A certificate is for server use (its guard) and, only on a host that acts as a client (a door, a monitoring host:
`is_client`), for client use too; the controller's own is for client use only. The doors' peers link (HAProxy's
shared usage table) trusts no CA: each door presents a self-signed certificate of its own key (`peers_cert`, the same
bytes each converge) and trusts exactly the current doors' (`peers_state`), so neither a Spark's certificate nor a
retired door's can join it. Plain functions: no pyinfra; the only I/O is reading and writing the CA's files on the
controller.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import hmac
import ipaddress
import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from sparkfleet.contract import paths, private_files
from sparkfleet.contract.monitoring import SERVICE_GROUPS, TLS_EXPIRY_METRIC, backend_hop
from sparkfleet.contract.settings import GROUPS_KEY, Settings, SettingsError, parse_settings
from sparkfleet.release.plan import fleet_tls
from sparkfleet.roles.desired import DesiredState, Directory, File, desired, secret

CA_DAYS = 3650
HOST_DAYS = 90  # a host's certificate; re-issued by the converge that finds it within RENEW_BEFORE of its end
RENEW_BEFORE = dt.timedelta(days=30)
ALERT_BEFORE_DAYS = 14  # the alert rule (fleet/alerts.py) fires this close to a host certificate's end
CLIENT_DAYS = 1  # the controller's own client certificate (status, the gates), made in memory per run
CONTROLLER_NAME = "sparkfleet-controller"
CA_NAME = "sparkfleet fleet CA"
MAX_PEM = 64 * 1024  # a host's certificate as read back from the host: data, size-capped
_CURVE = ec.SECP256R1()
_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551  # P-256's group order n
_LABEL = b"sparkfleet host key v1\0"  # a host's first key (generation 0): the derivation before generations
_LABEL_GENERATION = b"sparkfleet host key v2\0"  # a bumped one: the generation (4 bytes) before the name
MAX_GENERATION = 2**31 - 1
MAX_GENERATIONS_FILE = 1024 * 1024
SERVER_ONLY = (ExtendedKeyUsageOID.SERVER_AUTH,)  # a Spark: its guard serves; it asks no guard
SERVER_AND_CLIENT = (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH)  # a door, a monitoring host
CLIENT_ONLY = (ExtendedKeyUsageOID.CLIENT_AUTH,)  # the controller's own (status, the gates, bench)
CLIENT_GROUPS = SERVICE_GROUPS  # the hosts that ask the guards: the doors and Prometheus's hosts
_USE = {SERVER_ONLY: "server use only", SERVER_AND_CLIENT: "server and client use", CLIENT_ONLY: "client use only"}


class PkiError(ValueError):
    """The fleet CA cannot be used: one line naming the file, the problem and the fix."""


def _now(now: dt.datetime | None) -> dt.datetime:
    return now or dt.datetime.now(dt.timezone.utc)


def ca_paths(secrets: Path) -> tuple[Path, Path]:
    """The fleet CA's certificate and key, beside the secrets file (as project.tls_paths for the door's)."""
    return secrets.with_suffix(".ca.crt"), secrets.with_suffix(".ca.key")


def generations_path(key_path: str | Path) -> Path:
    """The hosts' key generations, beside the CA key (`fleet.ca.key` -> `fleet.ca.generations.json`)."""
    return Path(key_path).with_suffix(".generations.json")


def is_client(groups: Iterable[str]) -> bool:
    """Whether a host of these inventory groups asks the guards (a door, a monitoring host): its certificate is
    for client use too."""
    return bool(set(groups) & CLIENT_GROUPS)


@dataclass(frozen=True)
class FleetCA:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    generations: dict[str, int] = field(default_factory=dict, hash=False)  # host -> key generation (absent: 0)

    @property
    def cert_pem(self) -> str:
        return self.cert.public_bytes(serialization.Encoding.PEM).decode()


def new_ca(now: dt.datetime | None = None, days: int = CA_DAYS) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) of a new fleet CA: ECDSA P-256, self-signed, a CA for no intermediate."""
    now = _now(now)
    key = ec.generate_private_key(_CURVE)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME)])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key).encode()


def write_ca(crt: Path, key: Path) -> bool:
    """Make the fleet CA at (crt, key) unless both exist (kept: the hosts' certificates chain to it); the key 0600
    from its first byte, both files replaced atomically. True when it made one. One file without the other is
    refused: a lone key or certificate is someone's, and nothing here overwrites it."""
    if crt.exists() and key.exists():
        return False
    if crt.exists() or key.exists():
        lone, other = (crt, key) if crt.exists() else (key, crt)
        raise PkiError(f"the fleet CA has {lone} but not {other}: restore {other}, or move {lone} away to make a "
                       "new CA (every host's certificate is then re-issued at the next converge)")
    crt.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    cert_pem, key_pem = new_ca()
    with tempfile.TemporaryDirectory(dir=crt.parent) as tmp:  # 0700: the key is never readable by others
        new_key, new_crt = Path(tmp) / "key", Path(tmp) / "crt"
        fd = os.open(new_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(key_pem)
        new_crt.write_bytes(cert_pem)
        new_crt.chmod(0o644)
        new_key.replace(key)
        new_crt.replace(crt)
    return True


def _key_kept_private(key_path: Path) -> None:
    """The CA key held to the secrets file's two rules (contract/private_files.py), checked before it is read:
    PkiError naming the file and the fix where it is open to other users, or inside the project or a git work
    tree. A missing or unreadable key is left to the reader's own line."""
    try:
        problem = private_files.open_to_others(key_path, "the fleet CA key")
    except OSError:
        return
    if problem:
        raise PkiError(f"setting `fleet_ca_key`: {problem}")
    found = private_files.exposed(key_path, private_files.working_project())
    if found:
        kind, where = found
        fix = ("move it and its certificate out of the project (beside the secrets file, e.g. ~/.config/sparkfleet/)"
               if kind == "project" else "move it and its certificate out of any repository")
        raise PkiError(f"setting `fleet_ca_key`: the fleet CA key {key_path} is inside the {kind} {where}, where it "
                       f"would be committed or copied along: {fix}, and point `fleet_ca_cert`/`fleet_ca_key` at them")


def read_generations(key_path: str | Path) -> dict[str, int]:
    """The hosts' key generations beside the CA key ({} where there is no file: every host's first key), or
    PkiError in one line naming the file: unreadable, too large, not a JSON object of name -> whole number >= 1."""
    path = generations_path(key_path)
    shape = (f"the hosts' key generations {path} must be a JSON object of host name -> whole number >= 1 (written "
             "by `sparkfleet rekey`): fix it, or remove it to bring back every host's first key")
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_GENERATIONS_FILE + 1)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise PkiError(f"cannot read the hosts' key generations {path} on the controller ({exc.strerror}): make it "
                       "readable by you") from None
    if len(raw) > MAX_GENERATIONS_FILE:
        raise PkiError(shape)
    try:
        doc = json.loads(raw)
    except ValueError:
        raise PkiError(shape) from None
    if not isinstance(doc, dict) or not all(
            isinstance(k, str) and type(v) is int and 1 <= v <= MAX_GENERATION for k, v in doc.items()):
        raise PkiError(shape)
    return doc


def bump_generations(key_path: str | Path, names: Iterable[str]) -> dict[str, int]:
    """Each named host's key generation one higher (its derived key, so its certificate, new at its next converge;
    no other host's changes), under an exclusive lock beside the file, replaced atomically, 0600. The names' new
    generations."""
    path = generations_path(key_path)
    lock = path.with_name(f".{path.name}.lock")
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise PkiError(f"cannot lock the hosts' key generations {path} ({exc.strerror}): make its directory "
                       "writable by you") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        doc = read_generations(key_path)
        bumped = {n: doc.get(n, 0) + 1 for n in dict.fromkeys(names)}
        if any(g > MAX_GENERATION for g in bumped.values()):
            raise PkiError(f"the hosts' key generations {path}: a generation past {MAX_GENERATION}")
        doc.update(bumped)
        partial = tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False)  # 0600
        try:
            with partial:
                json.dump(doc, partial, indent=2, sort_keys=True)
                partial.write("\n")
                partial.flush()
                os.fsync(partial.fileno())
            os.replace(partial.name, path)
        except BaseException:
            Path(partial.name).unlink(missing_ok=True)
            raise
        return bumped
    finally:
        os.close(fd)  # releases the lock


def load_ca(cert_path: str | Path, key_path: str | Path, now: dt.datetime | None = None) -> FleetCA:
    """The fleet CA from the controller's files, or PkiError: its key open to other users or inside the project or
    a git work tree (`_key_kept_private`), unreadable, not PEM, not a P-256 CA, the key not the certificate's,
    expired or not yet valid, the generations file malformed. The error names the files, never their content."""
    fix = "run `sparkfleet init --force` in the project to make one, or set `fleet_ca_cert`/`fleet_ca_key` to its files"
    _key_kept_private(Path(key_path))
    texts = []
    for setting, path in (("fleet_ca_cert", cert_path), ("fleet_ca_key", key_path)):
        try:
            texts.append(Path(path).read_bytes())
        except OSError as exc:
            raise PkiError(f"setting `{setting}`: cannot read {path} on the controller ({exc.strerror}): {fix}") \
                from None
    try:
        cert = x509.load_pem_x509_certificate(texts[0])
    except ValueError:
        raise PkiError(f"setting `fleet_ca_cert`: {cert_path} is not a PEM certificate: {fix}") from None
    try:
        key = serialization.load_pem_private_key(texts[1], password=None)
    except (ValueError, TypeError):
        raise PkiError(f"setting `fleet_ca_key`: {key_path} is not an unencrypted PEM private key: {fix}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != _CURVE.name:
        raise PkiError(f"setting `fleet_ca_key`: {key_path} is not an ECDSA P-256 key: {fix}")
    if cert.public_key() != key.public_key():
        raise PkiError(f"settings `fleet_ca_cert` and `fleet_ca_key`: the key {key_path} is not the key of the "
                       f"certificate {cert_path}: point both at one CA's files")
    try:
        ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        ca = False
    if not ca:
        raise PkiError(f"setting `fleet_ca_cert`: {cert_path} is not a CA certificate: {fix}")
    now = _now(now)
    if cert.not_valid_after_utc <= now:
        raise PkiError(f"setting `fleet_ca_cert`: the fleet CA {cert_path} expired on "
                       f"{cert.not_valid_after_utc:%Y-%m-%d}: move its two files away and run `sparkfleet init "
                       "--force` for a new one (every host's certificate is re-issued at the next converge)")
    if cert.not_valid_before_utc > now:
        raise PkiError(f"setting `fleet_ca_cert`: the fleet CA {cert_path} is valid only from "
                       f"{cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC: check the controller's clock")
    return FleetCA(cert, key, read_generations(key_path))


def _key_pem(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def host_key(ca: FleetCA, name: str) -> ec.EllipticCurvePrivateKey:
    """Host `name`'s private key, derived from the CA key (whoever holds it can issue anyway) and the host's key
    generation: the same key on every converge, so its file never changes, until `bump_generations` rotates that
    host's alone. Two HMAC-SHA256 blocks (512 bits) reduced modulo n-1, plus 1: a scalar in [1, n-1] with
    negligible bias. Generation 0 is the derivation of before generations (an upgrade changes no key)."""
    secret = ca.key.private_numbers().private_value.to_bytes(32, "big")
    generation = ca.generations.get(name, 0)
    label = _LABEL if generation == 0 else _LABEL_GENERATION + generation.to_bytes(4, "big")
    wide = b"".join(hmac.new(secret, label + bytes([i]) + name.encode(), hashlib.sha256).digest() for i in (1, 2))
    return ec.derive_private_key(int.from_bytes(wide, "big") % (_ORDER - 1) + 1, _CURVE)


def host_key_pem(ca: FleetCA, name: str) -> str:
    return _key_pem(host_key(ca, name))


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def host_names(name: str, address: str) -> tuple[str, ...]:
    """What a host's certificate names: its inventory name (what the front door verifies: `verifyhost`) and the
    address the other hosts reach its guard at (its plan's lan_address), once each."""
    return tuple(dict.fromkeys(n for n in (name, address) if n))


def issue(ca: FleetCA, name: str, names: tuple[str, ...], key: ec.EllipticCurvePrivateKey | None = None,
          now: dt.datetime | None = None, days: int = HOST_DAYS, client: bool = False) -> str:
    """A certificate (PEM) for `name` with these subject alternative names, signed by the fleet CA, for `days`: for
    server use, and for client use too where `client` (a door or a Prometheus host asks the guards with it)."""
    return _issue(ca, name, names, key or host_key(ca, name), _now(now), days,
                  SERVER_AND_CLIENT if client else SERVER_ONLY)


def _issue(ca: FleetCA, name: str, names: tuple[str, ...], key: ec.EllipticCurvePrivateKey, now: dt.datetime,
           days: int, usage: tuple) -> str:
    not_after = min(now + dt.timedelta(days=days), ca.cert.not_valid_after_utc)  # never past its CA
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca.cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(list(usage)), critical=False)
            .add_extension(x509.SubjectAlternativeName([_general_name(n) for n in names]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False)
            .sign(ca.key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def wrong(ca: FleetCA, pem: str | None, name: str, names: tuple[str, ...],
          now: dt.datetime | None = None, client: bool = False) -> str | None:
    """Why host `name`'s current certificate (as read from the host: untrusted text) must be re-issued, or None
    when it stands: absent, unreadable, not issued by the fleet CA, not for the derived key (of its generation),
    lacking a name, for another use than the host's (server only; server and client where `client`), or within
    RENEW_BEFORE of its end."""
    if pem is None or not pem.strip():
        return "absent"
    if len(pem) > MAX_PEM:
        return "too large to be a certificate"
    try:
        cert = x509.load_pem_x509_certificate(pem.encode())
    except ValueError:
        return "not a PEM certificate"
    try:
        if cert.issuer != ca.cert.subject:
            raise ValueError
        cert.verify_directly_issued_by(ca.cert)
    except (ValueError, TypeError, InvalidSignature):
        return "not issued by the fleet CA"
    if cert.public_key() != host_key(ca, name).public_key():
        return "not for this host's key"
    try:
        have = set(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
    except x509.ExtensionNotFound:
        have = set()
    missing = [n for n in names if _general_name(n) not in have]
    if missing:
        return f"lacks the name {missing[0]}"
    try:
        usages = set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    except x509.ExtensionNotFound:
        usages = set()
    wanted = SERVER_AND_CLIENT if client else SERVER_ONLY
    if usages != set(wanted):
        return f"not for {_USE[wanted]}"
    now = _now(now)
    if cert.not_valid_before_utc > now:
        return "not yet valid"
    if cert.not_valid_after_utc - now < RENEW_BEFORE:
        return f"expires {cert.not_valid_after_utc:%Y-%m-%d}"
    return None


def client_pair(ca: FleetCA, now: dt.datetime | None = None) -> tuple[str, str]:
    """(certificate PEM, key PEM) the controller presents to the guards (status, the gates, bench): a fresh key,
    CONTROLLER_NAME, one day; kept in memory and in a private temporary directory only (fleet/tls.py)."""
    key = ec.generate_private_key(_CURVE)
    return _issue(ca, CONTROLLER_NAME, (CONTROLLER_NAME,), key, _now(now), CLIENT_DAYS, CLIENT_ONLY), _key_pem(key)


def ends(pem: str | None) -> str | None:
    """When a host's certificate (as read from the host: untrusted text) ends, as YYYY-MM-DD for `status`; None
    when there is none or it is not one."""
    if not pem or not pem.strip() or len(pem) > MAX_PEM:
        return None
    try:
        return f"{x509.load_pem_x509_certificate(pem.encode()).not_valid_after_utc:%Y-%m-%d}"
    except ValueError:
        return None


EXPIRY_METRIC = TLS_EXPIRY_METRIC  # contract/monitoring.py names it


def expiry_metric(pem: str) -> str:
    """The node exporter's textfile (paths.TLS_EXPIRY_TEXTFILE) for the host's certificate in force: when it ends,
    in seconds since the epoch, which the alert TlsCertificateExpiring (roles/monitoring.py) compares with time()."""
    end = x509.load_pem_x509_certificate(pem.encode()).not_valid_after_utc
    return (f"# HELP {EXPIRY_METRIC} when this host's fleet TLS certificate ends (seconds since the epoch)\n"
            f"# TYPE {EXPIRY_METRIC} gauge\n{EXPIRY_METRIC} {int(end.timestamp())}\n")


def ca_of(s: Settings) -> FleetCA:
    """The fleet CA a host's settings name, loaded and checked (load_ca), or SettingsError: one line."""
    try:
        return load_ca(s.fleet_ca_cert, s.fleet_ca_key)
    except PkiError as exc:
        raise SettingsError([str(exc)]) from None


def plans_ca(plans) -> FleetCA | None:
    """The fleet CA of planned hosts whose hops are TLS (checked before any host is touched), else None."""
    tls = [p for p in plans if p.backend_tls]
    return ca_of(tls[0].settings) if tls else None


def hosts_ca(hosts: list[tuple[str, dict]]) -> FleetCA | None:
    """The fleet CA of a whole inventory's [(name, merged data)] when its hops are TLS, else None; the rule is the
    planner's (`fleet_tls`)."""
    settings = {name: parse_settings(name, data) for name, data in hosts}
    tls, problems = fleet_tls(settings, backend_hop(data.get(GROUPS_KEY, ()) for _, data in hosts))
    if problems:
        raise SettingsError(problems)
    return ca_of(next(iter(settings.values()))) if tls else None


# This host's TLS files, which its guard, its front door and Prometheus read: a change of any reloads them.
TLS_FILES = (paths.TLS_CA, paths.TLS_HOST_KEY, paths.TLS_HOST_CERT)


def tls_state(ca: FleetCA, name: str, address: str, current: str | None,
              client: bool = False) -> tuple[DesiredState, str]:
    """Host `name`'s TLS files (the fleet CA's certificate, its derived key, its certificate: for client use too
    where `client`, `is_client`) and the certificate in force after them: `current` (as read from the host) where it
    stands, else one issued now (`wrong` says why). The current one is kept otherwise: a new one each run would
    reload every HAProxy each run."""
    names = host_names(name, address)
    why = wrong(ca, current, name, names, client=client)
    cert = issue(ca, name, names, client=client) if why else current
    issued = File(paths.TLS_HOST_CERT, f"This host's certificate issued by the fleet CA (the current one: {why})",
                  content=cert) if why else None
    return desired(Directory(paths.TLS_DIR, "Fleet TLS directory"),
                   File(paths.TLS_CA, "Fleet CA certificate", content=ca.cert_pem),
                   secret(paths.TLS_HOST_KEY, "This host's TLS key (root-only)", host_key_pem(ca, name)),
                   issued), cert


# --- the doors' peers link: pinned, not chained -------------------------------------------------------------------

# A door's peers files (its HAProxy's peers section: `default-bind` and `default-server`): a change reloads the door.
PEERS_FILES = (paths.TLS_PEERS_CA, paths.TLS_PEERS_PEM)


def peers_cert(ca: FleetCA, name: str, names: tuple[str, ...]) -> str:
    """Door `name`'s certificate on the peers link (PEM): self-signed by its derived key (so a bumped generation
    makes a new one), naming it, for server and client use, valid as long as the CA. The same bytes on every
    converge (serial from the key and names, deterministic ECDSA), so every door can list every other's."""
    key = host_key(ca, name)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    public = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    serial = int.from_bytes(hashlib.sha256(b"sparkfleet peers\0" + public + "\0".join(names).encode()).digest()[:16],
                            "big") | 1
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(serial)
            .not_valid_before(ca.cert.not_valid_before_utc).not_valid_after(ca.cert.not_valid_after_utc)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(list(SERVER_AND_CLIENT)), critical=False)
            .add_extension(x509.SubjectAlternativeName([_general_name(n) for n in names]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256(), ecdsa_deterministic=True))
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def peers_state(ca: FleetCA, host: str, doors: Iterable[tuple[str, str]]) -> DesiredState:
    """Door `host`'s peers files, of the doors [(name, LAN address)] (inventory order): the doors' peers
    certificates, the only ones its peers link trusts (the same file on every door: a Spark's fleet certificate, a
    retired door's, any other CA's is refused at the handshake), and its own certificate with its key (root-only)."""
    doors = list(doors)
    certs = {n: peers_cert(ca, n, host_names(n, address)) for n, address in doors}
    return desired(File(paths.TLS_PEERS_CA, f"The doors' peers certificates ({', '.join(certs)})",
                        content="".join(certs.values())),
                   secret(paths.TLS_PEERS_PEM, "This door's peers certificate and key (root-only)",
                          certs[host] + host_key_pem(ca, host)))
