"""The stand-in NVIDIA driver package and the DGX OS apt repository it comes from, and the sim's in-host reboot.

DGX OS installs the GPU driver as a Debian package from its own repository; so does every simulated Spark: the sim
(not sparkfleet, which manages no DGX OS source) gives each host the source and installs DRIVER_PACKAGE at
DRIVER_VERSION when the fleet comes up. Like a real driver package, a newer one only takes effect at the next boot:
its postinst leaves the version pending and /var/run/reboot-required, and a boot unit it ships applies the pending
version to the GPU knobs nvidia-smi reads, before Docker starts.

The repository is a flat one beside the toolkit's (.sim/apt/repo/dgx/, served by the services container):
    deb [signed-by=DGX_KEYRING] http://sparkfleet-apt:8081/dgx /
`publish` adds a newer version to it (python -m sim publish-driver 580.95.99); `unpublish` and `reset_host` put the
repository and a host back to DRIVER_VERSION (no reboot cycle).

A simulated Spark is a container: it reads its host kernel's /proc/uptime, which its own reboot (`systemctl reboot`
exits PID 1 and `--restart unless-stopped` boots it again) does not reset. REBOOT_FILES keep this boot's uptime there,
so pyinfra's server.reboot, which waits for the uptime to drop, sees a reboot as it would on a Spark.
"""
from __future__ import annotations

import os
import shlex
import tempfile
from pathlib import Path

from ._util import IMAGES_DIR, SimError, run

DRIVER_PACKAGE = "nvidia-driver-580-open"  # DGX OS 7's driver package (the open kernel modules, driver branch 580)
DRIVER_VERSION = "580.95.05-1"  # what every simulated Spark runs, DEFAULT_GPU's driver
DGX_DIR = "dgx"  # under the apt repository's root
DGX_KEYRING = "/usr/share/keyrings/sparkfleet-sim-dgx.gpg"
DGX_SOURCE = "/etc/apt/sources.list.d/dgx.list"
PENDING = "/etc/sparkfleet-sim/driver.pending"
DRIVER_SRC = IMAGES_DIR / "driver"
REBOOT_SRC = IMAGES_DIR / "reboot"
# what the package installs: {path in package: (source file in sim/images/driver, mode)}
DRIVER_FILES = {"usr/lib/sparkfleet-sim/driver-load": ("driver-load", 0o755),
                "lib/systemd/system/sparkfleet-sim-driver.service": ("sparkfleet-sim-driver.service", 0o644)}
REBOOT_UNIT = "sparkfleet-sim-uptime.service"
REBOOT_FILES = {"/usr/local/sbin/sparkfleet-sim-uptime": ("sparkfleet-sim-uptime", "0755"),
                f"/etc/systemd/system/{REBOOT_UNIT}": (REBOOT_UNIT, "0644")}


def full_version(version: str) -> str:
    """A driver version as the package's: "580.95.99" -> "580.95.99-1" (one with a revision is kept)."""
    if not version or not all(part.isalnum() for part in version.replace("-", ".").replace("~", ".").split(".")):
        raise SimError(f"driver version {version!r}: give one like 580.95.99 (or 580.95.99-1)")
    return version if "-" in version else f"{version}-1"


def build_deb(version: str, out_dir: Path, arch: str, maintainer: str) -> Path:
    """DRIVER_PACKAGE at `version`: its boot unit, the script it runs and a postinst that leaves the version pending."""
    upstream = version.split("-")[0]
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "pkg"
        (root / "DEBIAN").mkdir(parents=True)
        for dest, (src, mode) in DRIVER_FILES.items():
            target = root / dest
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text((DRIVER_SRC / src).read_text())
            os.chmod(target, mode)
        postinst = root / "DEBIAN" / "postinst"
        postinst.write_text((DRIVER_SRC / "postinst").read_text().replace("@VERSION@", upstream)
                            .replace("@PACKAGE@", DRIVER_PACKAGE))
        os.chmod(postinst, 0o755)
        (root / "DEBIAN" / "control").write_text(
            f"Package: {DRIVER_PACKAGE}\nVersion: {version}\nArchitecture: {arch}\nMaintainer: {maintainer}\n"
            "Section: restricted/libs\nPriority: optional\n"
            "Description: NVIDIA driver metapackage (open kernel modules; sparkfleet sim stand-in)\n"
            " Stand-in package built by the sparkfleet simulated fleet: the new driver takes effect at the next boot.\n")
        out = out_dir / f"{DRIVER_PACKAGE}_{version}_{arch}.deb"
        run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(out)])
    return out


def versions(flat: Path) -> list[str]:
    """The driver versions the repository directory holds."""
    prefix = f"{DRIVER_PACKAGE}_"
    return sorted(p.name[len(prefix):].rsplit("_", 1)[0] for p in flat.glob(f"{prefix}*.deb"))


def host_script(apt_url: str, version: str = DRIVER_VERSION) -> str:
    """The shell that puts a simulated Spark on DRIVER_PACKAGE `version` as if it had booted with it: DGX OS's source
    (and no Debian mirror: the sim has none), the package installed (a downgrade too), its pending version applied
    and no reboot left to do. Does nothing where the host runs that version already."""
    q = shlex.quote
    source = f"deb [signed-by={DGX_KEYRING}] {apt_url}/{DGX_DIR} /"
    return (
        f"installed=$(dpkg-query -W -f='${{Version}}' {DRIVER_PACKAGE} 2>/dev/null || true); "
        f"if [ \"$installed\" = {q(version)} ] && [ ! -e {PENDING} ] && [ -e {DGX_SOURCE} ]; then exit 0; fi; "
        "set -e; "
        "echo '# the simulated Spark has no Debian mirror: DGX OS repository only (sources.list.d)' > /etc/apt/sources.list; "
        f"curl -fsSL {q(apt_url + '/gpgkey')} | gpg --dearmor --yes -o {DGX_KEYRING}; "
        f"echo {q(source)} > {DGX_SOURCE}; "
        f"apt-get update -q -o Dir::Etc::sourcelist={DGX_SOURCE} -o Dir::Etc::sourceparts=- "
        "-o APT::Get::List-Cleanup=0 >/dev/null; "
        f"DEBIAN_FRONTEND=noninteractive apt-get install -y -q --allow-downgrades {q(DRIVER_PACKAGE + '=' + version)} "
        ">/dev/null; "
        "/usr/lib/sparkfleet-sim/driver-load; rm -f /run/reboot-required /run/reboot-required.pkgs")


def reboot_files() -> dict[str, tuple[str, str]]:
    """{path on the host: (content, mode)} of the in-host reboot's uptime unit."""
    return {path: ((REBOOT_SRC / src).read_text(), mode) for path, (src, mode) in REBOOT_FILES.items()}
