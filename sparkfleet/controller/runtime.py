"""The host's runtime bundle: the official hub clients and openai, built on the controller from a hash lock.

Hosts get no package index (offices may have none): the controller installs
the locked packages for the host's CPU and Python into a folder with
`pip install --target --require-hashes`, packs it once per (arch, python) and
ships it over SSH with the tarball's sha256, which the host checks before it
unpacks anything (the helpers run as root).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from sparkfleet.model.hubs import cache_dir

BUNDLED = ("huggingface-hub", "modelscope", "modelscope-hub", "openai")
LOCK_FILE = Path(__file__).with_name("runtime.lock")  # tools/lock_runtime.py writes it
# The hosts' (uname -m, python3): DGX OS (Ubuntu 24.04) is aarch64/3.12; the simulated fleet x86_64/3.11.
TARGETS = tuple((arch, python) for arch in ("aarch64", "x86_64") for python in ("3.10", "3.11", "3.12"))


def lock_pins(text: str) -> dict[str, str]:
    """The lock's `name==version` pins."""
    return {m[1].lower(): m[2] for m in re.finditer(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", text, re.M)}


def target_lock(text: str, arch: str, python: str) -> str:
    """The lock's blocks whose marker holds on the host's target (pip would judge markers by this machine)."""
    from packaging.markers import Marker

    env = {"platform_machine": arch, "python_version": python, "python_full_version": f"{python}.0",
           "implementation_name": "cpython", "platform_python_implementation": "CPython", "sys_platform": "linux",
           "os_name": "posix", "platform_system": "Linux"}
    kept = []
    for block in re.split(r"\n(?=\S)", "\n".join(line for line in text.splitlines() if not line.startswith("#"))):
        pin, _, where = block.split("\\", 1)[0].partition(";")
        if block.strip() and (not where.strip() or Marker(where).evaluate(env)):
            kept.append(pin.strip() + " \\" + block.split("\\", 1)[1])  # markers judged here, not by pip
    return "\n".join(kept) + "\n"


def _platforms(arch: str) -> list[str]:
    return [f"manylinux_2_{n}_{arch}" for n in (17, 24, 27, 28, 31, 34, 35)] + [f"manylinux2014_{arch}"]


def pip_target_args(arch: str, python: str) -> list[str]:
    """pip's options for wheels that run on the host, not here."""
    return ["--only-binary=:all:", "--implementation", "cp", "--python-version", python,
            *[a for p in _platforms(arch) for a in ("--platform", p)]]


def _reset_tarinfo(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "root", "root"
    return info


@dataclass(frozen=True)
class Bundle:
    path: Path
    sha256: str  # of the tarball as built: the host refuses an upload with other bytes


_building = threading.Lock()  # pyinfra plans hosts concurrently: build each bundle once


def build_bundle(arch: str, python: str) -> Bundle:
    """A .tar.gz of the locked packages for `arch` (uname -m) and `python` ("3.12"); cached, with its sha256
    recorded beside it when built (a cached tarball changed since is refused on the host)."""
    lock = LOCK_FILE.read_bytes()
    key = hashlib.sha256(f"{arch} {python} ".encode() + lock).hexdigest()[:12]
    out = cache_dir() / "runtime" / f"runtime-{arch}-py{python}-{key}.tar.gz"
    recorded = out.with_name(out.name + ".sha256")
    out.parent.mkdir(parents=True, exist_ok=True)
    # two converges on one controller (two fleets, a rollout beside a plan) share the cache: one builds, the
    # other waits and takes its tarball (two builds would replace each other's bytes under a recorded hash)
    with _building, open(out.parent / ".build.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if not (out.exists() and recorded.exists()):
            _build(out, arch, python)
            recorded.write_text(hashlib.sha256(out.read_bytes()).hexdigest() + "\n")
    return Bundle(out, recorded.read_text().strip())


def _build(out: Path, arch: str, python: str) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=out.parent, prefix=".build-"))
    lock = work.with_suffix(".lock")
    lock.write_text(target_lock(LOCK_FILE.read_text(), arch, python))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
         "--target", str(work), "--require-hashes", *pip_target_args(arch, python),
         "-r", str(lock)],
        check=True,
    )
    lock.unlink()
    partial = work.with_suffix(".tar.gz")
    with tarfile.open(partial, "w:gz") as tar:
        for path in sorted(work.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(work)), recursive=False, filter=_reset_tarinfo)
    os.replace(partial, out)
    shutil.rmtree(work)
