"""The host's runtime bundle: the official hub clients and openai, built on the controller.

Hosts get no package index (offices may have none): the controller installs
the pinned clients for the host's CPU and Python into a folder with
`pip install --target`, packs it once per (arch, python) and ships it over SSH.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
from importlib import metadata
from pathlib import Path

from sparkfleet.model.hubs import cache_dir

BUNDLED = ("huggingface-hub", "modelscope", "modelscope-hub", "openai")


def bundle_requirements() -> list[str]:
    """The bundle's pins: the versions installed here, so hosts run the clients the controller planned with.

    In a checkout those are requirements.txt's (scripts/venv.sh installs exactly them); installed
    with `pip install sparkfleet`, whatever pip resolved. One rule either way, no file to find.
    """
    return [f"{name}=={metadata.version(name)}" for name in BUNDLED]


def _platforms(arch: str) -> list[str]:
    return [f"manylinux_2_{n}_{arch}" for n in (17, 24, 27, 28, 31, 34, 35)] + [f"manylinux2014_{arch}"]


def _reset_tarinfo(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "root", "root"
    return info


_building = threading.Lock()  # pyinfra plans hosts concurrently: build each bundle once


def build_bundle(arch: str, python: str) -> Path:
    """A .tar.gz of the clients for `arch` (uname -m) and `python` ("3.12"); cached."""
    reqs = bundle_requirements()
    key = hashlib.sha256(f"{arch} {python} {' '.join(reqs)}".encode()).hexdigest()[:12]
    out = cache_dir() / "runtime" / f"runtime-{arch}-py{python}-{key}.tar.gz"
    with _building:
        if not out.exists():
            _build(out, reqs, arch, python)
    return out


def _build(out: Path, reqs: list[str], arch: str, python: str) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=out.parent, prefix=".build-"))
    platform_args = [a for p in _platforms(arch) for a in ("--platform", p)]
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
         "--target", str(work), "--only-binary=:all:", "--implementation", "cp",
         "--python-version", python, *platform_args, *reqs],
        check=True,
    )
    partial = work.with_suffix(".tar.gz")
    with tarfile.open(partial, "w:gz") as tar:
        for path in sorted(work.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(work)), recursive=False, filter=_reset_tarinfo)
    os.replace(partial, out)
    shutil.rmtree(work)
