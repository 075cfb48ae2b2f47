"""What the hosts and the controller must agree on, in one stdlib-only module.

Shipped beside the helper scripts (which import it as a sibling) and loaded
by the controller from the same file (sparkfleet.contract.shared): the verified
record's name and format, when the record vouches for a file, which manifest
files need work and which entries are extras, the file hashes, what a
hub's answer may name (commit ids, manifest paths), the format of the root-only
env files (written, read, and edited by a rollback) and of the memory plan,
whether the engine's container holds the API port before a helper sends it
the key, and how a probe of contract/serving.py (read from the serving file
the converge writes) is asked and its answer judged. Hub answers are data:
anything that would make them a path outside the model directory is refused.
Host paths are passed in by the caller, never repeated here. Python >= 3.10.
"""

from __future__ import annotations

import hashlib
import http.client
import ipaddress
import json
import os
import re
import socket
import stat
import struct
import subprocess
import unicodedata
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

RECORD_NAME = ".sparkfleet-verified.json"  # inside each model directory: path -> {size, mtime_ns, ino, hash}
RECORD_TMP_NAME = RECORD_NAME + ".partial"  # written, then renamed over the record
STAGING_NAME = ".staging"  # under the model root: same file system, atomic rename
PART_SUFFIX = ".part"  # a transfer in progress, inside staging
RESERVED_NAMES = frozenset({RECORD_NAME, RECORD_TMP_NAME, STAGING_NAME})
COMMIT_RE = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # git sha1 or sha256 object ids
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# What a manifest path may not hold: a control (C0, DEL, C1), a format character (a bidi override makes
# "a\u202egnp.exe" read "aexe.png"), a line or paragraph separator, a lone surrogate.
_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_CHUNK = 1 << 20


class UntrustedAnswer(ValueError):
    """A hub's (or a peer's) answer that cannot be used as it stands; the message says why."""


def check_commit(commit: str | None) -> str | None:
    """A commit id as a hub reports it: 40 or 64 lowercase hex characters (or no commit at all)."""
    if commit is not None and not (isinstance(commit, str) and COMMIT_RE.fullmatch(commit)):
        raise UntrustedAnswer(f"commit id {commit!r} is not 40 or 64 hex characters")
    return commit


def check_manifest_path(path: str) -> str:
    """A manifest path that names a file inside the model directory, and nothing else."""
    if not isinstance(path, str) or not path:
        raise UntrustedAnswer(f"manifest path {path!r} is empty")
    if "\\" in path or any(unicodedata.category(c) in _HIDDEN for c in path):
        raise UntrustedAnswer(f"manifest path {path!r} holds a control, format (bidi) or separator character, "
                              f"or a backslash")
    if path.startswith("/"):
        raise UntrustedAnswer(f"manifest path {path!r} is absolute")
    parts = path.split("/")
    if any(part.strip(".") == "" for part in parts):
        raise UntrustedAnswer(f"manifest path {path!r} is not normalised (empty, '.' or '..' parts)")
    if RESERVED_NAMES.intersection(parts) or path.endswith(PART_SUFFIX):
        raise UntrustedAnswer(f"manifest path {path!r} collides with sparkfleet's own record or staging names")
    return path


def check_manifest_paths(paths) -> list[str]:
    """Every path checked, no duplicates, and no file that is also another file's directory."""
    paths = [check_manifest_path(p) for p in paths]
    seen = set(paths)
    if len(seen) != len(paths):
        raise UntrustedAnswer("the manifest lists a path twice")
    for path in paths:
        for i in range(1, path.count("/") + 1):
            if path.rsplit("/", i)[0] in seen:
                raise UntrustedAnswer(f"manifest path {path!r} lies under another listed file")
    return paths


def check_dir_name(name: str) -> str:
    """One path component (a model directory's name): nothing that climbs or splits."""
    if not name or "/" in name or name.strip(".") == "" or _CONTROL.search(name) or name in RESERVED_NAMES:
        raise UntrustedAnswer(f"directory name {name!r} is not a single plain path component")
    return name


def inside(root, path) -> Path:
    """`path` with every symlink resolved, provided it stays under `root` (also resolved)."""
    resolved, base = Path(path).resolve(), Path(root).resolve()
    if not resolved.is_relative_to(base):
        raise UntrustedAnswer(f"{path} resolves to {resolved}, outside {base}")
    return resolved


def expected_hash(entry: dict) -> str:
    """The hash a manifest entry pins: sha256 when the hub gives one, else the git blob sha1."""
    return entry.get("sha256") or entry["blob_sha1"]


def git_blob_sha1(data: bytes) -> str:
    """The id git (and the Hugging Face hub) gives a small file."""
    digest = hashlib.sha1(b"blob %d\0" % len(data))
    digest.update(data)
    return digest.hexdigest()


def hash_file(f, entry: dict) -> str:
    """The digest of an open file in the kind the entry pins (sha256, else git blob sha1)."""
    if entry.get("sha256"):
        digest = hashlib.sha256()
    else:
        digest = hashlib.sha1(b"blob %d\0" % os.fstat(f.fileno()).st_size)
    while chunk := f.read(_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def file_matches(path, entry: dict) -> bool:
    """True when the file has the entry's size and hash (size first: no read when it differs)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if os.fstat(f.fileno()).st_size != entry["size"]:
            return False
        return hash_file(f, entry) == expected_hash(entry)


def stat_key(st: os.stat_result) -> dict:
    """What the record keeps of a file's stat: a change to any of them voids the vouch."""
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}


def record_entry(st: os.stat_result, entry: dict) -> dict:
    return {**stat_key(st), "hash": expected_hash(entry)}


def vouches(have: dict | None, current: dict | None, entry: dict | None = None) -> bool:
    """Does a record entry vouch for a file whose stat is `current` (and, given the entry, its hash)?"""
    if not have or not current:
        return False
    if any(have.get(k) != current.get(k) for k in ("size", "mtime_ns", "ino")):
        return False
    return entry is None or (current["size"] == entry["size"] and have.get("hash") == expected_hash(entry))


def files_needing_work(entries: dict, record: dict, files: dict, full_verify: bool = False) -> list[str]:
    """Manifest paths the record does not vouch for (absent, changed, or unrecorded), in manifest order.

    `entries` maps path -> manifest entry; `files` maps path -> stat_key of
    each regular file found (the ModelFiles fact, or scan()).
    """
    if full_verify:
        return list(entries)
    return [path for path, entry in entries.items() if not vouches(record.get(path), files.get(path), entry)]


def extras(entries, files: dict, others: dict) -> list[str]:
    """Entries of a model directory that the manifest does not name: files, symlinks, other directories.

    `others` maps path -> find's type letter (d, l, p, s, ...) of every
    non-regular entry. Directories that hold manifest files are expected.
    """
    wanted = set(entries)
    parents = {path.rsplit("/", i)[0] for path in wanted for i in range(1, path.count("/") + 1)}
    found = [p for p in files if p not in wanted and p != RECORD_NAME]
    found += [p for p, kind in others.items() if not (kind == "d" and p in parents)]
    return sorted(found)


_TYPES = {stat.S_IFDIR: "d", stat.S_IFLNK: "l", stat.S_IFIFO: "p", stat.S_IFSOCK: "s",
          stat.S_IFCHR: "c", stat.S_IFBLK: "b"}


def scan(model_dir) -> tuple[dict, dict]:
    """(regular files -> stat_key, other entries -> type letter) under model_dir, symlinks never followed."""
    files, others = {}, {}
    root = str(model_dir)
    for top, dirs, names in os.walk(root):
        for name in dirs + names:
            full = os.path.join(top, name)
            rel = os.path.relpath(full, root)
            st = os.lstat(full)
            if stat.S_ISREG(st.st_mode):
                files[rel] = stat_key(st)
            else:
                others[rel] = _TYPES.get(stat.S_IFMT(st.st_mode), "?")
    files.pop(RECORD_NAME, None)
    return files, others


def open_beneath(root, parts) -> int:
    """A read-only fd for root/parts..., following no symlink among `parts` (else OSError)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, part in enumerate(parts):
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_NONBLOCK if i == len(parts) - 1 else os.O_DIRECTORY)
            fd, parent = os.open(part, flags, dir_fd=fd), fd
            os.close(parent)
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_record(model_dir) -> dict:
    """The verified record, or {} when there is none (or it is unreadable, or a symlink: then nothing is vouched for)."""
    model_dir = Path(model_dir)
    try:
        with os.fdopen(open_beneath(model_dir.parent, [model_dir.name, RECORD_NAME]), "rb") as f:
            record = json.loads(f.read())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


# --- The env files sparkfleet writes (engine.env, hub.env): the one owner of their format -------------------

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# engine.env holds the API key under the variable its engine reads (the controller's engine descriptors,
# sparkfleet/contract/engines.py), or none where the engine reads none. The helpers learn that variable from the
# serving file (`api_key_var`, null: none), the rollback's edit too (the serving file's path is its argument);
# a serving file written before that field (an older converge) had the key under one of these, which is all this
# module names.
LEGACY_KEY_VARS = ("VLLM_API_KEY", "LLAMA_API_KEY")


def serving_key_vars(serving: dict) -> tuple:
    """The engine.env variables that hold the engine's API key, as the serving file names them: its `api_key_var`
    (null or not a variable name: none), or LEGACY_KEY_VARS for a serving file written before that field."""
    if "api_key_var" not in serving:
        return LEGACY_KEY_VARS
    var = serving["api_key_var"]
    return (var,) if isinstance(var, str) and _ENV_NAME.fullmatch(var) else ()


def serving_file_key_vars(path) -> tuple:
    """serving_key_vars of the serving file at `path`; LEGACY_KEY_VARS when it is absent or unreadable (names only:
    what a rollback's edit treats as the key, never a value)."""
    try:
        value = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return LEGACY_KEY_VARS
    return serving_key_vars(value) if isinstance(value, dict) else LEGACY_KEY_VARS


def engine_api_key(env: dict, key_vars=LEGACY_KEY_VARS):
    """The API key of an engine.env under the first of `key_vars` (serving_key_vars) set; None when there is none."""
    return next((env[var] for var in key_vars if env.get(var)), None)


KEPT_NAME = "#key "  # a kept env's line naming an engine_env variable whose value a rollback takes from today's file


def render_env(header: str, values: dict) -> str:
    """An env file as `docker run --env-file` reads it: a comment, then one NAME=value a line, values verbatim.
    A name outside [A-Za-z0-9_] or a value with a control character would split or hide a line: refused (the
    error names the variable, never its value)."""
    lines = [f"# {header}"]
    for name, value in values.items():
        if not _ENV_NAME.fullmatch(name) or _CONTROL.search(str(value)):
            raise ValueError(f"env file variable {name!r}: needs a name of [A-Za-z0-9_] and a one-line value")
        lines.append(f"{name}={value}")
    return "\n".join(lines) + "\n"


def _env_entry(line: str):
    """(name, value) of a NAME=value line; None for a comment, a blank line or a line without '='."""
    name, eq, value = line.partition("=")
    if not eq or line.lstrip().startswith("#"):
        return None
    return name.strip(), value


def parse_env(text: str) -> dict:
    """NAME=value lines, values verbatim as `docker run --env-file` reads them; comments skipped."""
    return dict(entry for entry in map(_env_entry, text.splitlines()) if entry)


def read_env_file(path) -> dict:
    """parse_env of an env file sparkfleet wrote; {} when the file is absent or unreadable."""
    try:
        return parse_env(Path(path).read_text())
    except OSError:
        return {}


def env_kept(live: str, fabric, key_vars=LEGACY_KEY_VARS) -> str:
    """What a rollback keeps of the running release's engine env: its fabric lines (a group member's, derived from
    the release) and, as KEPT_NAME lines, the names of its other variables, never their values nor the API key
    (`key_vars`: serving_file_key_vars)."""
    kept = []
    for line in live.splitlines():
        entry = _env_entry(line)
        if entry and entry[0] in fabric:
            kept.append(line)
        elif entry and entry[0] not in key_vars:
            kept.append(KEPT_NAME + entry[0])
    return "".join(f"{line}\n" for line in kept)


def env_restored(kept: str, live: str, fabric, key_vars=LEGACY_KEY_VARS) -> str:
    """The engine env of a rolled-back release: today's comments, API key and today's values of the kept names
    (a name the kept release lacked is left out, so is one today's file dropped), then the kept fabric lines.
    A kept file of an older rule holds NAME=value lines: only their names are read."""
    names, fabric_lines = set(), []
    for line in kept.splitlines():
        entry = None if line.startswith(KEPT_NAME) else _env_entry(line)
        if line.startswith(KEPT_NAME):
            names.add(line[len(KEPT_NAME):].strip())
        elif entry and entry[0] in fabric:
            fabric_lines.append(line)
        elif entry:
            names.add(entry[0])
    restored = []
    for line in live.splitlines():
        entry = _env_entry(line)
        if entry is None or (entry[0] not in fabric and (entry[0] in key_vars or entry[0] in names)):
            restored.append(line)
    return "".join(f"{line}\n" for line in restored + fabric_lines)


def write_private(path, text: str) -> None:
    """Replace a file atomically with a root-only (0600) one: never readable by others, never half-written."""
    staged = Path(f"{path}.sparkfleet-new")
    staged.unlink(missing_ok=True)
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(staged, path)


def keep_env(live, kept, fabric, key_vars=LEGACY_KEY_VARS) -> None:
    """Before a new release replaces the running one: its engine env set aside (env_kept)."""
    write_private(kept, env_kept(Path(live).read_text(), fabric, key_vars))


def restore_env(live, kept, fabric, key_vars=LEGACY_KEY_VARS) -> None:
    """A rollback's env swap: the kept release's env written from today's (env_restored), and the running one's
    kept in turn, so a second rollback returns."""
    live_text, kept_text = Path(live).read_text(), Path(kept).read_text()
    write_private(live, env_restored(kept_text, live_text, fabric, key_vars))
    write_private(kept, env_kept(live_text, fabric, key_vars))


# --- The memory plan (its path: contract/paths.py MEMORY_PLAN): written by the planner, read by sparkfleet-memcheck

def within_budget(shares, budget: float) -> tuple[float, bool]:
    """(the shares' sum, whether it fits the budget): the one rule the planner and the pre-start check apply."""
    total = round(sum(shares), 6)
    return total, total <= budget + 1e-9


def read_memory_plan(path) -> tuple[float, dict] | None:
    """(budget, {unit: share}) of a memory plan file; None when it is absent or not the planner's shape."""
    try:
        plan = json.loads(Path(path).read_text())
        return float(plan["budget"]), {str(row["unit"]): float(row["share"]) for row in plan["shares"].values()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def start_before(path, unit: str) -> tuple[list[tuple[str, int]], float, str | None]:
    """([(unit, engine port)] of the engines that start before `unit` in the memory plan's order, how long to wait
    for them, the serving file that says what answering is): on unified memory two engines loading at once race for
    the same bytes (each sees the other's half-made allocations as free), so each waits for those before it.
    ([], 0, None) for a unit not in the plan or a plan without a start order (an older release's)."""
    try:
        plan = json.loads(Path(path).read_text())
        start, ports = plan["start"], {str(r["unit"]): int(r["engine_port"]) for r in plan["shares"].values()}
        order = [str(u) for u in start["order"]]
        if unit not in order:
            return [], 0, None
        return ([(u, ports[u]) for u in order[:order.index(unit)]], float(start["wait_s"]), str(start["serving"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return [], 0, None


def on_demand_units(path) -> tuple[dict[str, str], str | None]:
    """({unit: its guard's listener} of the memory plan's on-demand engines (rows with "on_demand"), the guard's
    stats socket that says when each was last asked); ({}, None) for a plan without any, or one that is absent or
    not the planner's shape."""
    try:
        plan = json.loads(Path(path).read_text())
        units = {str(row["unit"]): f"service_{name}" for name, row in plan["shares"].items() if row.get("on_demand")}
        return units, (str(plan["guard_stats"]) if units else None)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}, None


def last_requests(stat_csv: str) -> dict[str, float | None]:
    """{listener: seconds since its engine's last request (None: none since the guard started)} from the guard's
    `show stat` (HAProxy's CSV: its own header names the columns; lastsess -1 or empty is none)."""
    lines = stat_csv.strip().splitlines()
    if not lines or not lines[0].startswith("# "):
        return {}
    header = lines[0][2:].split(",")
    found = {}
    for line in lines[1:]:
        row = dict(zip(header, line.split(",")))
        if row.get("svname") == "engine" and row.get("pxname"):
            seconds = row.get("lastsess", "")
            found[row["pxname"]] = float(seconds) if seconds.isdigit() else None
    return found


def ask_stats(socket_path: str, timeout: float = 5) -> str:
    """The guard's `show stat` through its stats socket ("" when it cannot be asked)."""
    import socket

    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(socket_path)
            sock.sendall(b"show stat\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


def own_unit(cgroup_text: str) -> str | None:
    """The systemd service a process runs in, from its /proc/<pid>/cgroup (v2 `0::/system.slice/x.service`, v1's
    name=systemd line): an ExecStartPre runs in its unit's cgroup."""
    for line in cgroup_text.splitlines():
        for part in reversed(line.split(":", 2)[-1].split("/")):
            if part.endswith(".service"):
                return part
    return None


def write_record(model_dir, verified: dict) -> None:
    """Replace the record atomically (world-readable: the unprivileged share reads it)."""
    tmp = Path(model_dir) / RECORD_TMP_NAME
    tmp.write_text(json.dumps(verified, indent=0, sort_keys=True))
    os.chmod(tmp, 0o644)
    os.replace(tmp, Path(model_dir) / RECORD_NAME)


CONTAINER_ID_RE = re.compile(r"[0-9a-f]{64}")
_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column


def _proc_address(hex_address: str):
    """An address as /proc/net/tcp{,6} prints it (32-bit words in the kernel's byte order) as an ip_address."""
    words = [int(hex_address[i:i + 8], 16) for i in range(0, len(hex_address), 8)]
    return ipaddress.ip_address(struct.pack(f"={len(words)}I", *words))


def _reaching(host: str) -> set:
    """The bound addresses whose listener a connection to `host` can reach: it, the wildcards, its v4-mapped form."""
    address = ipaddress.ip_address(host)
    wild = {ipaddress.ip_address("::")}
    if address.version == 4:
        wild |= {ipaddress.ip_address("0.0.0.0"), ipaddress.ip_address(f"::ffff:{address}")}
    return {address, *wild}


def listeners(port: int, host: str = "127.0.0.1", proc="/proc") -> dict[str, int]:
    """socket inode -> owner uid of every TCP listener a connection to host:port could reach (OSError when
    /proc/net/tcp is unreadable; tcp6 may be absent)."""
    reach, found = _reaching(host), {}
    for name, required in (("tcp", True), ("tcp6", False)):
        try:
            lines = Path(proc, "net", name).read_text().splitlines()[1:]
        except FileNotFoundError:
            if required:
                raise
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            address, _, hex_port = fields[1].partition(":")
            if int(hex_port, 16) == port and _proc_address(address) in reach:
                found[fields[9]] = int(fields[7])
    return found


def socket_holders(inodes, proc="/proc") -> dict[str, set[int]]:
    """inode -> pids holding it open, from /proc/[pid]/fd (processes whose fds cannot be read hold nothing here)."""
    wanted = {f"socket:[{inode}]": inode for inode in inodes}
    holders: dict[str, set[int]] = {inode: set() for inode in inodes}
    for pid in (p for p in os.listdir(proc) if p.isdigit()):
        fd_dir = os.path.join(proc, pid, "fd")
        try:
            names = os.listdir(fd_dir)
        except OSError:  # gone, or not ours to read
            continue
        for fd in names:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target in wanted:
                holders[wanted[target]].add(int(pid))
    return holders


def in_container(cgroup_text: str, container_id: str) -> bool:
    """Does a /proc/<pid>/cgroup name the container: cgroup v1 `.../docker/<id>`, v2 `.../docker-<id>.scope`?"""
    pattern = re.compile(rf"(?:^|/)(?:docker-)?{container_id}(?:\.scope)?(?:/|$)")
    return any(pattern.search(line.split(":", 2)[-1]) for line in cgroup_text.splitlines())


def _is_proxy_for(cmdline: list[str], container_ips) -> bool:
    """docker-proxy publishing a port to one of the container's addresses (`-container-ip IP`)."""
    if not cmdline or os.path.basename(cmdline[0]) != "docker-proxy":
        return False
    return any(a == "-container-ip" and b in container_ips for a, b in zip(cmdline, cmdline[1:]))


def engine_listener(port: int, container_id: str, container_ips=(), host: str = "127.0.0.1", proc="/proc",
                    name: str = "the engine container") -> tuple[bool, str]:
    """(True, "") when every TCP listener a connection to host:port could reach is held only by processes of
    the engine container (or, for a published port, by a root docker-proxy forwarding to its address); else
    (False, why). Fails closed: no listener, unreadable /proc, an unknown or foreign holder. Never sees a key."""
    if not (isinstance(container_id, str) and CONTAINER_ID_RE.fullmatch(container_id)):
        return False, f"engine container id {container_id!r} is not 64 hex digits"
    try:
        sockets = listeners(port, host, proc)
    except (OSError, ValueError) as exc:
        return False, f"cannot read the listeners of port {port}: {exc}"
    if not sockets:
        return False, f"nothing listens on {host}:{port}"
    for inode, pids in socket_holders(sockets, proc).items():
        if not pids:
            return False, f"no process this helper can see holds the listener on port {port} (socket {inode})"
        for pid in sorted(pids):
            try:
                cgroup = Path(proc, str(pid), "cgroup").read_text()
                cmdline = Path(proc, str(pid), "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError as exc:
                return False, f"cannot read process {pid} holding port {port}: {exc}"
            if in_container(cgroup, container_id):
                continue
            if sockets[inode] == 0 and _is_proxy_for(cmdline, set(container_ips)):
                continue
            program = os.path.basename(cmdline[0]) if cmdline[0] else "?"
            return False, f"port {port} is held by process {pid} ({program}) outside {name}"
    return True, ""


DOCKER_SOCKET = "/var/run/docker.sock"
DOCKER_ANSWER_CAP = 4 * 2**20  # a container's JSON is a few KiB; dockerd is trusted no further than its size


class _UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a unix socket: how the docker CLI itself talks to dockerd."""

    def __init__(self, socket_path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = socket_path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


def docker_socket() -> str:
    """Docker's API socket: DOCKER_HOST where it names a unix socket (as the docker CLI reads it), else the default."""
    host = os.environ.get("DOCKER_HOST", "")
    return host[len("unix://"):] if host.startswith("unix://") else DOCKER_SOCKET


def docker_get(path: str, timeout: float = 15) -> tuple[int, bytes]:
    """(status, body) of a GET on Docker's API: the answer `docker inspect` prints, without starting the CLI
    (a Go binary that costs a host about 40 ms of CPU per call; the probes ask on every converge and tick)."""
    conn = _UnixHTTPConnection(docker_socket(), timeout)
    try:
        conn.request("GET", path)
        reply = conn.getresponse()
        return reply.status, reply.read(DOCKER_ANSWER_CAP)
    finally:
        conn.close()


def container_identity(container: str) -> tuple[str, tuple[str, ...]]:
    """(full id, addresses on its own networks: none for --network host) of a running container, from Docker's
    API (`docker inspect`'s answer); ("", ()) when docker has no such running container or cannot be asked."""
    try:
        status, body = docker_get(f"/containers/{urllib.parse.quote(container, safe='')}/json")
        info = json.loads(body) if status == 200 else {}
        if not (info.get("State") or {}).get("Running"):
            return "", ()
        networks = (info.get("NetworkSettings") or {}).get("Networks") or {}
        host_network = (info.get("HostConfig") or {}).get("NetworkMode") == "host"
        ips = () if host_network else tuple(str(n["IPAddress"]) for n in networks.values() if n.get("IPAddress"))
        return str(info.get("Id", "")), ips
    except (OSError, http.client.HTTPException, ValueError, AttributeError, TypeError):
        return "", ()


def engine_holds_port(container: str, port: int, host: str = "127.0.0.1", proc="/proc") -> tuple[bool, str]:
    """engine_listener for a container named as the unit names it: what the helpers ask before sending the key."""
    if not container:
        return False, "no engine container named"
    container_id, ips = container_identity(container)
    if not container_id:
        return False, f"container {container} is not running"
    return engine_listener(port, container_id, ips, host, proc, name=f"engine container {container}")


class ServingFileError(ValueError):
    """The serving file is missing or malformed: the message names it and the fix, in one line."""


def _probe_problem(name, probe) -> str | None:
    if not isinstance(probe, dict) or not isinstance(probe.get("what"), str):
        return f"probe {name!r} is not an object naming `what` it asks"
    if probe.get("method") not in ("GET", "POST") or not str(probe.get("path", "")).startswith("/"):
        return f"probe {name!r} has no GET or POST method and /path"
    if probe.get("answer") not in ANSWERS:
        return f"probe {name!r} names no known answer rule ({', '.join(ANSWERS)})"
    if any(type(probe.get(k)) not in (int, float) or probe[k] <= 0 for k in ("timeout_s", "gate_timeout_s")):
        return f"probe {name!r} lacks a positive timeout_s and gate_timeout_s"
    if probe["method"] == "POST" and not isinstance(probe.get("body"), dict):
        return f"probe {name!r} is a POST without a body object"
    return None


def read_serving(path, keys=(), probes=("health",)) -> dict:
    """The serving file the converge wrote (contract/serving.py), checked: `keys` and `probes` present, every
    probe well formed; else ServingFileError. Never a fallback: a helper without it copies no default, it stops."""
    fix = "run a converge, which writes it"
    try:
        value = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ServingFileError(f"serving file {path}: cannot read it ({exc.strerror or exc}): {fix}") from None
    except ValueError as exc:
        raise ServingFileError(f"serving file {path} is not JSON ({exc}): {fix}") from None
    if not isinstance(value, dict) or not isinstance(value.get("probes"), dict):
        raise ServingFileError(f"serving file {path} holds no \"probes\" object: {fix}")
    missing = [k for k in keys if k not in value] + [f"probes.{p}" for p in probes if p not in value["probes"]]
    if missing:
        raise ServingFileError(f"serving file {path} lacks {', '.join(missing)}: {fix}")
    for name, probe in value["probes"].items():
        problem = _probe_problem(name, probe)
        if problem:
            raise ServingFileError(f"serving file {path}: {problem}: {fix}")
    return value


def http_json(url, timeout, body=None, key=None):
    """(status, parsed JSON or None), or (None, why) when nothing answered in time. A body makes it a POST."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=timeout) as r:
            raw = r.read(1 << 20)
            status = r.status
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (OSError, ValueError) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    try:
        return status, json.loads(raw) if raw.strip() else None
    except ValueError:
        return status, None


def _completion(reply, probe, served_name):
    usage = reply.get("usage") or {}
    if not reply.get("choices") or not isinstance(usage.get("completion_tokens"), int) \
            or usage["completion_tokens"] < 1:
        return f"no choice or no completion tokens: {str(reply)[:200]}"
    return None


def _embeddings(reply, probe, served_name):
    data = reply.get("data") if isinstance(reply.get("data"), list) else []
    sizes = {len(item.get("embedding") or ()) for item in data if isinstance(item, dict)}
    if len(data) != len(probe["body"]["input"]) or len(sizes) != 1 or 0 in sizes \
            or not (reply.get("usage") or {}).get("prompt_tokens"):
        return f"{len(data)} vectors of sizes {sorted(sizes)} for {len(probe['body']['input'])} texts"
    return None


def _rerank(reply, probe, served_name):
    results = reply.get("results") if isinstance(reply.get("results"), list) else []
    indexes = sorted(r.get("index", -1) for r in results if isinstance(r, dict))
    if indexes != list(range(len(probe["body"]["documents"]))) or not all(
            type(r.get("relevance_score")) in (int, float) for r in results):
        return f"no score per document: {str(reply)[:200]}"
    return None


def _models(reply, probe, served_name):
    listed = [m.get("id") for m in reply.get("data") or () if isinstance(m, dict)]
    return None if served_name in listed else f"lists {listed}, not {served_name!r}"


def _tool_call(reply, probe, served_name):
    calls = (((reply.get("choices") or [{}])[0] or {}).get("message") or {}).get("tool_calls") or []
    name = ((calls[0] or {}).get("function") or {}).get("name") if calls else None
    return None if name == probe["tool"] else f"no parsed call of {probe['tool']}: {str(reply)[:200]}"


# What counts as an answer, by the rule a probe names (beyond HTTP 200): reply -> None, or why not.
ANSWERS = {"status": None, "models": _models, "completion": _completion, "embeddings": _embeddings,
           "rerank": _rerank, "tool_call": _tool_call}


def answer_problem(probe: dict, status, reply, served_name: str = "") -> str | None:
    """Why an answer to `probe` does not count (None when it does): not HTTP 200, or its rule's reason.
    `status` None means nothing answered and `reply` says why."""
    if status is None:
        return str(reply)
    if status != 200:
        return f"HTTP {status}"
    rule = ANSWERS[probe["answer"]]
    if rule is None:
        return None
    if not isinstance(reply, dict):
        return "the answer is not a JSON object"
    return rule(reply, probe, served_name)


def probe_body(probe: dict, served_name: str) -> dict | None:
    """What a probe sends: its body naming the served model (None for a GET)."""
    return {"model": served_name, **probe["body"]} if probe["method"] == "POST" else None


def ask(base: str, probe: dict, served_name: str = "", key=None, gate: bool = False) -> tuple[str | None, object]:
    """Ask `probe` of the engine at `base` (http://host:port) with urllib: (None, reply) when the answer counts,
    else (why, reply). `gate`: the longer timeout of an engine's first answers after a start."""
    timeout = probe["gate_timeout_s" if gate else "timeout_s"]
    status, reply = http_json(base + probe["path"], timeout, probe_body(probe, served_name), key)
    return answer_problem(probe, status, reply, served_name), reply


def _main(argv) -> None:
    """`sparkfleet_host.py DIR`: what testinfra compares with the manifest. `sparkfleet_host.py env-keep|env-restore
    LIVE KEPT FABRIC,NAMES [SERVING]`: a rollback's edit of the engine env, with no secret on the command line
    (the API key's variable from the serving file SERVING: serving_file_key_vars)."""
    if argv[:1] == ["last-requests"] and len(argv) == 2:  # status: each on-demand model's last request
        print(json.dumps(last_requests(ask_stats(argv[1]))))
        return
    if argv[:1] in (["env-keep"], ["env-restore"]) and len(argv) in (4, 5):
        edit, fabric = keep_env if argv[0] == "env-keep" else restore_env, set(filter(None, argv[3].split(",")))
        key_vars = serving_file_key_vars(argv[4]) if len(argv) == 5 else LEGACY_KEY_VARS
        try:
            edit(argv[1], argv[2], fabric, key_vars)
        except OSError as exc:
            raise SystemExit(f"sparkfleet_host {argv[0]}: {exc.filename}: {exc.strerror}")
        return
    found, other = scan(argv[0])
    print(json.dumps({"record": read_record(argv[0]), "files": found, "others": other}))


if __name__ == "__main__":
    import sys

    _main(sys.argv[1:])
