"""debootstrap root file systems, cached as tarballs under .sim/rootfs/.

The tarball is keyed by (suite, variant, package list): a changed list makes a
new tarball; an unchanged one is reused (debootstrap is the slow step, ~90 s).
No mirror is given: debootstrap uses its default and writes it to the
rootfs's apt sources, which stay as debootstrap wrote them.

Python packages for an image (Ray in the engine image) come from the package
index through pip on the controller, installed for the rootfs's interpreter
(`--target`, `--platform`, `--python-version`: wheels only), cached as a
tarball that lays them under /usr/local like a pip inside the image would.
"""
from __future__ import annotations

import fcntl
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

from ._util import SIM_DIR, log, run, sha256_bytes

SUITE = "bookworm"  # every image's suite unless it names another

# The simulated Spark's OS: systemd, sshd, python for pyinfra, a Docker engine.
BASE_PACKAGES = [
    "systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "python3-venv",
    "ca-certificates", "curl", "gnupg", "iproute2", "procps", "kmod", "iptables",
    "docker.io", "containerd", "runc", "tini", "netbase", "xz-utils", "less",
    "iputils-ping",  # a Spark (DGX OS) has ping: preflight checks the fabric peers with it
    "haproxy", "socat",  # the guard and the front door: the deploy ensures them, a converge need not wait on apt
    "keepalived",  # two or more front doors' floating address (Debian's unit needs a config it has not: it stays off)
    "prometheus-node-exporter", "prometheus",  # node metrics on every Spark, Prometheus on a monitoring host: the same
    "restic",  # backups of a data host's source (the chat UI's, a door's usage): the deploy ensures it, as HAProxy
]
# A service host (front door, monitoring; sim/images/service-host): a plain Debian box, no Docker, no GPU stand-ins.
SERVICE_HOST_PACKAGES = [
    "systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "ca-certificates", "curl", "iproute2",
    "procps", "netbase", "less", "haproxy", "socat", "keepalived", "prometheus", "restic",
]
# The services container: hub (python3), static apt server (python3), registry.
SERVICES_PACKAGES = ["python3", "docker-registry", "ca-certificates", "netbase"]
# The stand-in vLLM image: python3 (kept small: every host pulls it) + Ray core from pip.
ENGINE_PACKAGES = ["python3"]
RAY_VERSION = "2.60.0"  # vLLM's multi-node executor (--distributed-executor-backend ray)
ENGINE_PIP = [f"ray=={RAY_VERSION}"]  # core only: no [default] (dashboard, metrics agents)
PYTHON_VERSION = "3.11"  # bookworm's python3: the wheels must match it, not the controller's
# Parts of Ray no simulated member runs (Java workers, the libraries, the dashboard's web UI): ~70 MB.
PIP_TRIM = ["bin", "ray/jars", "ray/rllib", "ray/tune", "ray/train", "ray/serve", "ray/data", "ray/llm",
            "ray/dashboard/client"]
# Console scripts, written for the image's interpreter (pip's would name the controller's).
PIP_SCRIPTS = {"ray": "ray.scripts.scripts"}
SITE_DIR = f"usr/local/lib/python{PYTHON_VERSION}/dist-packages"  # on Debian python3's sys.path


# The real llama.cpp engine: only Debian sid packages it (llama.cpp-tools, libggml0 with its CPU backends), and
# they need sid's glibc, so that image is a sid rootfs. curl: a container health check can ask /health. python3:
# the sim's stand-in nvidia-smi (a Python script the stand-in runtime hook puts in every GPU container) runs in it.
LLAMACPP_SUITE = "sid"
LLAMACPP_PACKAGES = ["llama.cpp-tools", "libggml0", "ca-certificates", "curl", "python3"]
LLAMACPP_DROP = ["usr/share/locale"]  # a fifth of that rootfs, and llama-server prints English only


def rootfs_key(packages: list[str], variant: str = "minbase", suite: str = SUITE, drop: list[str] = ()) -> str:
    return sha256_bytes(suite, variant, ",".join(sorted(packages)), *(["drop", *drop] if drop else []))[:16]


def pip_key(requirements: list[str]) -> str:
    return sha256_bytes("pip-v1", PYTHON_VERSION, platform.machine(), ",".join(sorted(requirements)),
                        ",".join(PIP_TRIM), repr(sorted(PIP_SCRIPTS.items())))[:16]


def pip_tarball(name: str, requirements: list[str]) -> Path:
    """Return the path of a cached tarball of pip-installed packages (usr/local/...), building it when missing."""
    def build(work: Path) -> tuple[Path, str]:
        site = work / SITE_DIR
        arch = platform.machine()
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
               "--only-binary=:all:", "--implementation", "cp", "--python-version", PYTHON_VERSION,
               "--platform", f"manylinux2014_{arch}", "--platform", f"manylinux_2_28_{arch}",
               "--platform", f"manylinux_2_17_{arch}", "--target", str(site), *requirements]
        cp = run(cmd, check=False)
        if cp.returncode != 0:
            raise RuntimeError(f"pip install {' '.join(requirements)} for the {name} image failed:\n"
                               f"{cp.stderr[-3000:]}")
        for rel in PIP_TRIM:
            shutil.rmtree(site / rel, ignore_errors=True)
        bindir = work / "usr" / "local" / "bin"
        bindir.mkdir(parents=True)
        for script, module in PIP_SCRIPTS.items():
            path = bindir / script
            path.write_text(f"#!/usr/bin/python3\nimport sys\nfrom {module} import main\nsys.exit(main())\n")
            path.chmod(0o755)
        return work, "usr"

    return _cached_tarball(f"pip-{name}", pip_key(requirements), build,
                           f"pip {' '.join(requirements)} for python {PYTHON_VERSION} ({name}; ~10-30 s)")


def rootfs_tarball(name: str, packages: list[str], variant: str = "minbase", suite: str = SUITE,
                   drop: list[str] = ()) -> Path:
    """Return the path of a cached rootfs tarball, building it when missing (without the `drop` directories)."""
    def build(work: Path) -> tuple[Path, str]:
        root = work / "root"
        cache = SIM_DIR / "rootfs" / f"debs-{name}"  # .debs kept for later rebuilds (one dir per name: parallel runs)
        cache.mkdir(exist_ok=True)
        cmd = ["debootstrap", f"--variant={variant}", f"--include={','.join(packages)}",
               f"--cache-dir={cache}", suite, str(root)]
        cp = run(cmd, check=False)
        if cp.returncode != 0:
            logf = root / "debootstrap" / "debootstrap.log"
            tail = logf.read_text()[-3000:] if logf.exists() else cp.stderr[-3000:]
            raise RuntimeError(f"debootstrap {name} failed:\n{tail}")
        _trim(root)
        for rel in drop:
            shutil.rmtree(root / rel, ignore_errors=True)
        return root, "."

    return _cached_tarball(name, rootfs_key(packages, variant, suite, drop), build,
                           f"debootstrap {name} ({suite}, {len(packages)} packages; slow, ~1-2 min)")


def _cached_tarball(name: str, key: str, build, what: str) -> Path:
    """.sim/rootfs/NAME-KEY.tar, made when missing: build(work dir) -> (directory, what in it to tar);
    the tarballs of NAME's older keys are removed."""
    out_dir = SIM_DIR / "rootfs"
    out = out_dir / f"{name}-{key}.tar"
    if out.exists():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / f"{name}.lock", "w") as lock:  # one builder of NAME at a time, across processes: the
        fcntl.flock(lock, fcntl.LOCK_EX)                # chat UI's background build and `up` both need "engine"
        return out if out.exists() else _build_tarball(name, out, build, what)


def _build_tarball(name: str, out: Path, build, what: str) -> Path:
    out_dir = out.parent
    t0 = time.monotonic()
    log(what)
    work = Path(tempfile.mkdtemp(prefix=f"build-{name}-", dir=out_dir))
    try:
        top, members = build(work)
        tmp = out.with_suffix(".tar.tmp")
        run(["tar", "--numeric-owner", "--xattrs", "-C", str(top), "-cf", str(tmp), members])
        os.replace(tmp, out)
        for old in out_dir.glob(f"{name}-*.tar"):
            if old != out and len(old.name) == len(out.name):  # NAME-KEY.tar, not another name's (pip-NAME-...)
                old.unlink()
    finally:
        _umount_under(work)
        shutil.rmtree(work, ignore_errors=True)
    log(f"{name} done in {time.monotonic() - t0:.0f}s -> {out.name}")
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
