"""Custom pyinfra facts, and the plain parsers behind them: each reads one thing from a host and
changes nothing. What a host prints is data: a parser that does not understand it returns an
`Unreadable` naming what it read and why, never a guess (and nothing is deleted on doubt).

Where pyinfra 3.10 has the fact (files.FileContents, files.Sha256File, docker.DockerImage,
server.Arch), sparkfleet uses it; a custom fact here says in its docstring what it adds.
"""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
from dataclasses import dataclass

from pyinfra.api import FactBase, QuoteString, StringCommand
from pyinfra.facts.docker import DockerImage
from pyinfra.facts.gpg import GpgFactBase

from sparkfleet.contract import paths
from sparkfleet.contract.shared import docker
from sparkfleet.host.nvidia_smi import GpuReport, parse_nvidia_smi
from sparkfleet.host.state import fact


@dataclass(frozen=True)
class Unreadable:
    """Host output a parser does not understand: `source` is the file or command read."""

    source: str
    problem: str

    def line(self, host: str) -> str:
        return f"{host}: {self.source}: {self.problem}: fix or remove it by hand; sparkfleet changes nothing on doubt"


@dataclass(frozen=True)
class JsonObject:
    """A JSON file that must hold an object: `value` is None when the file is absent."""

    path: str
    value: dict | None = None
    unreadable: Unreadable | None = None

    @property
    def absent(self) -> bool:
        return self.value is None and self.unreadable is None


def json_object(path: str, text: str | None) -> JsonObject:
    """Parse a host file that must hold a JSON object; anything else is unreadable, not absent."""
    if text is None:
        return JsonObject(path)
    try:
        value = json.loads(text)
    except ValueError as exc:
        return JsonObject(path, unreadable=Unreadable(path, f"not valid JSON ({exc})"))
    if not isinstance(value, dict):
        return JsonObject(path, unreadable=Unreadable(path, f"holds a JSON {type(value).__name__}, not an object"))
    return JsonObject(path, value)


class JsonFile(FactBase[str]):
    """A file's text; None when absent. pyinfra's FileContents reads an empty file as absent
    (no output), and a truncated release record must not read as "no release": this fact
    prints a marker line first, so an empty file is "" here. Parse it with `json_object`."""

    MARKER = "@@sparkfleet-file"

    def command(self, path):
        return StringCommand("if [ -e", QuoteString(path), "]; then echo", self.MARKER, "&& cat", QuoteString(path),
                             "; fi")

    def process(self, output):
        if not output or output[0] != self.MARKER:
            return None
        return "\n".join(output[1:])


class DockerImageState(DockerImage):
    """What pyinfra's DockerImage reads (`docker image inspect REF`: a list, [] when Docker has no such image),
    asked of Docker's API over its socket with curl where curl is installed: the docker CLI, a Go binary, costs a
    host about 60 ms of CPU a call and curl a few, and the batched read asks on every converge. The same socket
    the CLI would use (DOCKER_HOST when it names a unix socket); the CLI where it names anything else."""

    def command(self, object_id):
        url = QuoteString(f"http://docker/images/{object_id}/json")
        return StringCommand(
            f"sock=${{DOCKER_HOST:-unix://{docker.DOCKER_SOCKET}}}; case $sock in unix://*)"
            " command -v curl >/dev/null && curl -sS --max-time 15 --unix-socket \"${sock#unix://}\"", url,
            "&& exit 0;; esac;", super().command(shlex.quote(object_id)))

    def process(self, output):
        found = super().process(output)
        if isinstance(found, dict):  # the API's answer: the image itself, or {"message": "No such image: ..."}
            return [found] if "Id" in found else []
        return found


def image_read(ref: str) -> tuple:
    """The engine image's fact and its arguments: the one key preflight's round trip and the stages' checks
    share."""
    return DockerImageState, {"object_id": ref}


def docker_image(host, ref: str) -> list | None:
    """`docker image inspect ref` as DockerImageState reads it, held like every stage read (state.fact)."""
    cls, kwargs = image_read(ref)
    return fact(host, cls, **kwargs)


def read_json_object(host, path: str) -> JsonObject:
    return json_object(path, fact(host, JsonFile, path=path))


RELEASE_KEYS = {"release_id": str, "model_dir": str, "served_model_name": str, "api_host": str, "api_port": int,
                "engine_port": int, "health_timeout_s": int, "tools": bool}


def release_problem(record: dict, source: str) -> Unreadable | None:
    """What the rollback needs from a release record, each key of its type (an older or
    hand-edited record may lack them: then nothing is swapped)."""
    missing = [key for key, kind in RELEASE_KEYS.items()
               if not isinstance(record.get(key), kind) or (kind is int and isinstance(record.get(key), bool))]
    if missing == ["engine_port"]:
        return Unreadable(source, "the kept release predates the guard (its engine would bind the API port the "
                                  "guard listens on): converge the release you want instead of rolling back")
    if missing:
        return Unreadable(source, f"the release record lacks {', '.join(missing)} (written by an older sparkfleet?)")
    return None


def history_problem(release: JsonObject) -> Unreadable | None:
    """The cleanup keeps what the record lists: a history that is not a list of paths keeps nothing."""
    record = release.value or {}
    history, previous = record.get("model_history", []), record.get("previous")
    if not (isinstance(history, list) and all(isinstance(d, str) for d in history)):
        return Unreadable(release.path, "`model_history` is not a list of directories")
    if previous is not None and not (isinstance(previous, dict) and isinstance(previous.get("model_dir"), str)):
        return Unreadable(release.path, "`previous` is not a release record with a model_dir")
    return None


class NvidiaSmi(FactBase[GpuReport]):
    """GPU name, driver and CUDA version from the nvidia-smi table (pyinfra has no GPU fact)."""

    def command(self):
        return "command -v nvidia-smi >/dev/null && nvidia-smi 2>&1 || echo 'nvidia-smi: not found or failed'"

    def process(self, output):
        return parse_nvidia_smi("\n".join(output))


def parse_meminfo(lines: list[str]) -> dict | Unreadable:
    """/proc/meminfo in kB; a line that is not `Key: <number> [kB]` is unreadable."""
    values = {}
    for line in lines:
        if not line.strip():
            continue
        match = re.fullmatch(r"([\w()]+):\s+(\d+)(?: kB)?\s*", line)
        if not match:
            return Unreadable("/proc/meminfo", f"line {line[:60]!r} is not `Key: <number> kB`")
        values[match[1]] = int(match[2])
    if "MemTotal" not in values:
        return Unreadable("/proc/meminfo", "no MemTotal line")
    return values


class MemInfo(FactBase):
    """/proc/meminfo in kB (nvidia-smi reports no memory on unified-memory GB10); pyinfra's
    server.Memory gives MemTotal only, in MB, and no unreadable result."""

    def command(self):
        return "cat /proc/meminfo"

    def process(self, output):
        return parse_meminfo(output)


def parse_free_bytes(lines: list[str], path: str) -> int | Unreadable:
    """The `Available` column of `df -P -B1` (a network file system may print `-`)."""
    text = lines[0].strip() if lines else ""
    if not text.isdigit():
        return Unreadable(f"df {path}", f"free bytes read {text[:40]!r}, not a number")
    return int(text)


class FreeBytes(FactBase):
    """Free bytes on the file system that holds `path` (or its nearest existing parent): the
    model root may not exist yet, and pyinfra has no free-space fact."""

    def command(self, path):
        self.path = path
        return (f'p={shlex.quote(path)}; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; '
                "df -P -B1 \"$p\" | awk 'NR==2 {print $4}'")

    def process(self, output):
        return parse_free_bytes(output, self.path)


class DockerState(FactBase[dict]):
    """Whether the Docker CLI exists and docker.service is active (anything else reads as no)."""

    def command(self):
        return ("printf 'installed=%s\\n' \"$(command -v docker >/dev/null && echo yes || echo no)\"; "
                "printf 'active=%s\\n' \"$(systemctl is-active docker 2>/dev/null || true)\"")

    def process(self, output):
        values = dict(line.split("=", 1) for line in output if "=" in line)
        return {"installed": values.get("installed") == "yes", "active": values.get("active") == "active"}


def parse_docker_version(lines: list[str]) -> tuple[int, int] | Unreadable:
    """The daemon's (major, minor) from `docker version --format {{.Server.Version}}`: "28.1.1" and
    Debian's "20.10.24+dfsg1" read as (28, 1) and (20, 10); anything else (a daemon that did not answer) is
    unreadable."""
    text = lines[0].strip() if lines else ""
    match = re.fullmatch(r"(\d+)\.(\d+)(?:[.+~-][\w.+~-]*)?", text)
    if not match:
        return Unreadable("docker version (the daemon's)", f"reads {text[:60]!r}, not a version")
    return int(match[1]), int(match[2])


class DockerServerVersion(FactBase):
    """The Docker daemon's version, which decides how it takes CDI devices. pyinfra's DockerVersion reads
    the CLI's free-text `docker --version`, which is not the daemon's."""

    def command(self):
        return "docker version --format '{{.Server.Version}}' 2>&1 || true"

    def process(self, output):
        return parse_docker_version(output)


def parse_python_version(lines: list[str]) -> str | None | Unreadable:
    text = lines[0].strip() if lines else "none"
    if text == "none":
        return None
    if not re.fullmatch(r"3\.\d+", text):
        return Unreadable("python3 --version", f"reads {text[:40]!r}, not 3.N")
    return text


class PythonVersion(FactBase):
    """The host's python3 as "3.12" (the runtime bundle is built for it); pyinfra has no such fact."""

    def command(self):
        return "python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])' 2>/dev/null || echo none"

    def process(self, output):
        return parse_python_version(output)


FILES_MARKER = "@@files"


def parse_model_files(text: str, model_dir: str) -> dict | Unreadable:
    """The verified record and, per file, size, mtime (ns) and inode.

    The listing is NUL-separated, so a file name holding a newline stays one name. An
    unreadable record vouches for nothing (every file is hashed again: nothing is deleted).
    """
    record_text, marker, listing = text.partition(FILES_MARKER)
    if not marker:
        return {"record": {}, "files": {}}
    record = json_object(model_dir, record_text.strip() or None).value or {}
    files, others = {}, {}  # others: path -> find's type letter of what is not a regular file
    for entry in listing.lstrip("\n").split("\0"):
        if not entry.strip("\n"):
            continue
        match = re.fullmatch(r"(?:([a-zA-Z]) )?(\d+) (\d+)(?:\.(\d+))? (\d+) (.+)", entry, re.DOTALL)
        if not match:
            return Unreadable(f"find {model_dir}", f"listing entry {entry[:60]!r} is not `size mtime inode name`")
        kind, size, seconds, fraction, ino, path = match.groups()
        if kind not in (None, "f"):
            others[path] = kind
            continue
        files[path] = {"size": int(size), "mtime_ns": int(seconds) * 10**9 + int((fraction or "")[:9].ljust(9, "0")),
                       "ino": int(ino)}
    return {"record": record, "files": files, "others": others}


class ModelFiles(FactBase):
    """A model directory's verified record and every file's size, mtime and inode in one round
    trip (pyinfra's File fact is one file per call; FindFiles splits names on newlines)."""

    def command(self, model_dir, record):
        self.model_dir = model_dir
        quoted = QuoteString(model_dir)
        return StringCommand(
            "if [ -d", quoted, "]; then cat", QuoteString(f"{model_dir}/{record}"), "2>/dev/null; echo;",
            "echo", FILES_MARKER, "; find", quoted,
            "-mindepth 1 ! -path '*/.staging/*' -printf '%y %s %T@ %i %P\\0'; fi",
        )

    @staticmethod
    def default():
        return {"record": {}, "files": {}}

    def process(self, output):
        return parse_model_files("\n".join(output), self.model_dir)


def primary_fingerprints(keys: dict) -> list[str]:
    """Fingerprints of the primary keys in pyinfra's GPG fact shape (subkeys are not keys)."""
    return sorted(key.get("fingerprint", "?").upper() for key in keys.values())


class KeyringKeys(GpgFactBase):
    """The keys in a keyring file, as pyinfra's GpgKey returns them ({key id: {fingerprint,
    subkeys}}; {} when absent or unreadable, so such a keyring is replaced). pyinfra's GpgKey
    runs `gpg --with-colons FILE`, which prints no fingerprints for a file, leaves the path
    unquoted and fails the host on an unreadable file; this one uses --show-keys."""

    def command(self, path):
        return StringCommand("if [ -f", QuoteString(path), "]; then gpg --show-keys --with-colons", QuoteString(path),
                             "2>/dev/null || true; fi")

    def process(self, output):
        try:
            return super().process(output)
        except (ValueError, IndexError):
            return {}

    @staticmethod
    def default():
        return {}


class ModelDirs(FactBase[list]):
    """sparkfleet's model directories (<org>--<name>@<pin>) under model_root. Its output drives
    `rm -rf`, so it is NUL-separated (pyinfra's FindDirectories splits a name holding a newline
    into two paths) and every entry must be a direct child of model_root."""

    @staticmethod
    def default():
        return []

    def command(self, model_root):
        self.model_root = model_root
        return StringCommand("find", QuoteString(model_root), "-mindepth 1 -maxdepth 1 -type d -name '*@*' -print0",
                             "2>/dev/null || true")

    def process(self, output):
        return parse_model_dirs("\n".join(output), self.model_root)


def parse_model_dirs(text: str, model_root: str) -> list[str] | Unreadable:
    dirs = sorted(entry for entry in text.split("\0") if entry.strip("\n"))
    prefix = model_root.rstrip("/") + "/"
    strays = [d for d in dirs if not d.startswith(prefix) or "/" in d[len(prefix):]]
    if strays:
        return Unreadable(f"find {model_root}", f"listed {strays[0][:80]!r}, not a directory directly under it")
    return dirs


class RuntimePath(FactBase[str]):
    """The newest runtime bundle unpacked on the host (the clients the helpers run with)."""

    def command(self):
        return paths.NEWEST_RUNTIME_COMMAND

    def process(self, output):
        return output[0] if output else None


@dataclass(frozen=True)
class FabricLink:
    """The fabric interface as `ip -j addr` shows it (exists False: no such interface on the host)."""

    interface: str
    exists: bool
    admin_up: bool = False  # the UP flag: `ip link set IFACE up` was done
    carrier: bool = False  # LOWER_UP, operstate UP (UNKNOWN with both flags for drivers that report no state)
    mtu: int | None = None
    addresses: tuple[str, ...] = ()  # its IPv4 addresses, without prefix length


FABRIC_ABSENT = "@@sparkfleet-no-interface"
_MAX_FACT_CHARS = 1_000_000  # more than any real `ip -j addr` of one interface: a bigger answer is not believed
_MTU_RANGE = range(68, 65537)  # what Linux accepts on any interface


def _ipv4_text(value) -> str | None:
    """An IPv4 address as Python writes it back (a leading zero or a name is not one), else None."""
    if not isinstance(value, str):
        return None
    try:
        return value if str(ipaddress.IPv4Address(value)) == value else None
    except ValueError:
        return None


def parse_fabric_link(lines: list[str], interface: str) -> FabricLink | Unreadable:
    """`ip -j addr show dev IFACE`: one object for that interface, its flags, MTU and IPv4 addresses. Anything
    else (an old `ip` without -j, another interface's name, a list of flags that is not one, an MTU Linux does
    not allow, an inet entry that is not an IPv4 address) is unreadable."""
    source = f"ip -j addr show dev {interface}"
    text = "\n".join(lines).strip()
    if text == FABRIC_ABSENT:
        return FabricLink(interface, exists=False)
    if len(text) > _MAX_FACT_CHARS:
        return Unreadable(source, f"printed {len(text)} characters, more than one interface has")
    try:
        value = json.loads(text)
    except ValueError:
        return Unreadable(source, f"printed {text[:80]!r}, not JSON (iproute2 too old for -j?)")
    link = value[0] if isinstance(value, list) and len(value) == 1 else None
    if not isinstance(link, dict) or link.get("ifname") != interface:
        return Unreadable(source, f"printed {text[:80]!r}, not one object for {interface}")
    flags, mtu, infos = link.get("flags"), link.get("mtu"), link.get("addr_info", [])
    if not (isinstance(flags, list) and all(isinstance(flag, str) for flag in flags)):
        return Unreadable(source, "`flags` is not a list of names")
    if type(mtu) is not int or mtu not in _MTU_RANGE:
        return Unreadable(source, f"`mtu` reads {str(mtu)[:40]!r}, not an MTU Linux allows (68..65536)")
    if not (isinstance(infos, list) and all(isinstance(info, dict) for info in infos)):
        return Unreadable(source, "`addr_info` is not a list of objects")
    addresses = []
    for info in infos:
        if info.get("family") != "inet":
            continue
        address = _ipv4_text(info.get("local"))
        if address is None:
            return Unreadable(source, f"an inet address reads {str(info.get('local'))[:40]!r}, not an IPv4 address")
        addresses.append(address)
    operstate = link.get("operstate")
    carrier = "LOWER_UP" in flags and (operstate == "UP" or (operstate == "UNKNOWN" and "UP" in flags))
    return FabricLink(interface, True, admin_up="UP" in flags, carrier=carrier, mtu=mtu, addresses=tuple(addresses))


class FabricInterface(FactBase):
    """The fabric interface's state, MTU and IPv4 addresses (pyinfra's NetworkDevices parses `ip addr` text for
    every interface and reads no operstate); a missing interface is a FabricLink that does not exist."""

    def command(self, interface: str):
        self.interface = interface
        return StringCommand("if [ -e", QuoteString(f"/sys/class/net/{interface}"), "]; then ip -j addr show dev",
                             QuoteString(interface), "2>&1; else echo", FABRIC_ABSENT, "; fi")

    def process(self, output):
        return parse_fabric_link(output, self.interface)


REACH_NO_PING = "@@sparkfleet-no-ping"


def parse_fabric_reach(lines: list[str], addresses: list[str]) -> dict[str, bool] | Unreadable:
    """Which of `addresses` answered a ping: a line `ADDRESS ok|failed` per address asked about; a line
    about any other address is ignored, and an address with no line counts as not answering."""
    if REACH_NO_PING in lines:
        return Unreadable("ping", "not installed: apt-get install iputils-ping")
    answered = {}
    for line in lines:
        address, _, verdict = line.strip().partition(" ")
        if address in addresses and verdict in ("ok", "failed"):
            answered[address] = verdict == "ok"
    return {address: answered.get(address, False) for address in addresses}


def parse_os_release(lines: list[str]) -> dict[str, str]:
    """/etc/os-release's ID and ID_LIKE (lower case, quotes dropped); any other line is ignored, a missing file
    reads as {}."""
    found = {}
    for line in lines:
        key, sep, value = line.strip().partition("=")
        if sep and key in ("ID", "ID_LIKE"):
            found[key] = value.strip().strip("\"'").lower()[:80]
    return found


class OsRelease(FactBase[dict]):
    """The distribution's ID and ID_LIKE from /etc/os-release (a service host's preflight: Debian or Ubuntu)."""

    def command(self):
        return "cat /etc/os-release 2>/dev/null || true"

    @staticmethod
    def default():
        return {}

    def process(self, output):
        return parse_os_release(output)


REACH_VERDICTS = ("ok", "refused", "unreachable")  # connected; the host answered with a refusal; no answer in 3 s


def parse_tcp_reach(lines: list[str], targets: list[str]) -> dict[str, str]:
    """Each of `targets` ("address:port") -> "ok" (connected), "refused" (the host said no one listens there: it is
    reached, its service not up yet) or "unreachable": a line `TARGET VERDICT` per target asked about; a line about
    anything else is ignored, and a target with no line counts as unreachable."""
    answered = {}
    for line in lines:
        target, _, verdict = line.strip().partition(" ")
        if target in targets and verdict in REACH_VERDICTS:
            answered[target] = verdict
    return {target: answered.get(target, "unreachable") for target in targets}


class TcpReach(FactBase[dict]):
    """Whether the host opens a TCP connection to each (address, port) within 3 s (bash's /dev/tcp: no client to
    install), telling a refusal (the path is there) from silence; pyinfra has no reachability fact. Only a
    validated address or host name and a port reach the shell, each quoted; bash's error is matched, never shown."""

    def command(self, targets: list[tuple[str, int]]):
        kept = [(a, int(p)) for a, p in targets if _reach_address(a) and 0 < int(p) < 65536]
        self.targets = [f"{a}:{p}" for a, p in kept]
        probes = [StringCommand("if out=$(timeout 3 bash -c ': < /dev/tcp/$0/$1'", QuoteString(a), QuoteString(str(p)),
                                "2>&1); then echo", QuoteString(f"{a}:{p} ok"), '; else case "$out" in *refused*) echo',
                                QuoteString(f"{a}:{p} refused"), ";; *) echo", QuoteString(f"{a}:{p} unreachable"),
                                ";; esac; fi;") for a, p in kept]
        return StringCommand("true;", *probes)

    @staticmethod
    def default():
        return {}

    def process(self, output):
        return parse_tcp_reach(output, self.targets)


def _reach_address(address: str) -> bool:
    """An IPv4 address or a DNS name (letters, digits, dots and dashes): nothing else is probed."""
    return bool(_ipv4_text(address) or re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,252})", address or ""))


class FabricReach(FactBase):
    """Whether each address answers one ping sent out of the fabric interface (`ping -I`): a member reaches
    the others over the link, not over the office LAN. pyinfra has no reachability fact."""

    def command(self, interface: str, addresses: list[str]):
        self.addresses = [a for a in addresses if _ipv4_text(a)]
        pings = [StringCommand("if ping -c 1 -W 2 -I", QuoteString(interface), QuoteString(address),
                               ">/dev/null 2>&1; then echo", QuoteString(f"{address} ok"), "; else echo",
                               QuoteString(f"{address} failed"), "; fi;") for address in self.addresses]
        return StringCommand("if ! command -v ping >/dev/null; then echo", REACH_NO_PING, "; exit 0; fi;", *pings)

    @staticmethod
    def default():
        return {}

    def process(self, output):
        return parse_fabric_reach(output, self.addresses)


def parse_ray_check(lines: list[str]) -> dict:
    """sparkfleet-ray-check's JSON line: {"ok", "detail"}. Anything else (no helper yet, no Ray container, a
    broken line) is not ok: the converge then runs the check itself, which names what is missing."""
    try:
        value = json.loads(lines[-1]) if lines else None
    except ValueError:
        value = None
    missing = value.get("missing") if isinstance(value, dict) else None
    alive = value.get("alive_nodes") if isinstance(value, dict) else None
    if not (isinstance(missing, list) and all(isinstance(m, str) for m in missing) and type(alive) is int):
        return {"ok": False, "detail": f"sparkfleet-ray-check printed {' '.join(lines)[-200:]!r}"}
    return {"ok": not missing, "detail": "; ".join(missing)[:400] or f"{alive} alive nodes, 1 GPU each"}


class RayCheck(FactBase[dict]):
    """Whether the group's Ray cluster sees each of `members` ({name: fabric address}) alive with one GPU, asked
    from this member's Ray container once, without waiting (pyinfra has no Ray fact)."""

    def command(self, address: str, node_ip: str, members: dict):
        return StringCommand(
            "if [ -x", paths.RAY_CHECK, "]; then python3", paths.RAY_CHECK, *ray_check_args(address, node_ip, members),
            "2>/dev/null; else echo '{}'; fi; true")

    @staticmethod
    def default():
        return {"ok": False, "detail": "no answer"}

    def process(self, output):
        return parse_ray_check(output)


def ray_check_args(address: str, node_ip: str, members: dict) -> list:
    """sparkfleet-ray-check's arguments, each quoted."""
    args = ["--address", QuoteString(address), "--node-ip", QuoteString(node_ip)]
    for name, member_address in members.items():
        args += ["--member", QuoteString(f"{name}={member_address}")]
    return args


class Ipv4Networks(FactBase[str]):
    """`ip -j -4 addr`: every interface's IPv4 addresses with their prefix, as raw JSON text (untrusted: the
    front door's `address.interface_for` parses it and finds the interface the floating address belongs on)."""

    def command(self):
        return "ip -j -4 addr 2>/dev/null || echo '[]'"

    def process(self, output):
        return "\n".join(output)
