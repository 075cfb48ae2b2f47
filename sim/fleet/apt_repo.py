"""The sim's signed apt repository of stand-in NVIDIA Container Toolkit packages.

Laid out like NVIDIA's flat repository:
    .sim/apt/repo/gpgkey                       ASCII-armored public key
    .sim/apt/repo/stable/deb/amd64/            *.deb, Packages(.gz), Release,
                                               InRelease, Release.gpg
Hosts use:  deb [signed-by=KEYRING] http://sparkfleet-apt:8081/stable/deb/amd64 /
Beside it, .sim/apt/repo/dgx/ stands in for DGX OS's own repository: the driver package (sim/fleet/driver.py).

The key (no passphrase) lives in .sim/apt/gnupg and is made once; the repo is
rebuilt only when its inputs (stand-in files, versions, key) change.
"""
from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import tempfile
import time
from email.utils import formatdate
from pathlib import Path

from . import driver
from ._util import IMAGES_DIR, SIM_DIR, hash_paths, log, read_json, run, sha256_bytes, write_json

APT_DIR = SIM_DIR / "apt"
GNUPG_HOME = APT_DIR / "gnupg"
REPO_DIR = APT_DIR / "repo"
STAMP = APT_DIR / "stamp.json"
DGX_STAMP = APT_DIR / "dgx-stamp.json"
TOOLKIT_DIR = IMAGES_DIR / "toolkit"

VERSIONS = ["1.17.8-1", "1.18.1-1"]
ARCH = "amd64"
KEY_UID = "sparkfleet simulated NVIDIA apt repository <apt@sparkfleet-sim.invalid>"
MAINTAINER = "sparkfleet sim <apt@sparkfleet-sim.invalid>"

# package -> (depends template, {path in package: (source file in sim/images/toolkit, mode)}, description)
PACKAGES = {
    "libnvidia-container1": (
        "", {"usr/share/libnvidia-container1/STANDIN": ("STANDIN", 0o644)},
        "NVIDIA container runtime library (sparkfleet sim stand-in)"),
    "libnvidia-container-tools": (
        "libnvidia-container1 (= {v})",
        {"usr/bin/nvidia-container-cli": ("nvidia-container-cli", 0o755)},
        "NVIDIA container runtime library (command-line tools; sparkfleet sim stand-in)"),
    "nvidia-container-toolkit-base": (
        "",
        {"usr/bin/nvidia-ctk": ("nvidia-ctk", 0o755),
         "usr/bin/nvidia-container-runtime": ("nvidia-container-runtime", 0o755),
         "etc/nvidia-container-runtime/config.toml": ("config.toml", 0o644)},
        "NVIDIA Container Toolkit Base (sparkfleet sim stand-in)"),
    "nvidia-container-toolkit": (
        "nvidia-container-toolkit-base (= {v}), libnvidia-container-tools (= {v})",
        {"usr/bin/nvidia-container-runtime-hook": ("nvidia-container-runtime-hook", 0o755)},
        "NVIDIA Container toolkit (sparkfleet sim stand-in)"),
}


def _gpg(*args: str, **kw):
    return run(["gpg", "--batch", "--no-tty", "--homedir", str(GNUPG_HOME), *args], **kw)


def ensure_key() -> str:
    """Make the signing key once; return its fingerprint."""
    GNUPG_HOME.mkdir(parents=True, exist_ok=True)
    os.chmod(GNUPG_HOME, 0o700)
    fpr = _fingerprint()
    if fpr:
        return fpr
    log("generating the apt signing key")
    _gpg("--pinentry-mode", "loopback", "--passphrase", "",
         "--quick-gen-key", KEY_UID, "rsa3072", "sign", "never")
    fpr = _fingerprint()
    if not fpr:
        raise RuntimeError("gpg made no key")
    return fpr


def _fingerprint() -> str | None:
    cp = _gpg("--with-colons", "--list-secret-keys", check=False)
    for line in cp.stdout.splitlines():
        if line.startswith("fpr:"):
            return line.split(":")[9]
    return None


def _inputs_hash(fpr: str) -> str:
    return sha256_bytes(hash_paths([TOOLKIT_DIR], IMAGES_DIR), fpr, repr(VERSIONS), ARCH,
                        repr(sorted((k, v[0], sorted(v[1].items()), v[2]) for k, v in PACKAGES.items())))


def ensure_repo() -> dict:
    """Build the repo when its inputs changed; return {fingerprint, hash, dir}."""
    fpr = ensure_key()
    h = _inputs_hash(fpr)
    stamp = read_json(STAMP, {})
    if stamp.get("hash") == h and (REPO_DIR / "stable/deb" / ARCH / "InRelease").exists():
        ensure_dgx(fpr)
        return {"fingerprint": fpr, "hash": h, "dir": str(REPO_DIR)}
    t0 = time.monotonic()
    log("building the signed apt repository")
    tmp = Path(tempfile.mkdtemp(prefix="repo-", dir=APT_DIR))
    try:
        flat = tmp / "stable" / "deb" / ARCH
        flat.mkdir(parents=True)
        for v in VERSIONS:
            for name in PACKAGES:
                _build_deb(name, v, flat)
        _index_and_sign(flat)
        _gpg("--armor", "--output", str(tmp / "gpgkey"), "--export", fpr)
        old = APT_DIR / "repo.old"
        shutil.rmtree(old, ignore_errors=True)
        if REPO_DIR.exists():
            REPO_DIR.rename(old)
        tmp.rename(REPO_DIR)
        shutil.rmtree(old, ignore_errors=True)
        for p in [REPO_DIR, *REPO_DIR.rglob("*")]:
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    write_json(STAMP, {"hash": h, "fingerprint": fpr})
    ensure_dgx(fpr)
    log(f"apt repository built in {time.monotonic() - t0:.1f}s")
    return {"fingerprint": fpr, "hash": h, "dir": str(REPO_DIR)}


def _build_deb(name: str, version: str, out_dir: Path) -> None:
    depends, files, desc = PACKAGES[name]
    upstream = version.split("-")[0]
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "pkg"
        (root / "DEBIAN").mkdir(parents=True)
        conffiles = []
        for dest, (src, mode) in files.items():
            target = root / dest
            target.parent.mkdir(parents=True, exist_ok=True)
            srcp = TOOLKIT_DIR / src
            text = srcp.read_text() if srcp.exists() else f"{name} {version}: sparkfleet sim stand-in\n"
            target.write_text(text.replace("@VERSION@", upstream))
            os.chmod(target, mode)
            if dest.startswith("etc/"):
                conffiles.append("/" + dest)
        control = [f"Package: {name}", f"Version: {version}", f"Architecture: {ARCH}",
                   f"Maintainer: {MAINTAINER}", "Section: utils", "Priority: optional"]
        if depends:
            control.append(f"Depends: {depends.format(v=version)}")
        control.append(f"Description: {desc}\n Stand-in package built by the sparkfleet simulated fleet;"
                       "\n it has the real package's name, version and dependencies.")
        (root / "DEBIAN" / "control").write_text("\n".join(control) + "\n")
        if conffiles:
            (root / "DEBIAN" / "conffiles").write_text("\n".join(conffiles) + "\n")
        out = out_dir / f"{name}_{version}_{ARCH}.deb"
        run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(out)])


def ensure_dgx(fpr: str) -> Path:
    """The DGX OS stand-in beside the toolkit's repository, with the original driver: built in place when its inputs
    changed (a rebuild of the whole repository would move the directory the running services containers serve)."""
    dgx = REPO_DIR / driver.DGX_DIR
    h = sha256_bytes(hash_paths([driver.DRIVER_SRC], IMAGES_DIR), fpr, driver.DRIVER_VERSION, DGX_LABEL)
    if read_json(DGX_STAMP, {}).get("hash") == h and (dgx / "InRelease").exists():
        return dgx
    log("building the DGX OS stand-in repository (the driver package)")
    tmp = Path(tempfile.mkdtemp(prefix="dgx-", dir=REPO_DIR))
    driver.build_deb(driver.DRIVER_VERSION, tmp, ARCH, MAINTAINER)
    _index_and_sign(tmp, DGX_LABEL)
    for p in [tmp, *tmp.iterdir()]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    shutil.rmtree(dgx, ignore_errors=True)
    tmp.rename(dgx)
    write_json(DGX_STAMP, {"hash": h})
    return dgx


def publish_driver(version: str) -> list[str]:
    """Add a driver version to the DGX OS stand-in repository (as DGX OS publishing an update); the versions it
    holds. The repository is shared by every named fleet; `unpublish_drivers` takes the added ones out."""
    version = driver.full_version(version)
    dgx = ensure_dgx(ensure_repo()["fingerprint"])
    if version not in driver.versions(dgx):
        driver.build_deb(version, dgx, ARCH, MAINTAINER)
        os.chmod(dgx / f"{driver.DRIVER_PACKAGE}_{version}_{ARCH}.deb", 0o644)
    _index_and_sign(dgx, DGX_LABEL)  # again too: an index an interrupted publish left behind is made whole
    return driver.versions(dgx)


def unpublish_drivers() -> list[str]:
    """The DGX OS stand-in repository back to the original driver only; the versions it holds."""
    dgx = ensure_dgx(ensure_repo()["fingerprint"])
    extra = [v for v in driver.versions(dgx) if v != driver.DRIVER_VERSION]
    for v in extra:
        (dgx / f"{driver.DRIVER_PACKAGE}_{v}_{ARCH}.deb").unlink()
    if extra:
        _index_and_sign(dgx, DGX_LABEL)
    return driver.versions(dgx)


DGX_LABEL = "sparkfleet-sim DGX OS stand-in (NVIDIA driver)"


def _index_and_sign(flat: Path, label: str = "sparkfleet-sim NVIDIA Container Toolkit stand-ins") -> None:
    cp = run(["dpkg-scanpackages", "--multiversion", ".", "/dev/null"], cwd=flat)
    packages = cp.stdout.encode()
    (flat / "Packages").write_bytes(packages)
    (flat / "Packages.gz").write_bytes(gzip.compress(packages, mtime=0))
    lines = ["Origin: sparkfleet-sim", f"Label: {label}",
             f"Architectures: {ARCH}", f"Date: {formatdate(usegmt=True)}"]
    for field, algo in (("MD5Sum", hashlib.md5), ("SHA1", hashlib.sha1), ("SHA256", hashlib.sha256)):
        lines.append(f"{field}:")
        for fn in ("Packages", "Packages.gz"):
            data = (flat / fn).read_bytes()
            lines.append(f" {algo(data).hexdigest()} {len(data):>8} {fn}")
    (flat / "Release").write_text("\n".join(lines) + "\n")
    _gpg("--yes", "--pinentry-mode", "loopback", "--passphrase", "", "--digest-algo", "SHA512",
         "--clearsign", "--output", str(flat / "InRelease"), str(flat / "Release"))
    _gpg("--yes", "--pinentry-mode", "loopback", "--passphrase", "", "--digest-algo", "SHA512",
         "--armor", "--detach-sign", "--output", str(flat / "Release.gpg"), str(flat / "Release"))
