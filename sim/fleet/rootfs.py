"""debootstrap root file systems, cached as tarballs under .sim/rootfs/.

The tarball is keyed by (suite, variant, package list): a changed list makes a
new tarball; an unchanged one is reused (debootstrap is the slow step, ~90 s).
No mirror is given: debootstrap uses its default and writes it to the
rootfs's apt sources, which stay as debootstrap wrote them.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from ._util import SIM_DIR, log, run, sha256_bytes

SUITE = "bookworm"

# The simulated Spark's OS: systemd, sshd, python for pyinfra, a Docker engine.
BASE_PACKAGES = [
    "systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "python3-venv",
    "ca-certificates", "curl", "gnupg", "iproute2", "procps", "kmod", "iptables",
    "docker.io", "containerd", "runc", "tini", "netbase", "xz-utils", "less",
]
# The services container: hub (python3), static apt server (python3), registry.
SERVICES_PACKAGES = ["python3", "docker-registry", "ca-certificates", "netbase"]
# The stand-in vLLM image: python3 only (kept small: nested vfs copies layers).
ENGINE_PACKAGES = ["python3"]


def rootfs_key(packages: list[str], variant: str = "minbase") -> str:
    return sha256_bytes(SUITE, variant, ",".join(sorted(packages)))[:16]


def rootfs_tarball(name: str, packages: list[str], variant: str = "minbase") -> Path:
    """Return the path of a cached rootfs tarball, building it when missing."""
    key = rootfs_key(packages, variant)
    out_dir = SIM_DIR / "rootfs"
    out = out_dir / f"{name}-{key}.tar"
    if out.exists():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    log(f"debootstrap {name} ({len(packages)} packages; slow, ~1-2 min)")
    work = Path(tempfile.mkdtemp(prefix=f"rootfs-{name}-", dir=out_dir))
    try:
        root = work / "root"
        cache = out_dir / f"debs-{name}"  # .debs kept for later rebuilds (one dir per name: parallel runs)
        cache.mkdir(exist_ok=True)
        cmd = ["debootstrap", f"--variant={variant}", f"--include={','.join(packages)}",
               f"--cache-dir={cache}", SUITE, str(root)]
        cp = run(cmd, check=False)
        if cp.returncode != 0:
            logf = root / "debootstrap" / "debootstrap.log"
            tail = logf.read_text()[-3000:] if logf.exists() else cp.stderr[-3000:]
            raise RuntimeError(f"debootstrap {name} failed:\n{tail}")
        _trim(root)
        tmp = out.with_suffix(".tar.tmp")
        run(["tar", "--numeric-owner", "--xattrs", "-C", str(root), "-cf", str(tmp), "."])
        os.replace(tmp, out)
        # drop tarballs of older package lists for the same name
        for old in out_dir.glob(f"{name}-*.tar"):
            if old != out:
                old.unlink()
    finally:
        _umount_under(work)
        shutil.rmtree(work, ignore_errors=True)
    log(f"debootstrap {name} done in {time.monotonic() - t0:.0f}s -> {out.name}")
    return out


def _umount_under(path: Path) -> None:
    """Unmount whatever debootstrap left mounted (proc, sys...) below path,
    deepest first, so that removing the tree never reaches the host's files."""
    prefix = str(path.resolve()) + "/"
    with open("/proc/mounts") as f:
        points = [line.split()[1] for line in f]
    for mp in sorted((m for m in points if m.startswith(prefix)), key=len, reverse=True):
        run(["umount", "-l", mp], check=False)


def _trim(root: Path) -> None:
    """Remove what an image never needs (apt caches, docs) to keep it small."""
    for rel in ["var/cache/apt/archives", "var/lib/apt/lists"]:
        d = root / rel
        if d.is_dir():
            for f in d.iterdir():
                if f.is_file() and f.name != "lock":
                    f.unlink()
    for rel in ["usr/share/doc", "usr/share/man", "usr/share/info"]:
        d = root / rel
        if d.is_dir():
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir()
