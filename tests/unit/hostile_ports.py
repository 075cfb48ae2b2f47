"""Hostile loopback ports for the SSH and HTTP clients (issue 51): one that accepts and never speaks, one that
answers garbage and hangs up, and a closed one. Each a context manager yielding its port."""

from __future__ import annotations

import socket
import threading
from contextlib import contextmanager

GARBAGE = b"HTTP/1.1 200 OK\r\n\x1b[2Jnot ssh \xff\xfe\r\n\r\n"


def _listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    return sock


@contextmanager
def silent_port():
    """Accepts every connection and never sends a byte (a wedged sshd, a firewall's tarpit)."""
    sock, held, stop = _listener(), [], threading.Event()

    def serve():
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                return
    threading.Thread(target=serve, daemon=True).start()
    try:
        yield sock.getsockname()[1]
    finally:
        stop.set()
        sock.close()
        for conn in held:
            conn.close()


@contextmanager
def garbage_port():
    """Answers each connection with a line that is no SSH banner (and no sane HTTP), then hangs up."""
    sock, stop = _listener(), threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn = sock.accept()[0]
            except OSError:
                return
            try:
                conn.sendall(GARBAGE)
            except OSError:
                pass
            conn.close()
    threading.Thread(target=serve, daemon=True).start()
    try:
        yield sock.getsockname()[1]
    finally:
        stop.set()
        sock.close()


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port
