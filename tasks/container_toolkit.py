"""Stage 2: the NVIDIA Container Toolkit from its signed apt repository, wired into Docker."""

from pyinfra.api import deploy
from pyinfra.operations import apt, server, systemd

from sparkfleet.host import paths
from sparkfleet.host.operations import apt_keyring, docker_nvidia_runtime
from sparkfleet.release.plan import HostPlan

DEB_ARCH = {"aarch64": "arm64", "x86_64": "amd64"}


@deploy("NVIDIA Container Toolkit")
def container_toolkit(plan: HostPlan, arch: str):
    s = plan.settings
    apt_keyring(
        name="Toolkit signing key (fingerprint checked)",
        src=s.toolkit_key_url, dest=paths.TOOLKIT_KEYRING, fingerprint=s.toolkit_key_fingerprint,
    )
    repo_url = s.toolkit_repo_url.format(arch=DEB_ARCH.get(arch, arch))
    source = apt.repo(
        name="Toolkit apt source",
        src=f"deb [signed-by={paths.TOOLKIT_KEYRING}] {repo_url} /",
        filename="nvidia-container-toolkit",
    )
    server.shell(
        name="Refresh apt lists of the toolkit source only",
        commands=[f"apt-get update -o Dir::Etc::sourcelist={paths.TOOLKIT_SOURCE} "
                  "-o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0"],
        _if=source.did_change,
    )
    apt.packages(
        name=f"Toolkit packages at {s.toolkit_version}",
        packages=[f"{package}={s.toolkit_version}" for package in paths.TOOLKIT_PACKAGES],
        extra_install_args="--allow-downgrades",
    )
    runtime = docker_nvidia_runtime(name="Docker knows the nvidia runtime")
    systemd.service(
        name="Docker restarted only if daemon.json changed",
        service="docker.service", running=True, enabled=True, restarted=runtime.will_change,
    )
