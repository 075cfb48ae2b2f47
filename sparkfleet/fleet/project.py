"""`sparkfleet init` (a ready office project) and `sparkfleet hostkeys` (the Sparks' SSH host keys).

A project is a directory of plain pyinfra files (inventory.py, group_data/all.py, deploy.py and known_hosts)
and, outside it and outside any git work tree, the 0600 secrets file (fleet/users.py) beside a self-signed
certificate for the front door. Host keys are collected with ssh-keyscan and printed as fingerprints: the
person compares each with the Spark's own console, since the first scan trusts whatever answers.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from ipaddress import ip_address
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from sparkfleet.contract import private_files
from sparkfleet.contract.reach import ssh_address, ssh_port
from sparkfleet.contract.settings import AbsPath, FloatingAddress, Host, Name
from sparkfleet.roles.pki import PkiError, ca_paths, write_ca
from sparkfleet.fleet.backup import new_password_file, password_file_beside
from sparkfleet.fleet.users import SECRETS_VARIABLE, new_secrets, read_secrets, write_secrets
from sparkfleet.refused import Refusal

SECRETS_HOME = Path("~/.config/sparkfleet")
SSH_PORT = 22
KEY_TYPE = "ed25519"  # one key per Spark to compare; paramiko and OpenSSH both prefer the type known_hosts holds
CONSOLE_CHECK = "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub"
KEYSCAN_TIMEOUT_S = 5
CERT_DAYS = 825
MAX_HOST_NAME = 63  # HAProxy's server name, for a front door backend
# A known_hosts line as ssh-keyscan prints it: host (or [host]:port), key type, base64 key.
_KEY_LINE = re.compile(r"(\S+) (ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(?:256|384|521)) ([A-Za-z0-9+/]+={0,2})")

DEPLOY_PY = '''"""Converge this office's Sparks: pyinfra inventory.py deploy.py"""
from sparkfleet.tasks import converge
converge()
'''

GROUP_DATA_ALL = '''\
# This office's settings: only what differs from sparkfleet's defaults (the package's group_data/all.py,
# documented in docs/settings.md). Nothing differs yet: the inventory sets the front door's keys and TLS.
# For example:
#     model_revision = "<a commit>"  # pin the model
#     max_model_len = 65536
'''


class ProjectError(ValueError, Refusal):
    """`init` or `hostkeys` cannot start: one line naming the problem and the fix (a refusal, exit 2)."""


@dataclass(frozen=True)
class Spark:
    name: str  # the inventory's host name
    address: str  # ssh_hostname
    port: int = SSH_PORT


def _valid(kind, value: str, what: str) -> str:
    try:
        return TypeAdapter(kind).validate_python(value)
    except ValidationError as exc:
        raise ProjectError(f"{what} {value!r}: {exc.errors()[0]['msg'].removeprefix('Value error, ')}") from None


def parse_host(text: str) -> Spark:
    """`--host NAME=ADDRESS`: a host name the front door can use, and an IP address or DNS name."""
    name, sep, address = text.partition("=")
    if not sep or not name or not address:
        raise ProjectError(f"--host {text!r}: give NAME=ADDRESS, e.g. --host spark-a=192.168.1.21")
    _valid(Name, name, "--host name")
    if len(name) > MAX_HOST_NAME:
        raise ProjectError(f"--host name {name!r}: at most {MAX_HOST_NAME} characters (a front door server name)")
    return Spark(name, _valid(Host, address, f"--host {name}: address"))


def default_secrets(project: Path) -> Path:
    return (SECRETS_HOME / f"{project.resolve().name}.json").expanduser()


def check_secrets_place(secrets: Path, project: Path) -> None:
    """Refuse a secrets file inside the project or any git work tree: it would be committed, or copied along (the
    rule: contract/private_files.py `exposed`, which the fleet CA's key is held to as well)."""
    secrets, project = secrets.resolve(), project.resolve()
    found = private_files.exposed(secrets, project)
    if found and found[0] == "project":
        raise ProjectError(f"--secrets {secrets} is inside the project {project}: keep the keys outside it, "
                           f"e.g. {default_secrets(project)}")
    if found:
        raise ProjectError(f"--secrets {secrets} is inside the git work tree {found[1]}: keep the keys out of any "
                           "repository (pass --secrets with a path outside it)")


def tls_paths(secrets: Path) -> tuple[Path, Path]:
    """The front door's certificate and key, beside the secrets file."""
    return secrets.with_suffix(".crt"), secrets.with_suffix(".key")


def san(addresses: list[str]) -> str:
    """openssl's subjectAltName for the Sparks' addresses (any of them may become a front door)."""
    def entry(address: str) -> str:
        try:
            ip_address(address)
            return f"IP:{address}"
        except ValueError:
            return f"DNS:{address}"
    return ",".join(dict.fromkeys(entry(a) for a in addresses))


def self_signed(crt: Path, key: Path, addresses: list[str]) -> bool:
    """A self-signed certificate for the front door (kept when both files exist); False without openssl."""
    if crt.exists() and key.exists():
        return True
    if not shutil.which("openssl"):
        return False
    crt.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=crt.parent) as tmp:  # 0700: the key is never readable by others
        new_crt, new_key = Path(tmp) / "crt", Path(tmp) / "key"
        proc = subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                               "-nodes", "-days", str(CERT_DAYS), "-subj", f"/CN={addresses[0]}",
                               "-addext", f"subjectAltName={san(addresses)}",
                               "-keyout", str(new_key), "-out", str(new_crt)],
                              capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise ProjectError(f"openssl could not make the front door's certificate: "
                               f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
        new_key.chmod(0o600)
        new_crt.chmod(0o644)
        new_key.replace(key)
        new_crt.replace(crt)
    return True


def render_inventory(sparks: list[Spark], ssh_user: str, secrets: Path, tls: tuple[Path, Path] | None,
                     front_doors: list[str] | None = None, front_door_address: str | None = None,
                     ca: tuple[Path, Path] | None = None, backup_password: Path | None = None) -> str:
    """inventory.py: group `sparks`, the first also in `front_door` (or those `front_doors` names, in that order,
    with their floating address as the group's data), strict host keys, keys from the secrets, the fleet CA's paths;
    an `ssh_user` other than root with pyinfra's `_sudo` (every command, fact and upload escalated by `sudo -n`).

    Every value is validated before it gets here and written as a JSON string, which Python reads the same."""
    q = json.dumps
    sudo = ("" if ssh_user == "root" else
            f"    # {ssh_user} is not root: pyinfra runs every command under `sudo -n` (sudo without a password on\n"
            "    # each Spark: docs/prepare-a-spark.md); `sparkfleet logs` and `doctor` read the host through it too\n"
            "    \"_sudo\": True,\n")
    hosts = "".join(f"    ({q(s.name)}, {{\"ssh_hostname\": {q(s.address)}, **_ssh, **_serving}}),\n" for s in sparks)
    if tls:
        tls_lines = ("    # self-signed by `sparkfleet init`: clients trust the certificate; the key is 0600, outside\n"
                     f"    \"front_door_tls_cert\": {q(str(tls[0]))},\n"
                     f"    \"front_door_tls_key\": {q(str(tls[1]))},\n"
                     f"    \"controller_front_door_ca\": {q(str(tls[0]))},  # what status trusts for it\n")
    else:
        tls_lines = ("    # No certificate (no openssl when `sparkfleet init` ran): the front door speaks plain "
                     "http and\n"
                     "    # refuses users until front_door_tls_cert and front_door_tls_key are set here.\n")
    ca_lines = ("    # the fleet CA (`sparkfleet init`): TLS on every hop to a Spark's guard, so the backend key "
                "never\n"
                "    # crosses the LAN in clear; its key (0600) issues each host's certificate and stays on this "
                "controller\n"
                f"    \"fleet_ca_cert\": {q(str(ca[0]))},\n"
                f"    \"fleet_ca_key\": {q(str(ca[1]))},\n") if ca else ""
    backup_lines = ("    # the office's backup password (0600, shown once by `sparkfleet init`: written down, it and\n"
                    "    # this inventory restore everything on a new controller); backups go to the group `backup`\n"
                    f"    \"controller_backup_password_file\": {q(str(backup_password))},\n") if backup_password else ""
    return f'''"""This office's Sparks (written by `sparkfleet init`).

Every module-level list is a pyinfra group: `sparks`, and `front_door` (the Sparks that run the office's
one URL, https://<front door>:8080/v1). Host keys are checked strictly against known_hosts beside this
file; `sparkfleet hostkeys inventory.py` adds a Spark's key (compare its fingerprint on its console).
The keys (the engines' api_key, each user's) live in {SECRETS_VARIABLE}, outside this project:
`sparkfleet users add inventory.py NAME`. Check with `sparkfleet plan inventory.py`; converge with
`pyinfra inventory.py deploy.py`.
"""

from pathlib import Path as _Path

from sparkfleet.fleet.users import read_secrets as _read_secrets

# A string, not a group (pyinfra ignores it): `sparkfleet users` finds the file here.
{SECRETS_VARIABLE} = {q(str(secrets))}
_secrets = _read_secrets({SECRETS_VARIABLE})

_ssh = {{
    "ssh_user": {q(ssh_user)},
{sudo}    "ssh_strict_host_key_checking": "yes",
    "ssh_known_hosts_file": str(_Path(__file__).resolve().with_name("known_hosts")),
}}

_serving = {{
    "api_host": "0.0.0.0",  # reached by the front door over the LAN...
    "api_key": _secrets["api_key"],  # ...with the key only it (and this controller) holds
    "front_door_users": _secrets["users"],
{tls_lines}{ca_lines}{backup_lines}}}

sparks = [
{hosts}]
{_front_door_group(sparks, front_doors, front_door_address)}{_backup_hint(sparks) if backup_password else ""}'''


def _backup_hint(sparks: list[Spark]) -> str:
    """A commented `backup` group: where the office's backups go (docs/backups.md), off the chat UI's box."""
    return ("# where `sparkfleet backup` and each data host's timer keep the office's data (docs/backups.md): a host\n"
            "# other than the chat UI's, e.g.\n"
            f"# backup = [sparks[{len(sparks) - 1}]]\n")


def _front_door_group(sparks: list[Spark], front_doors: list[str] | None, address: str | None) -> str:
    """The inventory's `front_door` group: the first Spark, or the named ones sharing `address` (keepalived)."""
    if not front_doors:
        return "front_door = sparks[:1]\n"
    names = [s.name for s in sparks]
    members = ", ".join(f"sparks[{names.index(n)}]" for n in front_doors)
    if not address:
        return f"front_door = [{members}]\n"
    return (f"# the doors share one address (keepalived): clients use https://{address.split('/')[0]}:8080/v1\n"
            f"front_door = ([{members}], {{\"front_door_address\": {json.dumps(address)}}})\n")


@dataclass
class InitReport:
    project: Path
    secrets: Path
    secrets_reused: bool
    tls: tuple[Path, Path] | None
    hosts: list[HostKey] = field(default_factory=list)
    backup_password_file: Path | None = None
    backup_password: str | None = field(default=None, repr=False)  # made now: shown once on the terminal, never JSON

    def to_dict(self) -> dict:
        """What `init --json` prints: the backup password's file and whether it is new, never the password (JSON
        output is kept by scripts and logs; the person reads the 0600 file once to write it down)."""
        return {"project": str(self.project), "secrets": str(self.secrets), "secrets_reused": self.secrets_reused,
                "tls": {"cert": str(self.tls[0]), "key": str(self.tls[1])} if self.tls else None,
                "backup_password_file": str(self.backup_password_file) if self.backup_password_file else None,
                "backup_password_new": self.backup_password is not None,
                "hosts": [h.to_dict() for h in self.hosts]}


def init_project(project: Path, sparks: list[Spark], ssh_user: str = "root", secrets: Path | None = None,
                 force: bool = False, timeout_s: float = KEYSCAN_TIMEOUT_S, front_doors: list[str] | None = None,
                 front_door_address: str | None = None) -> InitReport:
    """Check everything, then write the project, the secrets and the certificate; then collect host keys."""
    if not sparks:
        raise ProjectError("give the Sparks: --host NAME=ADDRESS (once per Spark)")
    front_doors = list(front_doors or [])
    unknown = [n for n in front_doors if n not in {s.name for s in sparks}]
    if unknown:
        raise ProjectError(f"--front-door {unknown[0]!r} is no --host: name one of the Sparks given")
    if len(set(front_doors)) < len(front_doors):
        raise ProjectError("--front-door names repeat: name each door once")
    if len(front_doors) > 1 and not front_door_address:
        raise ProjectError(f"{len(front_doors)} front doors need the address they share: give --front-door-address "
                           "CIDR (a free address in the Sparks' subnet, e.g. 10.0.0.100/24)")
    if front_door_address:
        _valid(FloatingAddress, front_door_address, "--front-door-address")
        taken = [s.name for s in sparks if s.address == front_door_address.split("/")[0]]
        if taken:
            raise ProjectError(f"--front-door-address {front_door_address} is {taken[0]}'s own address: choose a "
                               "free address in the Sparks' subnet")
    seen = [s.name for s in sparks]
    if len(set(seen)) < len(seen):
        raise ProjectError(f"--host names repeat ({', '.join(sorted({n for n in seen if seen.count(n) > 1}))}): "
                           "give each Spark its own name")
    _valid(Name, ssh_user, "--ssh-user")
    if project.exists() and not project.is_dir():
        raise ProjectError(f"{project} is a file: give a new or empty directory")
    if project.is_dir() and any(project.iterdir()) and not force:
        raise ProjectError(f"{project} is not empty: give a new directory, or --force to rewrite inventory.py, "
                           "deploy.py and group_data/all.py there (other files and the secrets are kept)")
    secrets = (secrets.expanduser().resolve() if secrets else default_secrets(project))
    check_secrets_place(secrets, project)
    crt, key = tls_paths(secrets)
    ca = ca_paths(secrets)
    backup_password = password_file_beside(secrets)
    for path in (secrets, crt, key, *ca, backup_password):
        _valid(AbsPath, str(path), "the secrets' path (choose another with --secrets)")
    reused = secrets.exists()
    if reused and not force:
        raise ProjectError(f"a secrets file exists at {secrets}: --force reuses it (its keys stay), or give "
                           "--secrets with a new path")
    doc = read_secrets(secrets) if reused else new_secrets()

    # the certificate names the floating address too: clients reach the doors there
    names = [s.address for s in sparks] + ([front_door_address.split("/")[0]] if front_door_address else [])
    tls = (crt, key) if self_signed(crt, key, names) else None
    try:  # kept where one exists (--force on an existing office adds one where there is none)
        write_ca(*ca)
    except PkiError as exc:
        raise ProjectError(str(exc)) from None
    if not reused:
        write_secrets(secrets, doc)
    password = new_password_file(backup_password)  # kept where one exists (--force adds one where there is none)
    (project / "group_data").mkdir(parents=True, exist_ok=True)
    (project / "inventory.py").write_text(render_inventory(sparks, ssh_user, secrets, tls, front_doors,
                                                           front_door_address, ca, backup_password))
    (project / "deploy.py").write_text(DEPLOY_PY)
    (project / "group_data" / "all.py").write_text(GROUP_DATA_ALL)
    report = InitReport(project, secrets, reused, tls, backup_password_file=backup_password,
                        backup_password=password)
    report.hosts = collect_host_keys(project / "known_hosts", sparks, timeout_s)
    return report


# --- SSH host keys ----------------------------------------------------------------------------------


@dataclass
class HostKey:
    """One Spark's key in a known_hosts file: already there, added now (with its fingerprints), or no answer."""

    spark: Spark
    state: str  # "known" | "added" | "no answer"
    fingerprints: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"host": self.spark.name, "address": self.spark.address, "port": self.spark.port,
                "state": self.state, "fingerprints": self.fingerprints}


def known_hosts_name(spark: Spark) -> str:
    """How known_hosts (and ssh-keyscan) name a host: `address`, or `[address]:port` off port 22."""
    return spark.address if spark.port == SSH_PORT else f"[{spark.address}]:{spark.port}"


def is_known(known_hosts: Path, spark: Spark) -> bool:
    """Whether known_hosts holds a key for the host (ssh-keygen -F also reads hashed entries)."""
    if not known_hosts.exists():
        return False
    return subprocess.run(["ssh-keygen", "-F", known_hosts_name(spark), "-f", str(known_hosts)],
                          capture_output=True, timeout=30).returncode == 0


def keyscan_argv(spark: Spark, timeout_s: float = KEYSCAN_TIMEOUT_S) -> list[str]:
    """ssh-keyscan of one host's key, its address after `--` (an inventory name is never read as an option)."""
    return ["ssh-keyscan", "-T", str(int(timeout_s)), "-t", KEY_TYPE, "-p", str(int(spark.port)), "--", spark.address]


def keyscan(spark: Spark, timeout_s: float = KEYSCAN_TIMEOUT_S) -> list[str]:
    """The host's known_hosts lines from ssh-keyscan; [] when it does not answer. Only well-formed lines for
    this very host are kept: what a host sends is data."""
    try:
        proc = subprocess.run(keyscan_argv(spark, timeout_s), capture_output=True, text=True, timeout=timeout_s + 10)
    except subprocess.TimeoutExpired:
        return []
    name = known_hosts_name(spark)
    return [line for line in proc.stdout.splitlines()
            if (m := _KEY_LINE.fullmatch(line.strip())) and m.group(1) == name]


def fingerprints(lines: list[str]) -> list[str]:
    """`SHA256:... (ED25519)` per key line, as `ssh-keygen -lf` on the Spark's console prints them."""
    proc = subprocess.run(["ssh-keygen", "-lf", "-"], input="\n".join(lines) + "\n", capture_output=True,
                          text=True, timeout=30)
    found = []
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1].startswith("SHA256:"):
            found.append(f"{parts[1]} {parts[-1]}")
    return found


def collect_host_keys(known_hosts: Path, sparks: list[Spark],
                      timeout_s: float = KEYSCAN_TIMEOUT_S) -> list[HostKey]:
    """Scan the hosts whose key known_hosts lacks (in parallel), append what answered, and say per host."""
    known_hosts.parent.mkdir(parents=True, exist_ok=True)
    known_hosts.touch(exist_ok=True)  # strict checking needs the file, even before the first key
    missing = [s for s in sparks if not is_known(known_hosts, s)]
    with ThreadPoolExecutor(max_workers=min(8, len(missing) or 1)) as pool:
        scanned = dict(zip(missing, pool.map(lambda s: keyscan(s, timeout_s), missing), strict=True))
    lines = [line for s in missing for line in scanned[s]]
    if lines:
        with known_hosts.open("a") as f:
            f.write("".join(line + "\n" for line in lines))
    return [HostKey(s, "known") if s not in scanned else
            HostKey(s, "added", fingerprints(scanned[s])) if scanned[s] else HostKey(s, "no answer")
            for s in sparks]


def host_key_targets(hosts: list[tuple[str, dict]]) -> tuple[dict[Path, list[Spark]], list[str]]:
    """An inventory's hosts by the known_hosts file each checks against; and the hosts that name none."""
    targets: dict[Path, list[Spark]] = {}
    unchecked = []
    for name, data in hosts:
        path = data.get("ssh_known_hosts_file")
        if not path:
            unchecked.append(name)
            continue
        spark = Spark(name, ssh_address(name, data), ssh_port(name, data) or SSH_PORT)
        targets.setdefault(Path(path).expanduser(), []).append(spark)
    return targets, unchecked


def host_key_lines(results: list[HostKey]) -> list[str]:
    """What `init` and `hostkeys` print per host."""
    lines = []
    for r in results:
        where = f"{r.spark.name} ({known_hosts_name(r.spark)})"
        if r.state == "added":
            lines += [f"  {where}: {fp}" for fp in r.fingerprints] or [f"  {where}: key added (no fingerprint)"]
        elif r.state == "known":
            lines.append(f"  {where}: already in known_hosts")
        else:
            lines.append(f"  {where}: did not answer: once it is up, run `sparkfleet hostkeys` on the inventory")
    if any(r.state == "added" for r in results):
        lines.append(f"compare each fingerprint with `{CONSOLE_CHECK}` on that Spark's console; delete the line "
                     "of any that differs from known_hosts and find out why")
    return lines

