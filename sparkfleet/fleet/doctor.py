"""`sparkfleet doctor`: is each host ready for sparkfleet? Read-only, per host, every step under a timeout.

One OpenSSH run per host (contract/reach.py `ssh_command`: the inventory's user, port, key and known_hosts, with the
host key checked strictly and never written, no prompt) runs one read-only script that prints what preflight reads
(who it runs as and whether sudo works without a password, the clock, free disk at the model root, Docker, the GPU
through nvidia-smi, the host's fleet certificate); the controller then asks the host's guard and, on a front door,
the door over HTTP(S) (fleet/tls.py's client, as `status` asks them) and reads the door's certificate.

The judging is pure (`judge_*`, `clock_skew`, `days_left`): each returns a `Check`, the table's cell and, where
something is wrong, the problem and its fix in words. Nothing is changed on a host or on the controller.
"""

from __future__ import annotations

import datetime as dt
import shlex
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

from sparkfleet.contract import paths
from sparkfleet.contract.reach import front_door_url, ssh_address, ssh_command, ssh_port
from sparkfleet.contract.settings import Settings
from sparkfleet.host.facts import DockerState, FreeBytes, Unreadable, parse_docker_version, parse_free_bytes
from sparkfleet.host.nvidia_smi import GpuReport, at_least, parse_nvidia_smi
from sparkfleet.host.preflight import SERVICE_DISK_PATH, disk_text
from sparkfleet.tables import clean

CONNECT_S = 5  # OpenSSH's ConnectTimeout for the doctor: the TCP connect and the SSH banner
REMOTE_S = 40  # the whole SSH run: connect, log in, the script (its slow steps each under `timeout` on the host)
HTTP_S = 5  # each request to a guard or a door, and the door's TLS handshake
MAX_SKEW_S = 2.0  # a host's clock this far from the controller's is a problem (certificates, Ray, the logs' order)
CERT_DAYS = 14  # a certificate ending within this many days is a problem (the alert's TlsCertificateExpiring)
SPARK_DISK_MIN = 20 * 1024**3  # free at the model root below this: no room for a model's files
SERVICE_DISK_MIN = 1024**3  # free at / on a service host below this: Prometheus's history, the packages
HOST_KEYS_DOC = "docs/ssh-host-keys.md"

COLUMNS = {"ssh": "SSH", "host_key": "host key", "user": "user", "docker": "Docker", "disk": "disk free",
           "clock": "clock", "gpu": "GPU, driver", "guard": "guard", "door": "door", "certificates": "certificates"}


@dataclass(frozen=True)
class Check:
    """One cell of the doctor's table; `problem` and `fix` where something is wrong (words, never markup)."""

    cell: str
    problem: str | None = None
    fix: str | None = None


NOT_CHECKED = Check("-")


def bad(cell: str, problem: str, fix: str) -> Check:
    return Check(cell, problem, fix)


# --- the pure judges -----------------------------------------------------------------------------------------------


def ssh_failure(stderr: str, code: int | None, address: str, port: int) -> dict[str, Check]:
    """What an ssh run that did not get to run the script says, in words: {"ssh": ..., and "host_key" where the
    host answered but its key is not the one known}. `code` None: it ran past REMOTE_S."""
    text = stderr.lower()
    where = f"{address} port {port}"
    if code is None:
        return {"ssh": bad("no answer", f"no answer within {REMOTE_S} s",
                           "is the host up? log in by hand once (`ssh`) to see where it stops")}
    if "host key verification failed" in text or "remote host identification has changed" in text:
        if "has changed" in text:
            key = bad("CHANGED", f"{where} presents another key than its known_hosts line",
                      f"if the host was reinstalled, remove its line (ssh-keygen -R) and run `sparkfleet hostkeys`; "
                      f"else find out why first ({HOST_KEYS_DOC})")
        else:
            key = bad("not known", f"no known_hosts line for {where}",
                      f"run `sparkfleet hostkeys INVENTORY` and check the fingerprint on the host ({HOST_KEYS_DOC})")
        return {"ssh": Check("answers"), "host_key": key}
    rules = (  # (what ssh said, the problem in words, the fix); the cell is the problem's first words
        ("permission denied", "login refused",
         "put the controller's public key in the user's ~/.ssh/authorized_keys on the host, or fix ssh_user / "
         "ssh_key in the inventory"),
        ("connection refused", "connection refused", f"start sshd on the host, or fix ssh_hostname / ssh_port "
                                                     f"(now {where})"),
        ("during banner exchange", "accepts TCP but sends no SSH banner",
         f"is {where} the SSH server? fix ssh_port / ssh_hostname"),
        ("could not resolve hostname", "name not resolved", "set ssh_hostname to the host's address"),
        ("no route to host", "no route to host", "is the host on this network? check ssh_hostname"),
        ("network is unreachable", "network unreachable", "is the controller on the hosts' network?"),
        ("timed out", "timed out", f"is the host up and {where} reachable from here? check ssh_hostname"),
        ("kex_exchange_identification", "answers, but not as an SSH server",
         f"is {where} the SSH server? fix ssh_port / ssh_hostname"),
        ("connection reset", "answers, but not as an SSH server",
         f"is {where} the SSH server? fix ssh_port / ssh_hostname"),
        ("connection closed", "answers, but not as an SSH server",
         f"is {where} the SSH server? fix ssh_port / ssh_hostname"),
    )
    short = {"accepts TCP but sends no SSH banner": "no SSH banner", "answers, but not as an SSH server": "not SSH"}
    for needle, words, fix in rules:
        if needle in text:
            return {"ssh": bad(short.get(words, words), words, fix)}
    last = next((line for line in reversed(stderr.splitlines()) if line.strip()), "")
    said = f": {clean(last.strip(), 160)}" if last.strip() else ""
    return {"ssh": bad("failed", f"ssh failed (exit {code}){said}", "log in by hand once (`ssh`) to see why")}


def judge_user(user: str, uid: str, privilege: str, data: dict) -> Check:
    """root, or a user whose sudo needs no password with `_sudo` set in the inventory (pyinfra's sudo)."""
    name = clean(user or "?", 40)
    if uid == "0":
        return Check(name if name == "root" else f"{name} (uid 0)")
    if not data.get("_sudo"):
        return bad(name, f"logged in as {name}, not root, and the inventory sets no `_sudo`",
                   "set `_sudo = True` for the host in the inventory (or log in as root)")
    if privilege == "sudo":
        return Check(f"{name} (sudo)")
    if data.get("_sudo_password"):
        return Check(f"{name} (sudo, with _sudo_password)")
    return bad(name, f"sudo asks {name} for a password",
               f"allow {name} sudo without a password on the host (a file in /etc/sudoers.d), or set _sudo_password")


def judge_docker(state_lines: list[str], version_line: str) -> Check:
    """Docker installed, its service active, its daemon answering (as root, or through sudo)."""
    state = DockerState().process(state_lines)
    if not state["installed"]:
        return bad("not installed", "Docker is not installed", "install Docker (DGX OS ships it)")
    if not state["active"]:
        return bad("inactive", "docker.service is not active", "systemctl enable --now docker")
    version = parse_docker_version([version_line])
    if isinstance(version, Unreadable):
        return bad("no answer", "the Docker daemon did not answer `docker version`",
                   "check `systemctl status docker` on the host (and that the user is root or has sudo)")
    return Check(f"{version[0]}.{version[1]}")


def judge_disk(free: int | Unreadable, path: str, minimum: int) -> Check:
    """Free bytes at `path` (the model root on a Spark, / on a service host) against `minimum`."""
    if isinstance(free, Unreadable):
        return bad("?", f"free space at {path} unreadable", f"check `df {path}` on the host")
    cell = disk_text(free)  # the path is the model root's (docs/doctor.md), named in a problem
    if free < minimum:
        return bad(cell, f"only {disk_text(free)} free at {path} (under {disk_text(minimum)})",
                   "free space there (old models under model_root), or set model_root to a larger disk")
    return Check(cell)


def clock_skew(host_time: float, sent: float, received: float) -> float:
    """How far the host's clock is outside the controller's window [sent, received] (the ssh run's start and end):
    positive when ahead, negative when behind, 0 inside (the run's own length is no skew)."""
    if host_time > received:
        return host_time - received
    if host_time < sent:
        return host_time - sent
    return 0.0


def judge_clock(host_time: float | None, sent: float, received: float, max_s: float = MAX_SKEW_S) -> Check:
    if host_time is None:
        return bad("?", "the host's clock was not read", "check `date +%s` on the host")
    skew = clock_skew(host_time, sent, received)
    cell = f"{skew:+.1f} s"
    if abs(skew) > max_s:
        side = "ahead of" if skew > 0 else "behind"
        return bad(cell, f"clock {abs(skew):.1f} s {side} the controller's (more than {max_s:g} s)",
                   "turn on time sync on the host and the controller (timedatectl set-ntp true)")
    return Check(cell)


def days_left(end: str | None, today: dt.date) -> int | None:
    """Days from `today` to a certificate's end ("YYYY-MM-DD", roles/pki.py `ends`); None when there is none."""
    if not end:
        return None
    return (dt.date.fromisoformat(end) - today).days


def judge_days(what: str, days: int | None, fix: str, needed: bool, limit: int = CERT_DAYS) -> tuple[str, str | None]:
    """(cell part, problem with its fix) of one certificate; missing is a problem only where one is `needed` (the
    host was converged)."""
    if days is None:
        return f"{what} none", (f"{what} certificate missing: {fix}" if needed else None)
    if days < 0:
        return f"{what} expired", f"{what} certificate expired {-days} days ago: {fix}"
    if days < limit:
        return f"{what} {days} d", f"{what} certificate ends in {days} days: {fix}"
    return f"{what} {days} d", None


def judge_certificates(parts: list[tuple[str, str | None]]) -> Check:
    """The certificates' one cell (each `judge_days`), its problems joined."""
    if not parts:
        return NOT_CHECKED
    problems = [p for _, p in parts if p]
    cell = ", ".join(c for c, _ in parts)
    return Check(cell, "; ".join(problems)) if problems else Check(cell)


def judge_gpu(report: GpuReport, s: Settings) -> Check:
    """nvidia-smi sees the GPU and a driver no older than `min_driver_version`."""
    if report.error or not report.driver:
        return bad("not seen", f"nvidia-smi: {clean(report.error or 'no driver version', 120)}",
                   "install the NVIDIA driver (DGX OS ships it) and reboot")
    cell = f"{clean(report.name or '?', 40)}, driver {clean(report.driver, 20)}"
    if not at_least(report.driver, s.min_driver_version):
        return bad(cell, f"driver {report.driver} is older than min_driver_version {s.min_driver_version}",
                   "upgrade the driver (apt upgrade on DGX OS) and reboot")
    return Check(cell)


def judge_http(what: str, code: int | None, words: str | None, converged: bool | None, fix_tls: str) -> Check:
    """A guard's or a door's /health: any HTTP answer means it answers; 200 that what is behind it serves. Before
    the first converge there is nothing to answer: not a problem; `converged` None (SSH did not say): the words
    alone, SSH's problem comes first."""
    if converged is None:
        return Check("answers" if code == 200 else f"HTTP {code}" if code else str(words))
    if code is None:
        if not converged:
            return Check(f"not converged yet ({words})")
        fix = fix_tls if (words or "").startswith("TLS") else f"converge the host; `sparkfleet logs INVENTORY HOST " \
                                                              f"--unit {what}` says why it stopped"
        return bad(words or "no answer", f"the {what} does not answer: {words}", fix)
    if code == 200:
        return Check("answers")
    if not converged:
        return Check(f"answers HTTP {code}")
    return bad(f"HTTP {code}", f"the {what} answers HTTP {code}: nothing healthy behind it",
               "`sparkfleet status INVENTORY` says which engine is down")


# --- reading a host --------------------------------------------------------------------------------------------------


def script(model_root: str | None) -> str:
    """The read-only script run on the host: sections `@@NAME`, then lines. Slow steps each under `timeout`.
    `model_root` None: a service host (no GPU, no Docker; free disk at /)."""
    disk = FreeBytes().command(model_root or SERVICE_DISK_PATH)
    lines = [
        "echo @@user; id -un; id -u",
        'if [ "$(id -u)" = 0 ]; then S=""; echo root; elif sudo -n true 2>/dev/null; then S="sudo -n"; echo sudo; '
        'else S=""; echo none; fi',
        "echo @@time; date +%s.%N",
        f"echo @@disk; {disk}",
        f"echo @@converged; test -e {shlex.quote(paths.RELEASE_FILE if model_root else paths.TLS_HOST_CERT)} "
        "&& echo yes || echo no",
        f"echo @@cert; head -c 20000 {shlex.quote(paths.TLS_HOST_CERT)} 2>/dev/null; echo",
    ]
    if model_root:
        lines += [
            f"echo @@docker; {DockerState().command()}",
            "echo @@docker_version; $S timeout 10 docker version --format '{{.Server.Version}}' 2>&1 | head -n 1",
            "echo @@gpu; if command -v nvidia-smi >/dev/null; then timeout 15 nvidia-smi 2>&1 | head -n 40; "
            "else echo 'nvidia-smi: not found'; fi",
        ]
    return "\n".join([*lines, "echo @@end"])


def sections(stdout: str) -> dict[str, list[str]]:
    """The script's output by section (`@@NAME` lines); lines before the first section are dropped."""
    found: dict[str, list[str]] = {}
    current = None
    for line in stdout.splitlines():
        if line.startswith("@@") and line[2:].isidentifier():
            current = line[2:]
            found[current] = []
        elif current is not None:
            found[current].append(line)
    return found


def ssh_argv(name: str, data: dict, remote: str) -> list[str]:
    """ssh to the host with the inventory's settings (contract/reach.py), strict about its key and writing no
    known_hosts line, no prompt (options first: OpenSSH keeps the first value), running `remote` under sh."""
    options = ("-o", f"ConnectTimeout={CONNECT_S}", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
               "-o", "UpdateHostKeys=no", "-T")
    return [*ssh_command(name, data, *options), f"sh -c {shlex.quote(remote)}"]


def run_ssh(argv: list[str], timeout_s: float = REMOTE_S) -> tuple[int | None, str, str]:
    """(exit code, stdout, stderr) of ssh; code None when it ran past `timeout_s` (killed)."""
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None, "", ""
    except FileNotFoundError:
        return 127, "", "ssh: not found: install OpenSSH's client on the controller"
    decode = lambda b: (b or b"").decode("utf-8", errors="replace")  # noqa: E731
    return done.returncode, decode(done.stdout), decode(done.stderr)


def host_checks(name: str, data: dict, s: Settings, spark: bool, today: dt.date, run=run_ssh,
                tls: bool = True) -> dict:
    """What SSH tells of one host: its checks by column (`COLUMNS`, less the guard and the door) and whether it was
    converged already (its release record, or a service host's certificate). `tls`: the fleet's hops are TLS
    (roles/pki.py `hosts_ca`), so a converged host holds a fleet certificate."""
    from sparkfleet.roles.pki import ends

    port = ssh_port(name, data) or 22
    argv = ssh_argv(name, data, script(s.model_root if spark else None))
    sent = time.time()
    code, out, err = run(argv)
    received = time.time()
    found = sections(out)
    if code is None or "end" not in found:
        return {"checks": ssh_failure(err, code, ssh_address(name, data), port), "converged": None}
    checks: dict[str, Check] = {"ssh": Check("answers")}
    strict = str(data.get("ssh_strict_host_key_checking") or "").lower() == "yes"
    checks["host_key"] = Check("known") if strict else bad(
        "known, not enforced", "the inventory does not set ssh_strict_host_key_checking = \"yes\": pyinfra accepts "
        "any new key", f"set it and ssh_known_hosts_file in the inventory ({HOST_KEYS_DOC})")
    user = found.get("user", [])
    checks["user"] = judge_user(*(user + ["", "", ""])[:3], data)
    try:
        host_time = float(found.get("time", [""])[0])
    except (ValueError, IndexError):
        host_time = None
    checks["clock"] = judge_clock(host_time, sent, received)
    path = s.model_root if spark else SERVICE_DISK_PATH
    checks["disk"] = judge_disk(parse_free_bytes(found.get("disk", []), path), path,
                                SPARK_DISK_MIN if spark else SERVICE_DISK_MIN)
    if spark:
        checks["docker"] = judge_docker(found.get("docker", []), (found.get("docker_version") or [""])[0])
        checks["gpu"] = judge_gpu(parse_nvidia_smi("\n".join(found.get("gpu", []))), s)
    converged = (found.get("converged") or [""])[0] == "yes"
    end = ends("\n".join(found.get("cert", [])))
    cert = judge_days("host", days_left(end, today), "converge the host (it re-issues 30 days before the end)",
                      converged and tls)
    return {"checks": checks, "converged": converged, "certificate": cert}


def http_status(session, url: str, verify=True) -> tuple[int | None, str | None]:
    """(HTTP status, None) of GET url, or (None, why in words)."""
    import requests

    from sparkfleet.fleet.status import in_words

    try:
        return (session or requests).get(url, timeout=HTTP_S, verify=verify).status_code, None
    except requests.RequestException as exc:
        return None, in_words(exc)


def served_certificate_end(url: str) -> str | None:
    """When the certificate a TLS port serves ends ("YYYY-MM-DD"), read without trusting it; None: none read."""
    import ssl
    from urllib.parse import urlsplit

    from sparkfleet.roles.pki import ends

    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.hostname:
        return None
    try:
        pem = ssl.get_server_certificate((parts.hostname, parts.port or 443), timeout=HTTP_S)
    except (OSError, ValueError):
        return None
    return ends(pem)


def doctor_row(name: str, data: dict, s: Settings, spark: bool, door: bool, client, asks_guard: bool,
               today: dt.date, run=run_ssh) -> dict:
    """One host's row: {"host", "role", "checks": {column: Check}}."""
    found = host_checks(name, data, s, spark, today, run, tls=bool(client is not None and client.tls))
    checks = {column: found["checks"].get(column, NOT_CHECKED) for column in COLUMNS}
    converged = found["converged"]
    no_certificate = found.get("certificate", ("", None))[0].endswith(" none") and not (client and client.tls)
    parts = [found["certificate"]] if "certificate" in found and not no_certificate else []
    if spark and asks_guard and client is not None:
        url = client.url(name, s, data)
        code, words = http_status(client.session, url + "/health")
        checks["guard"] = judge_http("guard", code, words, converged,
                                     "the guard's certificate is the fleet CA's: converge the host (sparkfleet "
                                     "rollout) to re-issue it")
    if door:
        url = front_door_url(name, s, data)
        code, words = http_status(None, url + "/health", verify=s.controller_front_door_ca or True)
        checks["door"] = judge_http("front-door", code, words, converged,
                                    "set controller_front_door_ca to the door's certificate (or the office's CA) "
                                    "so the controller trusts it")
        if url.startswith("https://"):
            parts.append(judge_days("door", days_left(served_certificate_end(url), today),
                                    "renew front_door_tls_cert and converge the door", converged))
    checks["certificates"] = judge_certificates(parts) if parts else checks["certificates"]
    return {"host": name, "role": "spark" if spark else "service", "checks": checks}


def problems(rows: list[dict]) -> list[str]:
    """One line per problem: the host, what, the fix."""
    return [f"{row['host']}: {COLUMNS[column]}: {check.problem}" + (f": {check.fix}" if check.fix else "")
            for row in rows for column, check in row["checks"].items() if check.problem]


def doctor(hosts: list[tuple[str, dict]], settings: dict[str, Settings], spark: dict[str, bool],
           doors: set[str], client, guard_asked: dict[str, bool], today: dt.date | None = None,
           run=run_ssh) -> list[dict]:
    """Every host's row, in inventory order; the hosts asked at once (each under its own timeouts)."""
    today = today or dt.datetime.now(dt.timezone.utc).date()
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(hosts)))) as pool:
        futures = [pool.submit(doctor_row, name, data, settings[name], spark[name], name in doors, client,
                               guard_asked.get(name, False), today, run) for name, data in hosts]
        return [f.result() for f in futures]


def row_json(row: dict) -> dict:
    return {**row, "checks": {column: asdict(check) for column, check in row["checks"].items()}}


def table_cells(rows: list[dict]) -> list[tuple[str, ...]]:
    """The table's cells: each check's words, red where it is a problem (text, never markup)."""
    from sparkfleet.tables import literal

    def cell(check: Check) -> str:
        return f"[red]{literal(check.cell, 60)}[/]" if check.problem else literal(check.cell, 60)
    return [(literal(row["host"]), *(cell(row["checks"][c]) for c in COLUMNS)) for row in rows]
