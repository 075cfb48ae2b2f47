"""Who holds a TCP port, from /proc: before a helper sends the engine's API key, every listener a connection to
the engine's port could reach must be held by the engine container's processes (or, for a published port, a root
docker-proxy forwarding to that container's address). Fails closed. Never sees a key. The container's identity
comes from Docker's API (docker.py).
"""

from __future__ import annotations

import ipaddress
import os
import re
import struct
from pathlib import Path

from sparkfleet_host.docker import container_identity

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
    return any(a == "-container-ip" and b in container_ips for a, b in zip(cmdline, cmdline[1:], strict=False))


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


def engine_holds_port(container: str, port: int, host: str = "127.0.0.1", proc="/proc") -> tuple[bool, str]:
    """engine_listener for a container named as the unit names it: what the helpers ask before sending the key."""
    if not container:
        return False, "no engine container named"
    container_id, ips = container_identity(container)
    if not container_id:
        return False, f"container {container} is not running"
    return engine_listener(port, container_id, ips, host, proc, name=f"engine container {container}")
