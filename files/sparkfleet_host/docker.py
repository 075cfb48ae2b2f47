"""A client of Docker's API socket (stdlib HTTP over a unix socket): what `docker inspect` answers, without
starting the CLI.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import urllib.parse

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
