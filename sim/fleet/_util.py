"""Small helpers shared by the sim fleet modules: paths, subprocess, hashing."""
from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SIM_DIR = REPO_ROOT / ".sim"
IMAGES_DIR = REPO_ROOT / "sim" / "images"
HASH_LABEL = "sparkfleet.sim.hash"  # input hash of an image
CONFIG_LABEL = "sparkfleet.sim.config"  # hash of a container's run configuration

VERBOSE = os.environ.get("SPARKFLEET_SIM_VERBOSE", "1") != "0"


class SimError(RuntimeError):
    pass


def fleet_name(value: str | None) -> str:
    """The fleet a name selects: "" (or "default") is the default fleet; others are short lowercase names, as
    they go into container, volume and network names."""
    value = (value or "").strip()
    if value in ("", "default"):
        return ""
    if not re.fullmatch(r"[a-z][a-z0-9]{0,11}", value):
        raise SimError(f"fleet name {value!r}: use 1-12 lowercase letters and digits starting with a letter "
                       "(SPARKFLEET_SIM_FLEET or --fleet)")
    return value


# The fleet this process works on (SPARKFLEET_SIM_FLEET; `python -m sim --fleet NAME` sets it): the default
# fleet keeps .sim/ and today's names; a named one has its state in .sim/fleets/NAME/ (image caches are shared).
FLEET = fleet_name(os.environ.get("SPARKFLEET_SIM_FLEET"))
FLEET_DIR = SIM_DIR / "fleets" / FLEET if FLEET else SIM_DIR
STATE_FILE = FLEET_DIR / "state.json"
# the fleet's release lock (inventory/sim.py points SPARKFLEET_LOCK here): its pins live and die with the fleet
LOCK_FILE = FLEET_DIR / "sparkfleet.lock"
PREFIX = f"sparkfleet-{FLEET}" if FLEET else "sparkfleet"  # container, volume and network names start with it
# every container/volume/network of the fleet carries it (a named fleet's own key: no other fleet's `down` or
# `up` counts its containers as theirs)
LABEL = f"sparkfleet.sim.fleet.{FLEET}" if FLEET else "sparkfleet.sim"


def log(msg: str) -> None:
    if VERBOSE:
        print(f"[sim] {msg}", file=sys.stderr, flush=True)


def run(cmd: list[str], *, check: bool = True, input: bytes | str | None = None,
        capture: bool = True, timeout: float | None = None, env: dict | None = None,
        cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
    """Run a command; return CompletedProcess with text stdout/stderr."""
    if isinstance(input, str):
        input = input.encode()
    proc = subprocess.run(
        cmd, input=input, stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.PIPE if capture else None, timeout=timeout, env=env, cwd=cwd,
    )
    out = proc.stdout.decode(errors="replace") if proc.stdout is not None else ""
    err = proc.stderr.decode(errors="replace") if proc.stderr is not None else ""
    cp = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    if check and proc.returncode != 0:
        raise SimError(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{err.strip()[-3000:]}")
    return cp


def docker(*args: str, **kw) -> subprocess.CompletedProcess:
    return run(["docker", *args], **kw)


def sha256_bytes(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        if isinstance(p, str):
            p = p.encode()
        h.update(len(p).to_bytes(8, "big"))
        h.update(p)
    return h.hexdigest()


def hash_paths(paths: list[Path], base: Path) -> str:
    """Hash names + contents + exec bits of files (directories walked, sorted)."""
    items: list[bytes] = []
    for p in paths:
        files = sorted(x for x in p.rglob("*") if x.is_file()) if p.is_dir() else [p]
        for f in files:
            if "__pycache__" in f.parts or f.suffix == ".pyc":
                continue
            rel = os.path.relpath(f, base)
            mode = "x" if os.access(f, os.X_OK) else "-"
            items += [rel.encode(), mode.encode(), f.read_bytes()]
    return sha256_bytes(*items)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def wait_for(pred, timeout: float, interval: float = 0.5, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = pred()
            if last:
                return last
        except Exception as e:  # noqa: BLE001 - keep polling
            last = e
        time.sleep(interval)
    raise SimError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def read_json(path: Path, default=None):
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return default


def write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)
